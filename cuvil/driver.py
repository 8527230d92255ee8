"""From an IR graph to a loaded artifact: passes, C code, the build and the cache, with the progress
output of each stage. Shared by api.py (torch and ONNX sources) and llm/ (Llama-family graphs);
neither of those imports the other."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .version import __version__
from .build import cache, toolchain
from .ir import dims as D
from .options import Options
from .runtime import artifact
from .runtime.loader import load
from .runtime.module import Module
from .target import AMX_FEATURES, has_features, native_cpu, required_features, resolve_target, target_arch, vector_floats


class Progress:
    """Stage timings; printed as they happen when verbose."""

    def __init__(self, verbose):
        self.verbose, self.t0, self.last, self.stages = verbose, time.perf_counter(), time.perf_counter(), []

    def __call__(self, stage, detail=""):
        now = time.perf_counter()
        self.stages.append((stage, now - self.last))
        if self.verbose:
            print(f"[cuvil] {stage:<10} {1000 * (now - self.last):8.1f} ms  {detail}", file=sys.stderr, flush=True)
        self.last = now

    @property
    def total(self):
        return time.perf_counter() - self.t0


class CompiledModel:
    """The result of compile(): call it like the source model."""

    def __init__(self, module: Module, graph=None, plan=None, report=None, in_spec=None, out_spec=None):
        self.module = module
        self.graph = graph
        self.plan = plan
        self.report = report or {}
        self._in_spec = in_spec
        self._out_spec = out_spec
        # run is the module's own bound method: a forwarding call cost 1.1 us a call (2.8 -> 3.9 us on
        # a tiny model, 2-3% of a 1024 x 1024 GEMV)
        self.run = module.run

    @property
    def accuracy(self) -> dict | None:
        """A lossy precision's measured error against the source model (accuracy.py), else None."""
        return self.report.get("accuracy")

    @property
    def path(self) -> Path:
        return self.module.path

    @property
    def c_source(self) -> str:
        return (self.path / "model.c").read_text()

    def run(self, *arrays, out=None):
        """numpy in -> list of numpy out (flattened outputs); `out`: preallocated output arrays.
        (Documentation: __init__ binds the module's run in its place.)"""
        return self.module.run(*arrays, out=out)

    def __call__(self, *args, **kwargs):
        torch_in = any(type(a).__module__.startswith("torch") for a in list(args) + list(kwargs.values()))
        if "torch" in sys.modules and (kwargs or any(isinstance(a, (list, tuple, dict)) for a in args)):
            from torch.utils import _pytree
            flat = _pytree.tree_leaves((tuple(args), dict(kwargs)))
        else:
            flat = list(args)
        outs = self.module.as_returned(self.module.run(*flat), torch_in)
        if torch_in:
            if self._out_spec is not None:
                from torch.utils import _pytree
                return _pytree.tree_unflatten(outs, self._out_spec)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def save(self, path):
        """Write the artifact to `path` (a new, empty or artifact folder) in one step: a process
        running the artifact at `path` keeps running the one it loaded."""
        return artifact.save(self.path, path)

    def set_num_threads(self, n):
        self.module.set_num_threads(n)

    def to(self, device):
        """torch's spelling: the CPU is where it runs (self); any other device is refused."""
        from .options import check_device
        check_device(device)
        return self

    def save_library(self, path, cache_dir=None) -> Path:
        """One library for C programs with the weights embedded: NAME.so (shared) or NAME.a (static,
        the kernels merged in), for the artifact's target; NAME.h beside it declares the model's API
        and <prefix>create_embedded(num_threads). Returns the header's path. Compile each model
        with its own name= to link several into one program."""
        from .build import bundle
        return bundle.build(self.path, Path(path), cache.usable_dir(cache_dir))

    def __repr__(self):
        return f"<cuvil.CompiledModel {self.path}>"


def conv_layout(opts: Options) -> str:
    """The layout the convs run in: option layout, "auto" resolved for the target (options.py)."""
    if opts.layout in ("auto", "blocked"):
        return f"nchw{vector_floats(resolve_target(opts.target))}c"
    return opts.layout


def optimize(graph, opts: Options):
    """The passes that opts ask for, for the C backend (passes/pipeline.py)."""
    from .codegen.c import C_BACKEND
    from .codegen.c.lower_bf16dot import multiplies_bf16
    from .codegen.c.lower_int8dot import int8_conv_kind
    from .codegen.c.tuning import plan_value
    from .options import calibration_leaves
    from .passes import pipeline
    calibration = [calibration_leaves(x) for x in opts.calibration_data or ()] if opts.precision == "int8" else None
    target = resolve_target(opts.target)
    return pipeline.optimize(graph, opts.fusion_level, backend=C_BACKEND, layout=conv_layout(opts),
                             precision=opts.precision, calibration=calibration,
                             calibration_method=opts.calibration_method, int8_convs=int8_conv_kind(target),
                             bf16_direct_outputs=(plan_value("bf16_direct_3x3_max_outputs", target),
                                                  plan_value("bf16_direct_grouped_3x3_max_outputs", target)),
                             bf16_convs=multiplies_bf16(target))


def _dot_products(node, target):
    """The dot products a node runs on for `target` (passes/quantize.describe): "bf16", "int8" (VNNI),
    "int8_avx2", "int8_tiles" (a dynamic int8 linear layer on AMX tiles), "bytes_depthwise" (a depthwise
    conv on its input's bytes) or None."""
    from .codegen.c.lower_bf16dot import computes_bf16
    from .codegen.c.lower_int8dot import computes_int8, computes_int8_matmul_on_tiles, depthwise_on_bytes, int8_conv_kind
    if computes_bf16(node, target):
        return "bf16"
    if computes_int8_matmul_on_tiles(node, target):
        return "int8_tiles"
    if depthwise_on_bytes(node) and node.attrs.get("int8_in"):
        return "bytes_depthwise"
    if computes_int8(node, target):
        return "int8" if int8_conv_kind(target) == 2 else "int8_avx2"
    return None


