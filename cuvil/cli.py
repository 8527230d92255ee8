"""Command line: cuvil compile | run | inspect | profile | bench | llm compile | llm run.

Every failure exits with status 2 and prints `cuvil: error: WHAT` on stderr, never a traceback:
a bad argument is an argparse usage error, anything raised later goes through the one handler in
main(). CUVIL_DEBUG=1 re-raises, for the traceback."""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from .target import TARGET_NAMES
from .errors import CuvilError
from .options import LAYOUT_CHOICES, PRECISIONS

# --example-input DTYPE[SHAPE]: random values of these dtypes, at most this many elements (1 GiB of
# float32), so that a typo such as float32[100000,100000,3] is an error, not a 120 GB allocation
EXAMPLE_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
MAX_EXAMPLE_ELEMENTS = 1 << 28
EVAL_WARNING = "evaluates Python: never pass untrusted strings"


class UserCodeError(Exception):
    """The user's own Python raised: importing the model file, building the class, a py: expression."""


# errors that describe bad input (arguments, files, the user's code), shown as they are; anything
# else is a bug in cuvil, shown as "internal error"
USER_ERRORS = (CuvilError, UserCodeError, ValueError, TypeError, OSError, SyntaxError, ImportError)


def _user_code(what, fn, *args):
    try:
        return fn(*args)
    except Exception as e:
        raise UserCodeError(f"{what} failed: {type(e).__name__}: {e}") from e


# ---- argparse type functions: a bad value is a usage error (exit 2) before anything runs

def _int_in(lo, hi):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{s!r} is not in [{lo}, {hi}]")
        return v
    return parse


def _float_in(lo, hi, *, open_lo=False):
    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        if not (math.isfinite(v) and (lo < v if open_lo else lo <= v) and v <= hi):
            raise argparse.ArgumentTypeError(f"{s!r} is not in {'(' if open_lo else '['}{lo}, {hi}]")
        return v
    return parse


def _path(s):
    if not s or "\0" in s:
        raise argparse.ArgumentTypeError(f"{s!r} is not a path")
    return s


def _out_dir(s):
    """A directory to write: new, or an existing directory (never an existing file)."""
    if Path(_path(s)).exists() and not Path(s).is_dir():
        raise argparse.ArgumentTypeError(f"{s!r} exists and is not a directory")
    return s


LIBRARY_SUFFIXES = (".so", ".a")


def _compile_output(s):
    """compile's --output: an artifact directory, or NAME.so / NAME.a for a library with the
    weights embedded (a file that may be replaced)."""
    if Path(s).suffix in LIBRARY_SUFFIXES:
        if Path(_path(s)).is_dir():
            raise argparse.ArgumentTypeError(f"{s!r} is a directory, not a library file to write")
        return s
    return _out_dir(s)


def _example_spec(s):
    """--example-input: ('random', (dtype, shape)), ('npy', path) or ('py', expression); nothing is
    read or evaluated here."""
    if s.startswith("py:"):
        return "py", s[3:]
    if s.endswith(".npy"):
        return "npy", _path(s)
    m = re.fullmatch(r"\s*(\w+)\s*\[([^\]]*)\]\s*", s, re.ASCII)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{s!r} is neither DTYPE[SHAPE] (e.g. float32[1,3,224,224]) nor a .npy file; to evaluate it as a "
            f"Python expression write 'py:{s}' (this {EVAL_WARNING})")
    dtype, dims = m.groups()
    if dtype not in EXAMPLE_DTYPES:
        raise argparse.ArgumentTypeError(f"{s!r}: dtype {dtype!r} is not one of {', '.join(EXAMPLE_DTYPES)}")
    parts = [d.strip() for d in dims.split(",")] if dims.strip() else []
    if len(parts) > 32 or not all(re.fullmatch(r"[0-9]{1,10}", d) for d in parts):
        raise argparse.ArgumentTypeError(f"{s!r}: the shape must be up to 32 non-negative integers, e.g. [1,3,224,224]")
    shape = tuple(int(d) for d in parts)
    if math.prod(shape) > MAX_EXAMPLE_ELEMENTS or max(shape, default=0) > MAX_EXAMPLE_ELEMENTS:
        raise argparse.ArgumentTypeError(f"{s!r}: more than {MAX_EXAMPLE_ELEMENTS} elements")
    return "random", (dtype, shape)


