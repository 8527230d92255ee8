"""LLM benchmark: a TinyLlama-1.1B-shaped model (random weights, a real safetensors checkpoint):
prefill of 128 tokens and decode tokens/s over 128 new tokens at fp32, bf16, int8, int4, against
transformers eager and llama.cpp (llama-cpp-python on GGUF F32 / Q8_0 / Q4_0 of the same weights,
when installed), plus the roofline: measured memory bandwidth / weight bytes read per token.

    python -m benchmarks.llm [--threads 1,2] [--precisions fp32,bf16,int8,int4] [--small]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from benchmarks.scratch import temp_dir

OUT = Path(__file__).resolve().parent / "out"
TINYLLAMA = dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                 intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5,
                 tie_word_embeddings=False)
SMALL = dict(TINYLLAMA, hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1408)


def placeholder_tokenizer(d: Path, vocab: int):
    """tokenizer.json naming token i "<ti>" (a word-level vocabulary): the random model's output streams as
    text, one piece a token, through servers that give text (cuvil serve's OpenAI APIs)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"<t{i}>": i for i in range(vocab)}, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))


def make_checkpoint(shape, name):
    import torch
    import transformers as T
    d = OUT / name
    if (d / "config.json").exists():
        if not (d / "tokenizer.json").exists():
            placeholder_tokenizer(d, shape["vocab_size"])
        return d
    torch.manual_seed(0)
    cfg = T.LlamaConfig(**shape)
    with torch.device("cpu"):
        m = T.LlamaForCausalLM(cfg).eval()
    for p in m.parameters():                       # small weights keep random-model logits finite and varied
        p.data.mul_(0.5)
    m.save_pretrained(str(d), safe_serialization=True)
    placeholder_tokenizer(d, shape["vocab_size"])
    return d


def weight_bytes_per_token(shape, precision, group=64):
    h, i, v, L = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_hidden_layers"]
    hd = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * hd
    params = L * (h * h + 2 * h * kv + h * h + 3 * h * i) + h * v
    per = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4.0 / h, "int4": 0.5 + 2.0 / group}[precision]
    return params * per


BANDWIDTH_C = r"""
#include <stdint.h>
typedef float v8 __attribute__((vector_size(32), aligned(4)));
/* Each thread sums its share as `streams` adjacent 128 KiB panels read side by side (one stream read
   11-12 GB/s on one core here, four 16-19: the decode GEMV reads six panels at once), with no
   software prefetch (0), 8 KiB ahead non-temporal (1) or 2 KiB ahead into L1 as the GEMV does on
   AVX-512 (2); the probe reports the best pattern, so a kernel cannot beat the roofline. */
float cuvil_bw_sum(const float *a, int64_t n, int threads, int streams, int prefetch) {
    const int64_t panel = 2048;                  /* 64-byte lines: 128 KiB, a K = 2048 fp32 panel */
    float s = 0.f;
    #pragma omp parallel for num_threads(threads) reduction(+:s) schedule(static)
    for (int64_t g = 0; g < n / 16 / panel / streams; g++) {
        v8 t[2] = {{0}, {0}};
        for (int64_t b = 0; b < panel; b += 2)
            for (int j = 0; j < streams; j++) {  /* a line of each panel in turn, as the GEMV reads */
                const float *q = a + ((g * streams + j) * panel + b) * 16;
                const v8 *p = (const v8 *)q;
                if (prefetch == 1) __builtin_prefetch(q + 2048, 0, 0), __builtin_prefetch(q + 2048 + 16, 0, 0);
                if (prefetch == 2) __builtin_prefetch(q + 512, 0, 3), __builtin_prefetch(q + 512 + 16, 0, 3);
                t[0] += p[0] + p[1];
                t[1] += p[2] + p[3];
            }
        v8 u = t[0] + t[1];
        s += u[0] + u[1] + u[2] + u[3] + u[4] + u[5] + u[6] + u[7];
    }
    return s;
}
"""


