"""compile(): option checking, the frontend for the source (torch, ONNX or JAX), then driver.py's
passes -> codegen -> build -> runtime through the compile cache, and verification against the
source model."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .version import __version__
from .build import cache, toolchain
from .driver import Progress, build_graph, optimize, wrap
from .accuracy import TOLERANCE, describe, failures, measure
from .errors import CuvilError, VerificationError
from .options import Options, make_options
from .runtime import artifact
from .target import resolve_target


def _source_key(model, example_inputs, opts: Options) -> str | None:
    """A key from the source model itself (its code, attributes, weights and the example inputs'
    structure), so a repeat compile skips export entirely; None when the model holds something the
    key cannot account for (frontend/torch_key.py)."""
    from .frontend.torch_key import source_key
    return source_key(model, example_inputs, f"{opts.key()}|{__version__}|{toolchain.compiler_version(resolve_target(opts.target))}|"
                                             f"{toolchain.cuvil_source_digest()}")


def _split_inputs(example_inputs):
    if isinstance(example_inputs, dict):
        return (), example_inputs
    if not isinstance(example_inputs, (tuple, list)):
        return (example_inputs,), {}
    return tuple(example_inputs), {}


def compile(model, example_inputs=(), *, target="native", precision="fp32", fusion_level=2,  # noqa: A001
            dynamic_shapes=None, verify=False, num_threads=None, cache_dir=None, verbose=False, profile=False,
            **unknown):
    """Compile a torch.nn.Module, an ONNX model or a JAX function into a native artifact. See DESIGN.md.
    A JAX function is traced at its example inputs (numpy / jax arrays); weights it closes over
    (functools.partial(apply_fn, params), or a lambda over params) become constants.
    verify=True compares with the source model on the example inputs at rtol=/atol= (1e-4 each for fp32;
    for bf16 / fp16 / int8 at the output's scale, defaults in accuracy.TOLERANCE). A lossy precision
    measures its error against the source on the example inputs and calibration_data= (an iterable of
    more inputs): cm.accuracy."""
    opts = make_options(**unknown, target=target, precision=precision, fusion_level=fusion_level,
                        dynamic_shapes=dynamic_shapes, verify=verify, num_threads=num_threads,
                        cache_dir=cache_dir, verbose=verbose, profile=profile)
    cdir = cache.usable_dir(cache_dir)
    progress = Progress(verbose)
    args, kwargs = _split_inputs(example_inputs)
    kind = _source_kind(model, example_inputs)
    if opts.constant_inputs and kind != "onnx":
        raise ValueError("option constant_inputs applies to ONNX models only (a torch model's shape-deciding "
                         "values are fixed by torch.export already)")
    if kind == "torch":
        skey = _source_key(model, (args, kwargs), opts)
        hit = cache.lookup_source(cdir, skey) if skey else None
        if hit:
            progress("cache hit", str(hit))
            cm = wrap(hit, opts, None, None, {"cache": "hit"})
        else:
            cm = _compile_torch(model, args, kwargs, opts, cdir, progress, skey)
    elif kind == "onnx":
        from .frontend import onnx as onnx_frontend
        graph = onnx_frontend.to_graph(model, opts.dynamic_shapes, constant_inputs=opts.constant_inputs,
                                       integer_kernels=opts.precision == "int8")
        progress("frontend", f"{len(graph.nodes)} IR nodes")
        cm = build_graph(graph, opts, cdir, progress,
                         extra_manifest={"source": "onnx", "output_names": list(graph.output_names),
                                         "output_sequences": {k: list(v) for k, v in graph.sequence_outputs.items()},
                                         "constant_inputs": _describe_constants(opts.constant_inputs)})
    elif kind == "jax":
        if kwargs or opts.dynamic_shapes:
            raise ValueError("a JAX function compiles at the shapes of its positional example inputs: pass them "
                             "as a tuple, without dynamic_shapes")
        from .frontend import jax as jax_frontend
        graph = jax_frontend.to_graph(model, args)
        progress("frontend", f"{len(graph.nodes)} IR nodes")
        cm = build_graph(graph, opts, cdir, progress, extra_manifest={"source": "jax"})
    else:
        raise CuvilError(f"cannot compile a {type(model).__name__}: pass a torch.nn.Module, an ONNX file path, "
                         "an onnx.ModelProto, ONNX bytes, or a JAX function with numpy / jax array example inputs")
    if opts.precision != "fp32":
        calibration = [_split_inputs(x) for x in opts.calibration_data or ()]
        if kind != "torch" and any(kw for _, kw in calibration):
            raise ValueError("option calibration_data: an ONNX model or a JAX function takes each input set as a "
                             "tuple of arrays in the order of its inputs, not a dict")
        _measure_accuracy(model, kind, cm, [(args, kwargs)] + calibration, opts, progress)
    if opts.verify:
        _verify(model, args, kwargs, cm, kind, opts)
    cm.report["compile_seconds"] = progress.total
    cm.report["stages"] = progress.stages
    return cm


def _describe_constants(values):
    """Manifest entry for compile-time-fixed inputs: dtype, shape and (small ones) the values."""
    import numpy as np
    out = {}
    for name, v in (values or {}).items():
        if v is None or isinstance(v, (list, tuple)):      # an optional left empty, a sequence
            out[name] = {"dtype": "optional", "shape": None, "values": None} if v is None else \
                {"dtype": "sequence", "shape": [len(v)], "values": None}
            continue
        a = np.asarray(v)
        out[name] = {"dtype": str(a.dtype), "shape": list(a.shape),
                     "values": a.ravel().tolist() if a.size <= 64 and a.dtype.kind in "biuf" else None}
    return out


def compile_model(model, example_inputs=(), *, enable_fusion=None, **options):
    """Alias of compile(); also takes the older spelling enable_fusion=True|False."""
    if enable_fusion is not None:
        if not isinstance(enable_fusion, bool):
            raise ValueError(f"option enable_fusion={enable_fusion!r} must be True or False")
        if "fusion_level" in options:
            raise ValueError("give either enable_fusion or fusion_level, not both")
        options["fusion_level"] = 2 if enable_fusion else 0
    return compile(model, example_inputs, **options)


def _source_kind(model, example_inputs=()):
    if isinstance(model, (str, Path)) and str(model).endswith(".onnx"):
        return "onnx"
    if isinstance(model, bytes):
        return "onnx"
    if type(model).__name__ == "ModelProto":
        return "onnx"
    if "torch" in sys.modules and isinstance(model, sys.modules["torch"].nn.Module):
        return "torch"
    if callable(model) and _jax_inputs(example_inputs):
        return "jax"
    return None


def _jax_inputs(example_inputs) -> bool:
    """Whether a plain callable with these example inputs is taken for a JAX function: jax is installed
    and every input is a numpy or jax array (checked without importing jax)."""
    import importlib.util

    def leaves(x):
        if isinstance(x, (tuple, list)):
            return [y for v in x for y in leaves(v)]
        return leaves(list(x.values())) if isinstance(x, dict) else [x]
    return importlib.util.find_spec("jax") is not None and all(
        isinstance(a, (np.ndarray, np.generic)) or type(a).__module__.startswith(("jax.", "jaxlib."))
        for a in leaves(example_inputs))


def _check_example_inputs(model, args, kwargs):
    """A torch model needs example inputs (their shapes and dtypes are what gets compiled): say so,
    not export's "missing a required argument"."""
    import inspect
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return
    required = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) + len(kwargs) < len(required):
        missing = required[len(args):]
        raise CuvilError(f"{type(model).__name__}.forward takes {', '.join(required)}: pass example inputs for "
                         f"{', '.join(missing)}, e.g. cuvil.compile(model, example_inputs=(torch.randn(1, 3, 224, 224),)). "
                         "Their shapes and dtypes are what gets compiled (dynamic_shapes= makes dims dynamic)")