def _dynamic_spec(s):
    """--dynamic INPUT:AXIS:NAME:MIN:MAX -> (input, axis, name, min, max)."""
    try:
        i, axis, name, lo, hi = s.split(":")
        i, axis, lo, hi = int(i), int(axis), int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants INPUT:AXIS:NAME:MIN:MAX, e.g. 0:0:batch:1:64, got {s!r}") from None
    # bounded: the input index becomes the length of a tuple
    if not (0 <= i < 1024 and 0 <= axis < 64 and name.isidentifier() and 0 <= lo <= hi < 2 ** 31):
        raise argparse.ArgumentTypeError(f"{s!r}: wants 0 <= INPUT < 1024, 0 <= AXIS < 64, NAME an identifier, "
                                         "0 <= MIN <= MAX < 2**31")
    return i, axis, name, lo, hi


def _constant_spec(s):
    """--constant-input NAME=1,2,3 -> (name, int64 array); NAME=FILE.npy -> (name, path), read later."""
    name, sep, val = s.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"wants NAME=FILE.npy or NAME=1,2,3, got {s!r}")
    if val.endswith(".npy"):
        return name, _path(val)
    try:
        ints = [int(v) for v in val.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: values must be integers, e.g. {name}=1,2,3") from None
    if not all(-2 ** 63 <= v < 2 ** 63 for v in ints):
        raise argparse.ArgumentTypeError(f"{s!r}: values must fit in int64")
    return name, np.array(ints, np.int64)


THREADS = dict(type=_int_in(1, 1024), default=None, help="threads at run time, 1..1024 (default: all cores)")
COUNT = _int_in(1, 10 ** 7)  # --repeat, --runs, ...


# ---- reading what the arguments name

def _load_npy(path, what):
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{what}: {path} is not a readable .npy file ({e})") from None
    if not isinstance(a, np.ndarray):  # an .npz archive
        raise ValueError(f"{what}: {path} is an .npz archive, not a .npy file")
    return a


def _load_model(spec: str):
    """'path/model.py::ClassName' -> an instance (built with no arguments); '*.onnx' -> the path."""
    if spec.endswith(".onnx"):
        if not Path(spec).is_file():
            raise ValueError(f"model file {spec} does not exist")
        return spec
    path, sep, name = spec.partition("::")
    if not (sep and path.endswith(".py") and name.isidentifier()):
        raise ValueError(f"model must be FILE.py::ClassName or FILE.onnx, got {spec!r}")
    if not Path(path).is_file():
        raise ValueError(f"model file {path} does not exist")
    mod_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    mod = importlib.util.module_from_spec(mod_spec)
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:  # the model file's own imports of its neighbours
        sys.path.insert(0, folder)
    _user_code(f"importing {path}", mod_spec.loader.exec_module, mod)
    obj = getattr(mod, name, None)
    if obj is None:
        raise ValueError(f"{path} defines no {name!r}")
    return _user_code(f"{spec}()", obj) if isinstance(obj, type) else obj


def _random(rng, dtype, shape):
    """Normal floats; small non-negative ints (safe as indices); booleans. An array even for shape ()."""
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.startswith("float"):
        return np.asarray(rng.standard_normal(shape), dtype)
    return np.asarray(rng.integers(0, 10, shape), dtype)


def _example_inputs(specs, for_torch):
    rng = np.random.default_rng(0)
    out = []
    for kind, val in specs:
        if kind == "py":
            import torch
            env = {"torch": torch, "np": np}
            x = _user_code(f"--example-input 'py:{val}'", eval, val, env)  # noqa: S307 - the user opted in
        elif kind == "npy":
            x = _load_npy(val, "--example-input")
        else:
            x = _random(rng, *val)
        if for_torch and isinstance(x, np.ndarray):
            import torch
            x = torch.from_numpy(x)
        out.append(x)
    return tuple(out)


def _dynamic(specs):
    """(input, axis, name, min, max) per --dynamic -> a tuple with {axis: (name, min, max)} per input."""
    if not specs:
        return None
    out = {}
    for i, axis, name, lo, hi in specs:
        if axis in out.setdefault(i, {}):
            raise ValueError(f"--dynamic: input {i} axis {axis} given twice")
        out[i][axis] = (name, lo, hi)
    return tuple(out.get(i) for i in range(max(out) + 1))


def _constants(specs):
    out = {}
    for name, val in specs:
        if name in out:
            raise ValueError(f"--constant-input {name} given twice")
        out[name] = _load_npy(val, f"--constant-input {name}") if isinstance(val, str) else val
    return out or None


def _opts(a):
    return dict(target=a.target, precision=a.precision, fusion_level=a.fusion_level, layout=a.layout,
                dynamic_shapes=_dynamic(a.dynamic), num_threads=a.num_threads, cache_dir=a.cache_dir,
                constant_inputs=_constants(a.constant_input), name=getattr(a, "name", None))


def _model_and_inputs(a):
    if (a.model is None) == (a.model_option is None):
        raise CuvilError("give the model once: cuvil compile FILE.py::Class (or --input FILE.py::Class, or FILE.onnx)")
    a.model = a.model if a.model is not None else a.model_option      # "" is a model spec, a wrong one
    model = _load_model(a.model)
    return model, _example_inputs(a.example_input, for_torch=not isinstance(model, str))


# ---- the commands

def cmd_compile(a):
    import cuvil
    model, ex = _model_and_inputs(a)
    t = time.perf_counter()
    cm = cuvil.compile(model, ex, verify=a.verify, verbose=not a.quiet, **_opts(a))
    library = Path(a.output).suffix in LIBRARY_SUFFIXES
    if a.embed_weights and not library:
        raise CuvilError("--embed-weights builds one library: give --output NAME.so (shared) or NAME.a (static)")
    if library:
        header = cm.save_library(a.output, cache_dir=a.cache_dir)
        print(f"library {a.output} (weights embedded), header {header}")
    else:
        cm.save(a.output)
    print(f"compiled {a.model} -> {a.output} in {time.perf_counter() - t:.2f} s "
          f"(cache {cm.report.get('cache', '?')})")
    if "verify" in cm.report:
        for k, (ae, re_) in cm.report["verify"].items():
            print(f"  output {k}: max abs err {ae:.3g}, max rel err {re_:.3g}")


def cmd_run(a):
    import cuvil
    m = cuvil.load(a.artifact, num_threads=a.num_threads)
    outs = m.run(*[_load_npy(p, "--input") for p in a.input])
    if a.output_dir:
        Path(a.output_dir).mkdir(parents=True, exist_ok=True)
    for i, o in enumerate(outs):
        if a.output_dir:
            np.save(Path(a.output_dir) / f"output{i}.npy", o)
        print(f"output{i}: {o.dtype}{list(o.shape)}")
        if not a.output_dir:
            print(np.array2string(o, threshold=20, precision=5))


def cmd_inspect(a):
    if Path(a.model).is_dir():
        import json

        from .runtime.artifact import read_manifest
        m = read_manifest(Path(a.model))
        if a.stage == "c":
            print((Path(a.model) / "model.c").read_text())
            return
        print(json.dumps({k: v for k, v in m.items() if k != "treespec"}, indent=1))
        return
    from .api import inspect_stages
    model, ex = _model_and_inputs(a)
    out = inspect_stages(model, ex, stages=(a.stage,), **_opts(a))
    print(out[a.stage])


def cmd_profile(a):
    import cuvil
    from . import profiler
    model, ex = _model_and_inputs(a)
    cm = cuvil.compile(model, ex, profile=True, **_opts(a))
    arrays = [x.numpy() if hasattr(x, "numpy") else np.asarray(x) for x in ex]
    table, nodes = profiler.profile(cm, *arrays, runs=a.runs)
    print(profiler.format_table(table))
    if a.trace:
        print(f"trace: {profiler.chrome_trace(nodes, a.trace)}")


def cmd_bench(a):
    import cuvil
    m = cuvil.load(a.artifact, num_threads=a.num_threads)
    # without --input: random inputs of the compiled shapes, dynamic dims at 1
    inputs = [_load_npy(p, "--input") for p in a.input] or [
        _random(np.random.default_rng(0), i["dtype"], [d if isinstance(d, int) else 1 for d in i["shape"]])
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
                                      cache_dir=a.cache_dir, verbose=not a.quiet, kv_cache=a.kv_cache,
                                      max_step_tokens=a.max_step_tokens)
    llm.save(a.output)
    print(f"compiled {a.checkpoint} ({a.precision}, KV cache {a.kv_cache}) -> {a.output} in "
          f"{time.perf_counter() - t:.1f} s")
    if "error" in llm.meta:
        e = llm.meta["error"]
        print(f"  vs fp32: top-1 agreement {e['top1_agreement']:.3f}, mean KL {e['kl_mean']:.4g}")


def cmd_llm_run(a):
    import cuvil.llm
    llm = cuvil.llm.load(a.artifact, num_threads=a.num_threads)
    prompt = a.prompt
    if llm.tokenizer is None:
        try:
            prompt = [int(t) for t in a.prompt.split()]
        except ValueError:
            raise ValueError("this artifact has no tokenizer: --prompt must be space-separated token ids") from None
    for piece in llm.generate(prompt, max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k,
                              top_p=a.top_p, repetition_penalty=a.repetition_penalty, seed=a.seed, stream=True,
                              chat=a.chat, stop=a.stop):
        print(piece if isinstance(piece, str) else f"{piece} ", end="", flush=True)
    st = llm.last_stats
    print(f"\n[{st.prompt_tokens} prompt tokens in {st.prefill_seconds * 1000:.0f} ms, {st.new_tokens} new tokens, "
          f"{st.decode_tokens_per_second:.1f} tokens/s, finish: {st.finish_reason}]", file=sys.stderr)


# ---- the parser

def _add_compile_options(p):
    p.add_argument("model", nargs="?", help="FILE.py::ClassName (instantiated with no arguments) or FILE.onnx")
    p.add_argument("--input", dest="model_option", metavar="MODEL", help="the model, as --input FILE.py::ClassName")
    p.add_argument("--example-input", action="append", default=[], type=_example_spec, metavar="INPUT",
                   help="one example input, repeat per input: DTYPE[SHAPE] for random values, e.g. "
                        f"float32[1,3,224,224] or int64[2,8] ({', '.join(EXAMPLE_DTYPES)}), or FILE.npy. "
                        f'"py:EXPR" evaluates a Python expression (torch and np in scope), e.g. '
                        f'"py:torch.randn(1,3,224,224)": it {EVAL_WARNING}')
    p.add_argument("--target", default="native", choices=TARGET_NAMES, help="default native")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="default fp32; bf16 / fp16: linear layers' weights in 16 bits; int8: int8 weights and "
                        "dynamically quantized activations (the error against fp32 is measured and reported)")
    p.add_argument("--fusion-level", type=_int_in(0, 3), default=2, help="0 (none) .. 3 (all); default 2")
    p.add_argument("--layout", default="auto", choices=LAYOUT_CHOICES,
                   help="conv layout: blocked (nchw16c on AVX-512, nchw8c on AVX2, nchw4c on SSE2/NEON), nchw, "
                        "or auto (blocked); default auto")
    p.add_argument("--dynamic", action="append", type=_dynamic_spec,
                   help="dynamic dim INPUT:AXIS:NAME:MIN:MAX, e.g. 0:0:batch:1:64")
    p.add_argument("--num-threads", **THREADS)
    p.add_argument("--cache-dir", type=_path, default=None,
                   help="compile cache (default ~/.cache/cuvil or $CUVIL_CACHE_DIR)")
    p.add_argument("--constant-input", action="append", default=[], type=_constant_spec, metavar="NAME=VALUES",
                   help="ONNX: fix a shape-deciding input, NAME=FILE.npy or NAME=1,2,3 (int64); repeat per input")
    p.add_argument("--name", default=None, help="model name: its C functions are cuvil_NAME_run, ... (to link "
                                                "several models into one program)")