@functools.lru_cache(None)
def _bandwidth_lib():
    import ctypes
    d = Path(temp_dir("cuvil-bw-"))
    (d / "bw.c").write_text(BANDWIDTH_C)
    subprocess.run(["gcc", "-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC", str(d / "bw.c"),
                    "-o", str(d / "bw.so")], check=True)
    lib = ctypes.CDLL(str(d / "bw.so"))
    lib.cuvil_bw_sum.restype = ctypes.c_float
    lib.cuvil_bw_sum.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


# (streams per thread, software prefetch): the access patterns the probe tries
BANDWIDTH_PATTERNS = ((1, 1), (1, 0), (4, 0), (8, 0), (6, 2), (1, 2))


@functools.lru_cache(None)
def _probe_buffer():
    return np.ones(1 << 28, np.float32)


def memory_bandwidth(threads, rounds=3):
    """Read bandwidth (bytes/s): vectorized OpenMP sums over 1 GiB in each pattern of
    BANDWIDTH_PATTERNS, `rounds` rounds interleaved; the best reading."""
    lib, a = _bandwidth_lib(), _probe_buffer()
    lib.cuvil_bw_sum(a.ctypes.data, a.size, threads, 1, 0)
    best = 0.0
    for _ in range(rounds):
        for streams, prefetch in BANDWIDTH_PATTERNS:
            t = time.perf_counter()
            lib.cuvil_bw_sum(a.ctypes.data, a.size, threads, streams, prefetch)
            best = max(best, a.nbytes / (time.perf_counter() - t))
    return best


DECODE_CHUNKS = 4


