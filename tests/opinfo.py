"""Runner of PyTorch's own OpInfo database (torch.testing._internal.common_methods_invocations.op_db)
against cuvil: each OpInfo's float32 CPU samples become a tiny module (the sample's tensors as its
inputs, everything else as constants), compiled by cuvil and compared with eager at torch's float32
tolerances (torch.testing.assert_close); an output that misses eager's float32 result but matches eager's
float64 result (rounded to float32) at that tolerance passes: it is closer to the exact value than eager.

    python -m tests.opinfo                      # every OpInfo, its first sample: summary + table
    python -m tests.opinfo --samples 3 -k norm  # a subset, more samples
    python -m tests.opinfo --write-known        # rewrite tests/opinfo_known_failures.json

Each op ends as one of:
  pass         every sample compiled and matched eager
  unsupported  a clean cuvil UnsupportedOpError (an op, a dtype or a form not handled yet)
  error        another cuvil error (CuvilError) at compile or run time: clean, but a gap
  mismatch     compiled and ran, but disagreed with eager (a wrong answer: a bug)
  crash        any other exception inside cuvil, or the worker process died or hung (a bug)
  no_export    torch.export + core ATen decomposition cannot take the sample: not counted
  random       eager itself gives two answers for one input (a random op), or its output is undefined
               memory (empty, new_empty, ...): not counted
  eager_crash  the worker died before cuvil was called (torch itself, on a CUDA-only or sparse op):
               not counted
  no_sample    the OpInfo has no float32 CPU sample: not counted

The pass rate is pass / (every op but no_export and no_sample). Ops run in worker processes (-j,
default 2), one at a time each, so a crash or hang takes down only its op.
"""
from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
KNOWN_FAILURES = HERE / "opinfo_known_failures.json"
COUNTED = ("pass", "unsupported", "error", "mismatch", "crash")
TIMEOUT_S = 120
UNDEFINED_OUTPUT = ("empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided")
_STAGE = {"conn": None}      # in a worker: where it reports that eager is done and cuvil starts


def _stage(name):
    if _STAGE["conn"] is not None:
        _STAGE["conn"].send(("stage", name))


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def opinfos():
    """{id: OpInfo} of those with float32 on CPU."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    return {op_id(op): op for op in op_db if torch.float32 in op.supported_dtypes("cpu")}


class SampleModule:
    """The module of one sample: forward(*tensors) calls the op with the sample's structure, the
    tensors replaced by the inputs (so they are graph inputs, not constants)."""

    @staticmethod
    def build(fn, sample):
        import torch
        import torch.utils._pytree as pytree
        leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        is_tensor = [isinstance(v, torch.Tensor) for v in leaves]
        tensors = tuple(v for v in leaves if isinstance(v, torch.Tensor))

        class Sample(torch.nn.Module):
            def forward(self, *xs):
                it = iter(xs)
                filled = [next(it) if t else v for t, v in zip(is_tensor, leaves)]
                x, args, kwargs = pytree.tree_unflatten(filled, spec)
                return fn(x, *args, **kwargs)
        return Sample().eval(), tensors


def _exportable(module, tensors) -> bool:
    import torch
    from cuvil.frontend.torch import decomposition_table
    try:
        torch.export.export(module, tensors).run_decompositions(decomposition_table())
        return True
    except Exception:
        return False


def _tensor_leaves(out):
    """The output's tensors, and its python numbers (x.item()) as 0-d tensors."""
    import torch
    import torch.utils._pytree as pytree
    return [torch.as_tensor(v) if isinstance(v, (bool, int, float)) else v for v in pytree.tree_leaves(out)
            if isinstance(v, (torch.Tensor, bool, int, float))]


def check_sample(op, sample, cache_dir) -> tuple[str, str]:
    """(status, detail) for one sample."""
    import torch

    import cuvil
    module, tensors = SampleModule.build(op.get_op(), sample)
    with torch.no_grad():
        want = _tensor_leaves(module(*[t.clone() for t in tensors]))
        again = _tensor_leaves(module(*[t.clone() for t in tensors]))
    if any(not torch.equal(a, b) for a, b in zip(want, again) if not (a.is_floating_point() and a.isnan().any())):
        return "random", ""
    if not _exportable(module, tensors):
        return "no_export", ""
    _stage("cuvil")
    try:
        compiled = cuvil.compile(module, tensors, cache_dir=cache_dir)
        got = compiled(*[t.clone() for t in tensors])
    except cuvil.UnsupportedOpError as e:
        return "unsupported", str(e).splitlines()[0][:300]
    except cuvil.CuvilError as e:
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return "crash", f"{type(e).__name__}: {str(e)[:200]} ({Path(tb.filename).name}:{tb.lineno})"
    got = [torch.as_tensor(g) for g in torch.utils._pytree.tree_leaves(got)]       # (hist, [edges]) nests
    if len(got) != len(want):
        return "mismatch", f"{len(got)} outputs, eager has {len(want)}"
    exact = None
    for i, (g, w) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(g, w, equal_nan=True)
        except AssertionError as e:
            exact = _eager_in_float64(module, tensors) if exact is None else exact
            if not _close_to(g, exact[i] if i < len(exact) else None):
                return "mismatch", f"output {i}: {' '.join(str(e).split())[:300]}"
    return "pass", ""