def cmd_serve(a):
    try:
        from .serve.http import serve
    except ImportError as e:
        raise CuvilError(f"cuvil serve needs the serve extra: pip install 'cuvil[serve]' ({e})") from None
    serve(a.artifact, host=a.host, port=a.port, workers=a.workers, name=a.name, max_batch=a.max_batch,
          max_wait_ms=a.max_wait_ms, num_threads=a.num_threads, prefill_chunk=a.prefill_chunk,
          pace_prefill=a.pace_prefill, mix_rows=a.mix_rows, watch_seconds=1.0 if a.watch else 0.0)


def _add_llm(sub):
    p = sub.add_parser("llm", help="language models: compile a checkpoint, run a prompt")
    lsub = p.add_subparsers(dest="llm_cmd", required=True)
    c = lsub.add_parser("compile", help="compile a decoder-only checkpoint directory (Llama, Mistral, Qwen, "
                                        "Phi-3, OLMo-2, Gemma, Mixtral families)")
    c.add_argument("checkpoint", type=_path, help="directory with config.json and *.safetensors (and tokenizer.json)")
    c.add_argument("-o", "--output", required=True, type=_out_dir)
    c.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8", "int4"))
    c.add_argument("--group", type=int, default=64, choices=(32, 64, 128), help="int4 group size along K")
    c.add_argument("--kv-cache", default="fp32", choices=("fp32", "fp16"),
                   help="KV cache precision (fp16: half the memory, error measured against fp32)")
    c.add_argument("--max-seq-len", type=_int_in(1, 1 << 20), default=2048)
    c.add_argument("--max-batch", type=_int_in(1, 4096), default=1)
    c.add_argument("--max-step-tokens", type=_int_in(1, 1 << 24), default=None,
                   help="the most tokens one step runs, rows x tokens (default: max-seq-len); the step's buffers "
                        "are sized by it")
    c.add_argument("--num-threads", **THREADS)
    c.add_argument("--cache-dir", type=_path, default=None)
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=cmd_llm_compile)
    r = lsub.add_parser("run", help="generate from a prompt, streaming to the terminal")
    r.add_argument("artifact", type=_path)
    r.add_argument("--prompt", required=True, help="text (or space-separated token ids without a tokenizer)")
    r.add_argument("--max-new-tokens", type=_int_in(1, 1 << 20), default=128)
    r.add_argument("--temperature", type=_float_in(0, 1e6), default=0.0)
    r.add_argument("--top-k", type=_int_in(0, 1 << 30), default=0)
    r.add_argument("--top-p", type=_float_in(0, 1, open_lo=True), default=1.0)
    r.add_argument("--repetition-penalty", type=_float_in(0, 1e6, open_lo=True), default=1.0)
    r.add_argument("--seed", type=_int_in(0, 2 ** 63 - 1), default=None)
    r.add_argument("--stop", action="append", default=None, help="stop string; repeat for several")
    r.add_argument("--chat", action="store_true", help="apply the checkpoint's chat template")
    r.add_argument("--num-threads", **THREADS)
    r.set_defaults(fn=cmd_llm_run)


