"""Command line: cuvil compile | run | inspect | bench."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

from .options import LAYOUT_CHOICES


def _load_model(spec: str):
    """'path/model.py::ClassName' -> an instance (built with no arguments); '*.onnx' -> the path."""
    if spec.endswith(".onnx"):
        return spec
    if "::" not in spec:
        raise SystemExit(f"error: model must be FILE.py::ClassName or FILE.onnx, got {spec!r}")
    path, name = spec.split("::", 1)
    mod_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if mod_spec is None:
        raise SystemExit(f"error: cannot import {path}")
    mod = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(Path(path).resolve().parent))
    mod_spec.loader.exec_module(mod)
    obj = getattr(mod, name, None)
    if obj is None:
        raise SystemExit(f"error: {path} has no {name}")
    return obj() if isinstance(obj, type) else obj


def _example_inputs(exprs):
    import torch
    env = {"torch": torch, "np": np}
    return tuple(eval(e, env) for e in exprs)  # noqa: S307 - the user's own expression, as with python -c


def _dynamic(spec_list):
    """--dynamic 0:1:batch:1:64 (input index, axis, name, min, max) -> tuple spec per input."""
    if not spec_list:
        return None
    out = {}
    for s in spec_list:
        try:
            i, axis, name, lo, hi = s.split(":")
            out.setdefault(int(i), {})[int(axis)] = (name, int(lo), int(hi))
        except ValueError:
            raise SystemExit(f"error: --dynamic wants INPUT:AXIS:NAME:MIN:MAX, got {s!r}") from None
    n = max(out) + 1
    return tuple(out.get(i) for i in range(n))


def _add_compile_options(p):
    p.add_argument("model", help="FILE.py::ClassName (instantiated with no arguments) or FILE.onnx")
    p.add_argument("--example-input", action="append", default=[],
                   help='python expression of one example input, e.g. "torch.randn(1,3,224,224)"; repeat per input')
    p.add_argument("--target", default="native", help="native (default), cpu, x86_64-avx2, x86_64-avx512")
    p.add_argument("--precision", default="fp32", help="fp32 (default)")
    p.add_argument("--fusion-level", type=int, default=2, help="0 (none) .. 3 (all); default 2")
    p.add_argument("--layout", default="auto", choices=LAYOUT_CHOICES,
                   help="conv layout: nchw16c (channel-blocked), nchw, or auto (blocked on AVX-512); default auto")
    p.add_argument("--dynamic", action="append", help="dynamic dim INPUT:AXIS:NAME:MIN:MAX, e.g. 0:0:batch:1:64")
    p.add_argument("--num-threads", type=int, default=None, help="threads at run time (default: all cores)")
    p.add_argument("--cache-dir", default=None, help="compile cache (default ~/.cache/cuvil or $CUVIL_CACHE_DIR)")
    p.add_argument("--constant-input", action="append", default=[], metavar="NAME=VALUES",
                   help="ONNX: fix a shape-deciding input, NAME=FILE.npy or NAME=1,2,3 (int64); repeat per input")


def _constants(specs):
    """--constant-input shape=6,4 or shape=shape.npy -> {name: array}."""
    import numpy as np
    out = {}
    for s in specs:
        name, sep, val = s.partition("=")
        if not sep or not name:
            raise SystemExit(f"error: --constant-input wants NAME=FILE.npy or NAME=1,2,3, got {s!r}")
        try:
            out[name] = np.load(val) if val.endswith(".npy") else np.array(
                [int(v) for v in val.split(",") if v.strip()], np.int64)
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: --constant-input {s!r}: {e}") from None
    return out or None


def _opts(a):
    return dict(target=a.target, precision=a.precision, fusion_level=a.fusion_level, layout=a.layout,
                dynamic_shapes=_dynamic(a.dynamic), num_threads=a.num_threads, cache_dir=a.cache_dir,
                constant_inputs=_constants(a.constant_input))


def cmd_compile(a):
    import cuvil
    model = _load_model(a.model)
    t = time.perf_counter()
    cm = cuvil.compile(model, _example_inputs(a.example_input), verify=a.verify, verbose=not a.quiet, **_opts(a))
    cm.save(a.output)
    print(f"compiled {a.model} -> {a.output} in {time.perf_counter() - t:.2f} s "
          f"(cache {cm.report.get('cache', '?')})")
    if "verify" in cm.report:
        for k, (ae, re_) in cm.report["verify"].items():
            print(f"  output {k}: max abs err {ae:.3g}, max rel err {re_:.3g}")


def cmd_run(a):
    import cuvil
    m = cuvil.load(a.artifact, num_threads=a.num_threads)
    inputs = [np.load(p) for p in a.input]
    outs = m.run(*inputs)
    for i, o in enumerate(outs):
        if a.output_dir:
            Path(a.output_dir).mkdir(parents=True, exist_ok=True)
            np.save(Path(a.output_dir) / f"output{i}.npy", o)
        print(f"output{i}: {o.dtype}{list(o.shape)}")
        if not a.output_dir:
            print(np.array2string(o, threshold=20, precision=5))


def cmd_inspect(a):
    if Path(a.model).is_dir():
        m = json.loads((Path(a.model) / "manifest.json").read_text())
        if a.stage == "c":
            print((Path(a.model) / "model.c").read_text())
            return
        print(json.dumps({k: v for k, v in m.items() if k != "treespec"}, indent=1))
        return
    from .api import inspect_stages
    model = _load_model(a.model)
    out = inspect_stages(model, _example_inputs(a.example_input), stages=(a.stage,), **_opts(a))
    print(out[a.stage])


def cmd_profile(a):
    import cuvil
    from . import profiler
    model = _load_model(a.model)
    ex = _example_inputs(a.example_input)
    opts = _opts(a)
    cm = cuvil.compile(model, ex, profile=True, **opts)
    arrays = [x.numpy() if hasattr(x, "numpy") else np.asarray(x) for x in ex]
    table, nodes = profiler.profile(cm, *arrays, runs=a.runs)
    print(profiler.format_table(table))
    if a.trace:
        print(f"trace: {profiler.chrome_trace(nodes, a.trace)}")


def cmd_bench(a):
    import cuvil
    m = cuvil.load(a.artifact, num_threads=a.num_threads)
    inputs = [np.load(p) for p in a.input] if a.input else [
        np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i["shape"]]).astype(i["dtype"])
        if i["dtype"].startswith("float") else np.zeros([d if isinstance(d, int) else 1 for d in i["shape"]], i["dtype"])
        for i in m.inputs]
    for _ in range(a.warmup):
        m.run(*inputs)
    ts = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        m.run(*inputs)
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"{a.artifact}: median {1000 * ts[len(ts) // 2]:.3f} ms, min {1000 * ts[0]:.3f} ms over {a.repeat} runs "
          f"({m.num_threads} threads)")


def cmd_llm_compile(a):
    import cuvil.llm
    t = time.perf_counter()
    llm = cuvil.llm.from_transformers(a.checkpoint, precision=a.precision, max_seq_len=a.max_seq_len,
                                      max_batch=a.max_batch, group=a.group, num_threads=a.num_threads,
                                      cache_dir=a.cache_dir, verbose=not a.quiet)
    llm.save(a.output)
    print(f"compiled {a.checkpoint} ({a.precision}) -> {a.output} in {time.perf_counter() - t:.1f} s")
    if "error" in llm.meta:
        e = llm.meta["error"]
        print(f"  vs fp32: top-1 agreement {e['top1_agreement']:.3f}, mean KL {e['kl_mean']:.4g}")


def cmd_llm_run(a):
    import cuvil.llm
    llm = cuvil.llm.load(a.artifact, num_threads=a.num_threads)
    prompt = a.prompt if llm.tokenizer is not None else [int(t) for t in a.prompt.split()]
    for piece in llm.generate(prompt, max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k,
                              top_p=a.top_p, repetition_penalty=a.repetition_penalty, seed=a.seed, stream=True,
                              chat=a.chat, stop=a.stop):
        print(piece if isinstance(piece, str) else f"{piece} ", end="", flush=True)
    st = llm.last_stats
    print(f"\n[{st.prompt_tokens} prompt tokens in {st.prefill_seconds * 1000:.0f} ms, {st.new_tokens} new tokens, "
          f"{st.decode_tokens_per_second:.1f} tokens/s, finish: {st.finish_reason}]", file=sys.stderr)


def _add_llm(sub):
    p = sub.add_parser("llm", help="language models: compile a checkpoint, run a prompt")
    lsub = p.add_subparsers(dest="llm_cmd", required=True)
    c = lsub.add_parser("compile", help="compile a Llama/Mistral/Qwen2 checkpoint directory")
    c.add_argument("checkpoint", help="directory with config.json and *.safetensors (and tokenizer.json)")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8", "int4"))
    c.add_argument("--group", type=int, default=64, help="int4 group size along K: 32, 64 or 128")
    c.add_argument("--max-seq-len", type=int, default=2048)
    c.add_argument("--max-batch", type=int, default=1)
    c.add_argument("--num-threads", type=int, default=None)
    c.add_argument("--cache-dir", default=None)
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=cmd_llm_compile)
    r = lsub.add_parser("run", help="generate from a prompt, streaming to the terminal")
    r.add_argument("artifact")
    r.add_argument("--prompt", required=True, help="text (or space-separated token ids without a tokenizer)")
    r.add_argument("--max-new-tokens", type=int, default=128)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--top-k", type=int, default=0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--repetition-penalty", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--stop", action="append", default=None, help="stop string; repeat for several")
    r.add_argument("--chat", action="store_true", help="apply the checkpoint's chat template")
    r.add_argument("--num-threads", type=int, default=None)
    r.set_defaults(fn=cmd_llm_run)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="cuvil", description="Ahead-of-time compiler for PyTorch and ONNX models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile", help="compile a model into an artifact directory")
    _add_compile_options(p)
    p.add_argument("-o", "--output", required=True, help="artifact directory to write")
    p.add_argument("--verify", action="store_true", help="compare with the source model on the example inputs")
    p.add_argument("--quiet", action="store_true", help="no per-stage progress")
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("run", help="run an artifact on .npy inputs")
    p.add_argument("artifact")
    p.add_argument("--input", action="append", default=[], help="an input .npy file; repeat per input")
    p.add_argument("--output-dir", help="write outputs as .npy files here instead of printing them")
    p.add_argument("--num-threads", type=int, default=None)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("inspect", help="print the IR after a stage, the memory plan or the C")
    _add_compile_options(p)
    p.add_argument("--stage", default="passes", choices=("frontend", "passes", "memplan", "c"))
    p.set_defaults(fn=cmd_inspect)
    p = sub.add_parser("profile", help="time each node of a model (per op table, Chrome trace)")
    _add_compile_options(p)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--trace", help="write a Chrome trace (chrome://tracing, Perfetto) to this file")
    p.set_defaults(fn=cmd_profile)
    p = sub.add_parser("bench", help="time an artifact")
    p.add_argument("artifact")
    p.add_argument("--input", action="append", default=[])
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--num-threads", type=int, default=None)
    p.set_defaults(fn=cmd_bench)
    _add_llm(sub)
    a = ap.parse_args(argv)
    from .errors import CuvilError
    try:
        a.fn(a)
    except (CuvilError, ValueError, FileNotFoundError) as e:
        print(f"cuvil: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