def build_graph(graph, opts: Options, cdir: Path, progress, extra_manifest=None, load=True):
    """IR -> passes -> C -> shared library, through the cache. Returns the loaded CompiledModel, or
    with load=False only the artifact's path (a caller that frees the graph first keeps peak memory
    at one copy of the weights)."""
    from .codegen.c import C_BACKEND, emit
    from .codegen.c.frame import api_h, symbol_prefix
    from .passes import data_dims
    from .passes.pipeline import plan_memory
    from .passes.quantize import AMX_INSTRUCTIONS, DOT_INSTRUCTIONS, precision_summary
    data_dims.check(graph)
    graph = optimize(graph, opts)
    progress("passes", f"{len(graph.nodes)} nodes after optimisation")
    target = resolve_target(opts.target)
    formats = precision_summary(graph, dot=lambda n: _dot_products(n, target),
                                instructions=AMX_INSTRUCTIONS if has_features(target, AMX_FEATURES) else DOT_INSTRUCTIONS)
    if opts.precision != "fp32":
        progress("precision", f"{opts.precision}: " + "; ".join(f"{k} x{v}" for k, v in formats.items()))
    plan = plan_memory(graph, C_BACKEND)
    names = graph.input_names or [v.name for v in graph.inputs]
    io = {"inputs": [_io(v, n, i in graph.complex_inputs) for i, (v, n) in enumerate(zip(graph.inputs, names))],
          "outputs": [_io(v, f"output{i}", i in graph.complex_outputs, i in graph.scalar_outputs)
                      for i, v in enumerate(graph.outputs)],
          "symbols": {k: [int(lo), int(hi)] for k, (lo, hi) in graph.symbols.items()}}
    computed = graph.data_dims()
    if computed:
        io["data_dims"] = computed
    if graph.symbol_products:
        io["symbol_products"] = [[a, b, int(most)] for a, b, most in graph.symbol_products]
    prefix = symbol_prefix(opts.name)
    c_src, weights = emit.generate(graph, plan, target, profile=opts.profile, weights_dir=cache.tmp_dir(cdir),
                                   signature=artifact.signature(io), prefix=prefix)
    progress("codegen", f"{len(c_src) // 1024} KiB of C, {weights.nbytes / 2**20:.1f} MiB weights, "
                        f"arena {plan.arena_bytes / 2**20:.1f} MiB")
    key = cache.digest(str(graph), c_src, weights.sha256, opts.key(), target, native_cpu(target),
                       toolchain.compiler_version(target), toolchain.cuvil_source_digest(), __version__)
    hit = cache.lookup(cdir, key)
    if hit is None:
        bdir = cache.new_build_dir(cdir)
        (bdir / "model.c").write_text(c_src)
        (bdir / "model.h").write_text(api_h(prefix))
        weights.move_to(bdir / "weights.bin")
        foreign = toolchain.is_foreign(target)
        if foreign:                  # a foreign target's artifact runs through its C runner
            from .codegen.c import runner
            (bdir / "cuvil_run_main.c").write_text(runner.SOURCE.read_text())
            (bdir / "cuvil_run_io.h").write_text(runner.io_header(io, prefix))
        toolchain.build_shared(bdir, target, cdir, verbose=opts.verbose, runner=foreign)
        progress("build", "model.so")
        manifest = {
            "cuvil_version": __version__, "target": target, "arch": target_arch(target),
            "cpu_features": required_features(target), **io,
            "weights": {"bytes": weights.nbytes, "checksum": weights.checksum},
            "arena_bytes": plan.arena_bytes, "num_threads": opts.num_threads,
            "options": {"precision": opts.precision, "fusion_level": opts.fusion_level},
            "precision_ops": formats,
            "compiler": toolchain.compiler_version(target), "cache_key": key, "symbol_prefix": prefix,
            "node_ops": [n.op for n in graph.nodes],
        }
        manifest.update(extra_manifest or {})
        artifact.write_manifest(bdir, manifest)          # last: it seals the files built above
        hit = cache.store(cdir, key, bdir)
        status = "miss"
    else:
        weights.discard()
        progress("cache hit", str(hit))
        status = "hit"
    if not load:
        return hit
    return wrap(hit, opts, graph, plan, {"cache": status, "cache_key": key})


COMPLEX_OF = {"float32": "complex64", "float64": "complex128"}


def _io(v, name, is_complex=False, is_scalar=False):
    """A manifest entry. A complex one states the caller's view (complex64 of shape s) of the library's
    float32 (s, 2) pairs: the same bytes. A scalar one is returned by a call as a python number."""
    shape = [d if isinstance(d, int) else D.to_py(d) for d in v.type.shape]
    if is_complex:
        return {"name": name, "dtype": COMPLEX_OF[v.dtype], "shape": shape[:-1]}
    return {"name": name, "dtype": v.dtype, "shape": shape, **({"scalar": True} if is_scalar else {})}


def wrap(path, opts, graph, plan, report):
    """A built artifact, loaded, as the CompiledModel that compile() returns."""
    module = load(path, num_threads=opts.num_threads, runnable_here=False)
    spec = module.manifest.get("treespec")
    out_spec = None
    if spec and "torch" in sys.modules:
        from torch.utils import _pytree
        try:
            out_spec = _pytree.treespec_loads(spec)
        except Exception:  # noqa: BLE001
            out_spec = None
    report.setdefault("cache_key", module.manifest.get("cache_key"))
    return CompiledModel(module, graph, plan, report, out_spec=out_spec)