def parser():
    ap = argparse.ArgumentParser(prog="cuvil", description="Ahead-of-time compiler for PyTorch and ONNX models",
                                 epilog="Every error exits with status 2 and one 'cuvil: error:' line; "
                                        "CUVIL_DEBUG=1 shows the traceback.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile", help="compile a model into an artifact directory")
    _add_compile_options(p)
    p.add_argument("-o", "--output", required=True, type=_compile_output,
                   help="artifact directory to write, or NAME.so / NAME.a: one shared / static library with the "
                        "weights embedded, and NAME.h beside it (for C programs)")
    p.add_argument("--embed-weights", action="store_true", help="with --output NAME.so or NAME.a (implied by them)")
    p.add_argument("--verify", action="store_true", help="compare with the source model on the example inputs")
    p.add_argument("--quiet", action="store_true", help="no per-stage progress")
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("run", help="run an artifact on .npy inputs")
    p.add_argument("artifact", type=_path)
    p.add_argument("--input", action="append", default=[], type=_path, help="an input .npy file; repeat per input")
    p.add_argument("--output-dir", type=_out_dir, help="write outputs as .npy files here instead of printing them")
    p.add_argument("--num-threads", **THREADS)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("inspect", help="print the IR after a stage, the memory plan or the C")
    _add_compile_options(p)
    p.add_argument("--stage", default="passes", choices=("frontend", "passes", "memplan", "c"))
    p.set_defaults(fn=cmd_inspect)
    p = sub.add_parser("profile", help="time each node of a model (per op table, Chrome trace)")
    _add_compile_options(p)
    p.add_argument("--runs", type=COUNT, default=10)
    p.add_argument("--trace", type=_path, help="write a Chrome trace (chrome://tracing, Perfetto) to this file")
    p.set_defaults(fn=cmd_profile)
    p = sub.add_parser("bench", help="time an artifact")
    p.add_argument("artifact", type=_path)
    p.add_argument("--input", action="append", default=[], type=_path)
    p.add_argument("--repeat", type=COUNT, default=50)
    p.add_argument("--warmup", type=_int_in(0, 10 ** 7), default=5)
    p.add_argument("--num-threads", **THREADS)
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("serve", help="serve an artifact over HTTP: KServe v2, or the OpenAI APIs for an LLM "
                                     "artifact (continuous batching); Prometheus /metrics")
    p.add_argument("artifact", type=_path)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=_int_in(1, 65535), default=8000)
    p.add_argument("--name", default=None, help="model name in the URLs (default: the artifact folder's name)")
    p.add_argument("--max-batch", type=_int_in(1, 4096), default=8, help="rows stacked into one run at most")
    p.add_argument("--max-wait-ms", type=_float_in(0, 60000), default=2.0,
                   help="how long the first waiting request waits for others to stack with")
    p.add_argument("--workers", type=_int_in(1, 256), default=1, help="server processes, each loading the artifact")
    p.add_argument("--watch", action="store_true",
                   help="reload the artifact when it is saved over (requests in flight finish on the old one)")
    p.add_argument("--prefill-chunk", type=_int_in(1, 1 << 20), default=64,
                   help="LLM artifacts: prompt tokens read per step between decode steps of running streams")
    p.add_argument("--pace-prefill", action="store_true",
                   help="LLM artifacts: while streams decode, prompt chunks sized to take about one decode step "
                        "(smoother streams, slower first tokens)")
    p.add_argument("--mix-rows", type=_int_in(0, 1 << 20), default=0, metavar="N",
                   help="LLM artifacts: while streams decode, prompt tokens ride in each decode step as rows of "
                        "their own, filling it up to N rows (at least one): smooth streams, slower first tokens")
    p.add_argument("--num-threads", **THREADS)
    p.set_defaults(fn=cmd_serve)
    _add_llm(sub)
    return ap


def _error_lines(e) -> str:
    """`cuvil: error: ...`: the first line of the message; a multi-line one (the ops an UnsupportedOpError
    lists, a compiler's output) goes on indented below it."""
    text = str(e).strip() or type(e).__name__
    if not isinstance(e, USER_ERRORS):
        return (f"cuvil: error: internal error: {type(e).__name__}: {' '.join(text.split())} "
                "(set CUVIL_DEBUG=1 for the traceback)")
    first, *rest = text.splitlines()
    return "\n".join([f"cuvil: error: {first}"] + [f"  {line.strip()}" for line in rest if line.strip()])


def main(argv=None) -> int:
    """The entry point of `cuvil` and `python -m cuvil`: 0, or 2 and one error line, never a traceback."""
    try:
        a = parser().parse_args(argv)  # usage errors: argparse prints them and exits 2
        a.fn(a)
    except KeyboardInterrupt:  # Ctrl-C: no traceback either, the shell's usual status
        print("cuvil: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("CUVIL_DEBUG", "0") not in ("", "0"):
            raise
        print(_error_lines(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