def _compile_torch(model, args, kwargs, opts, cdir, progress, skey):
    from .frontend import torch as torch_frontend
    _check_example_inputs(model, args, kwargs)
    try:
        ep = torch_frontend.export(model, args, kwargs, opts.dynamic_shapes)
    except CuvilError as e:
        from .frontend import torch_rewrite
        if not torch_rewrite.is_data_dependent(e):
            raise
        progress("export", "data-dependent control flow: rewriting forward's if/while into torch.cond/while_loop")
        ep = torch_rewrite.export_rewritten(model, lambda m: torch_frontend.export(m, args, kwargs, opts.dynamic_shapes), e)
    progress("export", f"{len(ep.graph.nodes)} fx nodes")
    graph, out_spec, decomposed = torch_frontend.from_exported(ep, opts.dynamic_shapes)
    progress("frontend", f"{len(graph.nodes)} IR nodes"
             + (" (after core ATen decompositions)" if decomposed else " (from export's graph directly)"))
    from torch.utils import _pytree
    treespec = None
    try:
        treespec = _pytree.treespec_dumps(out_spec)
    except Exception:  # noqa: BLE001 - custom output types may not serialise; runtime then returns a tuple
        pass
    cm = build_graph(graph, opts, cdir, progress, extra_manifest={"treespec": treespec})
    cm._out_spec = out_spec
    if skey:
        cache.remember_source(cdir, skey, cm.report["cache_key"])
    return cm