def timed_decode(step, new_tokens, threads, bytes_per_token):
    """Greedy decode of new_tokens in DECODE_CHUNKS chunks, a bandwidth probe right before each: this
    machine's bandwidth drifts by 2x within minutes, so each chunk is set against its own probe.
    Returns tokens/s over all chunks, the median per-chunk fraction of the roofline, the median probe."""
    tok, total, fractions, probes = 1, 0.0, [], []
    per = max(1, new_tokens // DECODE_CHUNKS)
    for c in range(DECODE_CHUNKS):
        n = per if c < DECODE_CHUNKS - 1 else new_tokens - per * (DECODE_CHUNKS - 1)
        bw = memory_bandwidth(threads, rounds=1)
        t = time.perf_counter()
        for _ in range(n):
            tok = step(tok)
        dt = time.perf_counter() - t
        total += dt
        probes.append(bw)
        fractions.append(n / dt * bytes_per_token / bw)
    return {"decode_tps": new_tokens / total, "roofline_fraction": statistics.median(fractions),
            "bandwidth_gbs": statistics.median(probes) / 1e9}


def bench_cuvil(ckpt, precision, threads, prompt, new_tokens, bytes_per_token):
    import cuvil.llm
    llm = cuvil.llm.from_transformers(ckpt, precision=precision, max_seq_len=512, num_threads=threads,
                                      measure_error=False)
    llm.prefill(prompt[:8])
    pre = []
    for _ in range(3):
        t = time.perf_counter()
        llm.prefill(prompt)
        pre.append(time.perf_counter() - t)
    ttft = []
    for _ in range(3):
        t = time.perf_counter()
        llm.prefill(prompt[:32])
        ttft.append(time.perf_counter() - t)
    llm.prefill(prompt)
    dec = timed_decode(lambda tok: int(llm.decode([tok])[0].argmax()), new_tokens, threads, bytes_per_token)
    return {"prefill_ms": 1000 * statistics.median(pre), "ttft32_ms": 1000 * statistics.median(ttft),
            "path": str(llm.path), **dec}


def prefill_ab(ckpt, threads, prompt, rounds=7, precisions=("fp32", "int4")):
    """Prefill of the same prompt by transformers eager and by cuvil at each precision, interleaved
    round by round (median ms): the rows of the main table are measured minutes apart, and this
    machine drifts by more than the differences asked about (fp32 / eager, int4 / fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    import cuvil.llm
    torch.set_num_threads(threads)
    eager = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    llms = {p: cuvil.llm.from_transformers(ckpt, precision=p, max_seq_len=512, num_threads=threads,
                                           measure_error=False) for p in precisions}

    def run_eager():
        with torch.no_grad():
            eager(ids, use_cache=True)
    runs = {"eager": run_eager, **{p: (lambda llm: lambda: llm.prefill(prompt))(llm) for p, llm in llms.items()}}
    for fn in runs.values():
        fn()
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            time.sleep(0.2)
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    out = {name: 1000 * statistics.median(v) for name, v in times.items()}
    print(f"[{threads}t] prefill 128, interleaved: " + ", ".join(f"{p} {ms:.0f} ms" for p, ms in out.items()), flush=True)
    return out


def bench_eager(ckpt, threads, prompt, new_tokens):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    m = AutoModelForCausalLM.from_pretrained(str(ckpt), torch_dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        m(ids[:, :8])
        pre = []
        for _ in range(2):
            t = time.perf_counter()
            out = m(ids, use_cache=True)
            pre.append(time.perf_counter() - t)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t = time.perf_counter()
        for _ in range(new_tokens):
            out = m(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        dec = new_tokens / (time.perf_counter() - t)
    return {"prefill_ms": 1000 * statistics.median(pre), "decode_tps": dec}


LLAMACPP_TYPES = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}     # cuvil precision -> the GGUF type it faces


def llamacpp_features():
    """The CPU features llama.cpp was built with ("AVX2, AVX512, ..., REPACK"), or None when it is missing."""
    try:
        import llama_cpp
    except ImportError:
        return None
    info = llama_cpp.llama_print_system_info().decode()
    return ", ".join(k.strip() for k, v in (f.split("=") for f in info.split(":", 1)[-1].split("|") if "=" in f)
                     if v.strip() == "1" and k.strip() not in ("SSE3", "SSSE3", "AVX", "F16C", "FMA", "BMI2"))


def _llamacpp_model(llama_cpp, ckpt, qtype, threads, n_batch):
    from benchmarks.gguf_export import export
    path = OUT / f"{ckpt.name}-{qtype}.gguf"
    if not path.exists():
        export(ckpt, path, qtype, progress=lambda *_: None)
    return llama_cpp.Llama(str(path), n_ctx=512, n_batch=n_batch, n_threads=threads, n_threads_batch=threads,
                           verbose=False, logits_all=False)


def _llamacpp_step(m, tok):
    m.eval([tok])
    return int(np.argmax(np.ctypeslib.as_array(m._ctx.get_logits(), shape=(m.n_vocab(),))))


def decode_ab(ckpt, threads, prompt, precision, rounds=8, chunk=12, group=64):
    """Decode by cuvil and by llama.cpp on the same weights, interleaved chunk by chunk after the same
    prompt (so both decode at the same context lengths): tokens/s per chunk, the medians, and the
    median of the per-round ratios. The main table's rows run minutes apart, and this machine's
    bandwidth drifts by more than the ratios asked about."""
    import llama_cpp

    import cuvil.llm
    llm = cuvil.llm.from_transformers(ckpt, precision=precision, max_seq_len=512, num_threads=threads,
                                      measure_error=False, group=group)
    m = _llamacpp_model(llama_cpp, ckpt, LLAMACPP_TYPES[precision], threads, len(prompt))
    steps = {"cuvil": lambda tok: int(llm.decode([tok])[0].argmax()), "llama.cpp": lambda tok: _llamacpp_step(m, tok)}
    llm.prefill(prompt)
    m.reset()
    m.eval(prompt)
    tps = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            tok = 1
            t = time.perf_counter()
            for _ in range(chunk):
                tok = step(tok)
            tps[name].append(chunk / (time.perf_counter() - t))
    out = {name: statistics.median(v) for name, v in tps.items()}
    out["ratio"] = statistics.median(a / b for a, b in zip(tps["cuvil"], tps["llama.cpp"]))
    out["rounds"], out["chunk"] = rounds, chunk
    print(f"[{threads}t] decode {precision} vs llama.cpp {LLAMACPP_TYPES[precision]}, interleaved: cuvil "
          f"{out['cuvil']:.2f} tok/s, llama.cpp {out['llama.cpp']:.2f}, ratio {out['ratio']:.2f}x", flush=True)
    del llm, m
    return out


def bench_llamacpp(ckpt, qtype, threads, prompt, new_tokens, bytes_per_token):
    """llama.cpp (llama-cpp-python) on a GGUF of the same weights: same prompt, greedy decode."""
    try:
        import llama_cpp
    except ImportError:
        return None
    m = _llamacpp_model(llama_cpp, ckpt, qtype, threads, len(prompt))
    m.reset()
    m.eval(prompt[:8])
    pre = []
    for _ in range(3):
        m.reset()
        t = time.perf_counter()
        m.eval(prompt)
        pre.append(time.perf_counter() - t)
    ttft = []
    for _ in range(3):
        m.reset()
        t = time.perf_counter()
        m.eval(prompt[:32])
        ttft.append(time.perf_counter() - t)
    m.reset()
    m.eval(prompt)

    dec = timed_decode(lambda tok: _llamacpp_step(m, tok), new_tokens, threads, bytes_per_token)
    return {"prefill_ms": 1000 * statistics.median(pre), "ttft32_ms": 1000 * statistics.median(ttft), **dec}


def rss_of_loaded(path, threads):
    code = (f"import cuvil.llm; m = cuvil.llm.load({str(path)!r}, num_threads={threads}); m.prefill([1, 2, 3]); "
            "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return int(r.stdout.strip()) / 1024 if r.returncode == 0 else float("nan")


def _save(output, results):
    """Results into `output`, and into benchmarks/README.md when that is the main results file (a run to
    another file is a side experiment)."""
    Path(output).write_text(json.dumps(results, indent=1))
    if Path(output) == OUT / "llm.json":
        write_section(Path(__file__).resolve().parent / "README.md", results, results.get("command", "python -m benchmarks.llm"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precisions", default="fp32,bf16,int8,int4")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--small", action="store_true", help="a 4-layer model of the same family (quick check)")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--output", default=str(OUT / "llm.json"))
    ap.add_argument("--render", action="store_true", help="rewrite the README section from --output's JSON only")
    ap.add_argument("--decode-ab", action="store_true",
                    help="only time decode against llama.cpp (int8, int4), interleaved chunk by chunk, into --output's "
                         "JSON and the README")
    ap.add_argument("--group", type=int, default=64,
                    help="int4 group size for --decode-ab (32: the bits per weight of llama.cpp's Q4_0)")
    ap.add_argument("--prefill-ab", action="store_true",
                    help="only time fp32 against int4 prefill, interleaved, into --output's JSON and the README")
    a = ap.parse_args(argv)
    if a.prefill_ab:
        results = json.loads(Path(a.output).read_text())
        shape = SMALL if a.small else TINYLLAMA
        ckpt = make_checkpoint(shape, "llama-small" if a.small else "tinyllama-shape")
        prompt = np.random.default_rng(0).integers(100, 30000, 128).tolist()
        results["prefill_ab"] = {t: prefill_ab(ckpt, int(t), prompt) for t in a.threads.split(",")}
        _save(a.output, results)
        return
    if a.decode_ab:
        results = json.loads(Path(a.output).read_text())
        ckpt = make_checkpoint(SMALL if a.small else TINYLLAMA, "llama-small" if a.small else "tinyllama-shape")
        prompt = np.random.default_rng(0).integers(100, 30000, 128).tolist()
        precisions = [p for p in a.precisions.split(",") if p in LLAMACPP_TYPES]
        ab = results.setdefault("decode_ab", {})
        for t in a.threads.split(","):
            for p in precisions:       # int4 at another group size is a row of its own
                label = p if p != "int4" or a.group == 64 else f"int4 group {a.group}"
                ab.setdefault(t, {})[label] = decode_ab(ckpt, int(t), prompt, p, group=a.group)
        _save(a.output, results)
        return
    if a.render:
        results = json.loads(Path(a.output).read_text())
        write_section(Path(__file__).resolve().parent / "README.md", results, results.get("command", "python -m benchmarks.llm"))
        return
    shape = SMALL if a.small else TINYLLAMA
    ckpt = make_checkpoint(shape, "llama-small" if a.small else "tinyllama-shape")
    prompt = np.random.default_rng(0).integers(100, 30000, 128).tolist()
    results = {"shape": shape, "machine": None, "rows": []}
    from benchmarks.timing import machine_line
    results["machine"] = machine_line()
    results["llamacpp_features"] = llamacpp_features()
    for threads in [int(t) for t in a.threads.split(",")]:
        print(f"[{threads}t] read bandwidth {memory_bandwidth(threads) / 1e9:.1f} GB/s", flush=True)
        if not a.no_eager:
            e = bench_eager(ckpt, threads, prompt, a.new_tokens)
            print(f"[{threads}t] transformers eager: prefill {e['prefill_ms']:.0f} ms, decode {e['decode_tps']:.2f} tok/s",
                  flush=True)
            results["rows"].append({"system": "transformers eager", "threads": threads, **e})
        for p in a.precisions.split(","):
            nbytes = weight_bytes_per_token(shape, p)
            r = bench_cuvil(ckpt, p, threads, prompt, a.new_tokens, nbytes)
            r.update(system=f"cuvil {p}", precision=p, threads=threads)
            if p == "int4":
                r["rss_mib"] = rss_of_loaded(r["path"], threads)
            print(f"[{threads}t] cuvil {p}: prefill {r['prefill_ms']:.0f} ms, decode {r['decode_tps']:.2f} tok/s "
                  f"({100 * r['roofline_fraction']:.0f}% of roofline at {r['bandwidth_gbs']:.1f} GB/s), "
                  f"ttft(32) {r['ttft32_ms']:.0f} ms", flush=True)
            results["rows"].append(r)
            if p in LLAMACPP_TYPES and not a.no_llamacpp:
                q = LLAMACPP_TYPES[p]
                lc = bench_llamacpp(ckpt, q, threads, prompt, a.new_tokens, nbytes)
                if lc is None:
                    print("llama-cpp-python is not installed: no llama.cpp rows", flush=True)
                    a.no_llamacpp = True
                    continue
                lc.update(system=f"llama.cpp {q.upper()}", precision=p, threads=threads)
                print(f"[{threads}t] llama.cpp {q}: prefill {lc['prefill_ms']:.0f} ms, decode {lc['decode_tps']:.2f} "
                      f"tok/s ({100 * lc['roofline_fraction']:.0f}% of roofline), ttft(32) {lc['ttft32_ms']:.0f} ms; "
                      f"cuvil/llama.cpp decode {r['decode_tps'] / lc['decode_tps']:.2f}x", flush=True)
                results["rows"].append(lc)
    OUT.mkdir(exist_ok=True)
    command = " ".join(["python -m benchmarks.llm"] + (argv if argv is not None else sys.argv[1:]))
    results["command"] = command
    Path(a.output).write_text(json.dumps(results, indent=1))
    print(f"wrote {a.output}")
    if Path(a.output) == OUT / "llm.json":          # a run to another file is a side experiment
        write_section(Path(__file__).resolve().parent / "README.md", results, command)


MARK_BEGIN, MARK_END = "<!-- llm results -->", "<!-- /llm results -->"


def write_section(readme: Path, results, command):
    """The LLM table, between markers in benchmarks/README.md (benchmarks.run keeps it)."""
    shape = results["shape"]
    lines = [MARK_BEGIN, "## LLM: TinyLlama-1.1B shape, random weights" if shape == TINYLLAMA else "## LLM (small shape)",
             "", "```", command, "```", "", f"Machine: {results['machine']}", "",
             "Prefill: 128 prompt tokens (median of 3). Decode: tokens/s over the new tokens, greedy, batch 1. "
             "% of roofline: decode runs in 4 chunks with a read-bandwidth probe (the best of single- and "
             "multi-stream sums over 1 GiB) right before each; each chunk's weight bytes per second over its probe, "
             "median of the 4 (the probe's median in brackets): this machine's bandwidth drifts 2x within minutes. llama.cpp: llama-cpp-python 0.3.36 "
             f"(built from source with {results.get('llamacpp_features') or 'its native CPU features'}) on GGUF F32/Q8_0/Q4_0 exports of the same checkpoint "
             "(benchmarks/gguf_export.py), run right after the cuvil row it faces; its % of roofline uses cuvil's "
             "bytes per token (Q8_0 and Q4_0 carry 8.5 and 4.5 bits per weight; cuvil int8 8 plus a float scale per "
             "column, int4 4.25 at group 64: float16 scales).", "",
             "| threads | system | prefill 128 (ms) | decode (tok/s) | % of roofline (bandwidth) | TTFT 32 tok (ms) | RSS (MiB) |",
             "|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        roof = (f"{100 * r['roofline_fraction']:.0f}% ({r['bandwidth_gbs']:.1f} GB/s)" if "roofline_fraction" in r
                else "—")
        ttft = f"{r['ttft32_ms']:.0f}" if "ttft32_ms" in r else "—"
        rss = f"{r['rss_mib']:.0f}" if "rss_mib" in r else "—"
        lines.append(f"| {r['threads']} | {r['system']} | {r['prefill_ms']:.0f} | {r['decode_tps']:.2f} | {roof} | "
                     f"{ttft} | {rss} |")
    for threads, ms in results.get("prefill_ab", {}).items():
        ratios = [f"{a} / {b} = {ms[a] / ms[b]:.2f}" for a, b in (("fp32", "eager"), ("int4", "fp32")) if a in ms and b in ms]
        lines += ["", f"Prefill of the 128-token prompt at {threads} thread(s), transformers eager and cuvil's precisions "
                  f"interleaved round by round (`python -m benchmarks.llm --prefill-ab`, median of 7): "
                  + ", ".join(f"{p} {v:.0f} ms" for p, v in ms.items()) + (f" ({', '.join(ratios)})" if ratios else "") + "."]
    ab = results.get("decode_ab", {})
    if ab:
        lines += ["", "Decode against llama.cpp on the same weights, interleaved chunk by chunk after the same prompt "
                  "(`python -m benchmarks.llm --decode-ab --precisions fp32,int8,int4`, then `--precisions int4 --group 32`, "
                  "whose 4.5 bits per weight are Q4_0's; rounds of 12 tokens each, medians; "
                  "ratio: median of the per-round ratios):", "",
                  "| threads | cuvil | tok/s | llama.cpp | tok/s | ratio |", "|---|---|---|---|---|---|"]
        for threads, per in ab.items():
            for p, r in per.items():
                lines.append(f"| {threads} | {p} | {r['cuvil']:.2f} | {LLAMACPP_TYPES[p.split()[0]].upper()} | {r['llama.cpp']:.2f} | "
                             f"{r['ratio']:.2f}x |")
    big = OUT / "llm8b.json"
    if big.exists():
        b = json.loads(big.read_text())
        lines += ["", "Llama-3-8B shape (`python -m benchmarks.llm_8b`: random bf16 checkpoint, 32 layers, hidden 4096, "
                  "vocab 128256), built and run on this 24 GiB machine:", "",
                  "| precision | threads | build (s) | build peak RSS (MiB) | artifact (GiB) | loaded RSS (MiB) | "
                  "TTFT 32 tok (ms) | decode (tok/s) |", "|---|---|---|---|---|---|---|---|",
                  f"| {b['precision']} | {b['threads']} | {b['build_s']:.0f} | {b['build_peak_rss_mib']:.0f} | "
                  f"{b['artifact_gib']:.2f} | {b['loaded_rss_mib']:.0f} | {b['ttft32_ms']:.0f} | {b['decode_tps']:.2f} |"]
    lines.append(MARK_END)
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    if MARK_BEGIN in text:
        head, rest = text.split(MARK_BEGIN, 1)
        text = head + "\n".join(lines) + rest.split(MARK_END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + "\n".join(lines) + "\n"
    readme.write_text(text)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