def _eager_in_float64(module, tensors) -> list:
    """Eager's outputs with the float32 inputs in float64 (a better oracle where float32 eager rounds
    worse than the compiled code: torch's trigamma reflects in float32, 7e-6 off near the poles); []
    when the op does not run so."""
    import torch
    try:
        with torch.no_grad():
            return _tensor_leaves(module(*[t.double() if t.dtype == torch.float32 else t.clone() for t in tensors]))
    except Exception:
        return []


def _close_to(got, exact) -> bool:
    """got matches the float64 result, rounded to got's dtype, at got's dtype's tolerance."""
    import torch
    if exact is None or not exact.is_floating_point() or exact.shape != got.shape:
        return False
    try:
        torch.testing.assert_close(got, exact.to(got.dtype), equal_nan=True)
        return True
    except AssertionError:
        return False


def check_op(op, samples: int, cache_dir) -> tuple[str, str]:
    """The op's status: its first `samples` float32 samples, the first that is not a pass decides."""
    import torch
    if op.name in UNDEFINED_OUTPUT:
        return "random", "its output is undefined memory"
    try:
        it = op.sample_inputs("cpu", torch.float32, requires_grad=False)
        picked = [s for _, s in zip(range(samples), it)]
    except Exception as e:
        return "no_sample", f"sample_inputs failed: {type(e).__name__}"
    if not picked:
        return "no_sample", ""
    exported = 0
    for s in picked:
        status, detail = check_sample(op, s, cache_dir)
        if status in ("no_export", "random"):
            if status == "random":
                return status, detail
            continue
        exported += 1
        if status != "pass":
            return status, detail
    return ("pass", "") if exported else ("no_export", "")


def _worker(conn, samples, cache_dir):
    warnings.filterwarnings("ignore")
    _STAGE["conn"] = conn
    ops = opinfos()
    while True:
        name = conn.recv()
        if name is None:
            return
        _stage("eager")
        conn.send(("done", check_op(ops[name], samples, cache_dir)))


def run(names, samples=1, jobs=2, verbose=False) -> dict:
    """{op id: (status, detail)}, each op in a worker process, one at a time."""
    ctx = mp.get_context("spawn")
    cache_dir = tempfile.mkdtemp(prefix="cuvil-opinfo-")
    todo, results, workers = list(names), {}, []

    def spawn():
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, samples, cache_dir), daemon=True)
        p.start()
        return {"proc": p, "conn": parent, "op": None, "since": 0.0, "stage": None}

    workers = [spawn() for _ in range(max(1, jobs))]
    while todo or any(w["op"] for w in workers):
        for i, w in enumerate(workers):
            if w["op"] is None and todo:
                w["op"], w["since"], w["stage"] = todo.pop(0), time.monotonic(), None
                w["conn"].send(w["op"])
            if w["op"] is None:
                continue
            done = False
            try:
                while w["conn"].poll(0.05):
                    kind, payload = w["conn"].recv()
                    if kind == "stage":
                        w["stage"] = payload
                    else:
                        results[w["op"]], done = payload, True
                        break
            except (EOFError, OSError):
                pass
            died = not done and not w["proc"].is_alive()
            hung = not done and time.monotonic() - w["since"] > TIMEOUT_S
            if died or hung:
                in_cuvil = w["stage"] == "cuvil"
                results[w["op"]] = ("crash" if in_cuvil else "eager_crash",
                                    ("worker died" if died else f"no answer in {TIMEOUT_S} s")
                                    + ("" if in_cuvil else " before cuvil was called"))
                w["proc"].kill()
                workers[i] = spawn()
            elif done:
                w["op"] = None
            else:
                continue
            if verbose:
                name = list(results)[-1]
                print(f"{name:40s} {results[name][0]:12s} {results[name][1][:100]}", flush=True)
    for w in workers:
        w["conn"].send(None)
        w["proc"].join(5)
    return results


def summary(results) -> dict:
    counts = collections.Counter(status for status, _ in results.values())
    counted = sum(counts[s] for s in COUNTED)
    return {"counts": dict(counts), "counted": counted,
            "pass_rate": counts["pass"] / counted if counted else 0.0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="only OpInfos whose id contains this")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--write-known", action="store_true",
                    help=f"write every counted op that does not pass into {KNOWN_FAILURES.name}")
    ap.add_argument("--json", help="write every result here")
    a = ap.parse_args(argv)
    names = sorted(n for n in opinfos() if a.k in n)
    t0 = time.time()
    results = run(names, a.samples, a.j, a.v)
    s = summary(results)
    by_status = collections.defaultdict(list)
    for name, (status, detail) in sorted(results.items()):
        by_status[status].append((name, detail))
    for status in ("crash", "mismatch", "error"):
        for name, detail in by_status[status]:
            print(f"{status:9s} {name}: {detail}")
    print(f"\n{len(results)} OpInfos in {time.time() - t0:.0f} s: " + ", ".join(
        f"{k} {v}" for k, v in sorted(s["counts"].items())))
    print(f"pass rate {s['counts'].get('pass', 0)} / {s['counted']} = {100 * s['pass_rate']:.1f}% "
          "(of the ops torch.export + core ATen decomposition takes)")
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": s, "results": results}, indent=1))
    if a.write_known:
        known = {n: st for n, (st, _) in sorted(results.items()) if st in COUNTED and st != "pass"}
        KNOWN_FAILURES.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(known)} known failures to {KNOWN_FAILURES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