def max_errors(expected, got):
    errs = {}
    for i, (e, g) in enumerate(zip(expected, got)):
        wide = np.complex128 if np.iscomplexobj(e) or np.iscomplexobj(g) else np.float64
        e, g = np.asarray(e, dtype=wide), np.asarray(g, dtype=wide)
        if e.shape != g.shape:
            errs[i] = (float("inf"), float("inf"))
            continue
        diff = np.abs(e - g)
        diff = np.where(np.isnan(e) & np.isnan(g), 0.0, diff)
        abs_err = float(diff.max()) if diff.size else 0.0
        rel = float((diff / np.maximum(np.abs(e), 1e-12)).max()) if diff.size else 0.0
        errs[i] = (abs_err, rel)
    return errs


def _reference(model, kind, args, kwargs, constant_inputs=None):
    """(the source model's outputs, the flat input arrays) for one set of inputs."""
    if kind == "torch":
        import torch
        from torch.utils import _pytree
        with torch.no_grad():
            ref = model(*args, **kwargs)
        from .frontend.torch_dtypes import to_numpy
        expected = [to_numpy(t) for t in _pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
        return expected, _pytree.tree_leaves((tuple(args), dict(kwargs)))
    if kind == "jax":
        from .frontend import jax as jax_frontend
        return jax_frontend.reference_outputs(model, args)
    from .frontend import onnx as onnx_frontend
    return onnx_frontend.reference_outputs(model, args, constant_inputs)


# a 16-bit float output of a model that computes in it (a bf16 checkpoint): two units in its last place,
# the most that computing a fused chain in float32 and rounding once can differ from rounding per op
STORAGE_TOLERANCE = {"bfloat16": 2.0 ** -6, "float16": 2.0 ** -9}


def _close(got, expected, rtol, atol, default_tolerance):
    expected = np.asarray(expected)
    floor = STORAGE_TOLERANCE.get(expected.dtype.name, 0.0) if default_tolerance else 0.0
    if floor:
        got, expected = np.asarray(got, np.float64), expected.astype(np.float64)
    return np.allclose(got, expected, rtol=max(rtol, floor), atol=max(atol, floor), equal_nan=True)


def _verify(model, args, kwargs, cm, kind, opts):
    """verify=True: fp32 elementwise (np.allclose); a lossy precision by its measured accuracy, at the
    output's scale (accuracy.py)."""
    rtol, atol = (t if t is not None else d for t, d in zip((opts.rtol, opts.atol), TOLERANCE[opts.precision]))
    if opts.precision != "fp32":
        if cm.report.get("accuracy") is None:      # not measured: running the artifact here says why
            cm.module.run(*_reference(model, kind, args, kwargs, opts.constant_inputs)[1])
            raise CuvilError("verify=True: the accuracy of this lossy compile could not be measured (see --verbose)")
        bad = failures(cm.report["accuracy"], rtol, atol)
        cm.report["verify"] = {i: (o["max_abs"], o["rel"]) for i, o in enumerate(cm.report["accuracy"]["outputs"])}
        if bad:
            raise VerificationError(bad, rtol, atol)
        return
    expected, flat = _reference(model, kind, args, kwargs, opts.constant_inputs)
    got = cm.run(*flat)
    errs = max_errors(expected, got)
    bad = {k: v for k, v in errs.items() if not _close(got[k], expected[k], rtol, atol, opts.rtol is None)}
    cm.report["verify"] = errs
    if bad:
        raise VerificationError(bad, rtol, atol)


def _measure_accuracy(model, kind, cm, inputs, opts, progress):
    """A lossy precision's error against the source model on every (args, kwargs) of `inputs`:
    cm.report["accuracy"], sealed into the artifact's manifest (cuvil inspect shows it)."""
    from .runtime.loader import BuiltForAnotherCPU
    if isinstance(cm.module, BuiltForAnotherCPU):
        progress("accuracy", "not measured: the artifact is for a CPU this machine is not (measure it where it runs)")
        return
    pairs = []
    for i, (args, kwargs) in enumerate(inputs):
        try:
            expected, flat = _reference(model, kind, args, kwargs, opts.constant_inputs)
        except Exception as e:  # noqa: BLE001 - the source framework raises anything; the artifact is fine
            progress("accuracy", f"not measured: the source model did not run ({type(e).__name__}: {str(e)[:300]})")
            return
        try:
            pairs.append((expected, cm.run(*flat)))
        except CuvilError as e:     # inputs[0] are the example inputs, the rest calibration_data
            if i:
                e.args = (f"calibration_data[{i - 1}]: {e}",)
            raise
    acc = measure(pairs)
    cm.report["accuracy"] = acc
    progress("accuracy", describe(acc, opts.precision))
    cm.module.manifest["accuracy"] = acc
    try:
        artifact.amend_manifest(cm.path, accuracy=acc)
    except OSError as e:        # a read-only cache: the report stays in cm.accuracy
        progress("accuracy", f"not written into the artifact's manifest ({e})")


STAGES = ("frontend", "passes", "memplan", "c")


def inspect_stages(model, example_inputs=(), stages=STAGES, **options) -> dict:
    """Text of the IR after each requested stage: frontend, passes, memplan, c."""
    opts = make_options(**options)
    args, kwargs = _split_inputs(example_inputs)
    kind = _source_kind(model, example_inputs)
    if kind == "torch":
        from .frontend import torch as torch_frontend
        graph = torch_frontend.from_exported(torch_frontend.export(model, args, kwargs, opts.dynamic_shapes),
                                             opts.dynamic_shapes)[0]
    elif kind == "onnx":
        from .frontend import onnx as onnx_frontend
        graph = onnx_frontend.to_graph(model, opts.dynamic_shapes, constant_inputs=opts.constant_inputs)
    elif kind == "jax":
        from .frontend import jax as jax_frontend
        graph = jax_frontend.to_graph(model, args)
    else:
        raise CuvilError(f"cannot inspect a {type(model).__name__}")
    out = {}
    if "frontend" in stages:
        out["frontend"] = str(graph)
    graph = optimize(graph, opts)
    if "passes" in stages:
        out["passes"] = str(graph)
    if "memplan" in stages or "c" in stages:
        from .codegen.c import C_BACKEND, emit
        from .passes.pipeline import plan_memory
        plan = plan_memory(graph, C_BACKEND)
        out["memplan"] = str(plan)
        if "c" in stages:
            c_src, weights = emit.generate(graph, plan, resolve_target(opts.target))
            weights.discard()
            out["c"] = c_src
    return {k: v for k, v in out.items() if k in stages}
