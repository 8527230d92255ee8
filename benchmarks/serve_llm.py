"""Continuous batching under concurrent streams: a TinyLlama-1.1B-shaped model (random weights, as
benchmarks.llm builds it) in int4, N concurrent clients each generating 128 new tokens after a
128-token prompt, through cuvil.serve.continuous.ContinuousBatcher (the scheduler behind `cuvil
serve`'s OpenAI APIs, without the HTTP layer: the checkpoint has no tokenizer).

    python -m benchmarks.serve_llm [--clients 1,2,4,8] [--requests-per-client 2] [--threads 2] [--small]

Reports aggregate generated tokens/s, time to first token (p50/p99) and inter-token latency (p50/p99)
per client count, and each count's aggregate against the 1-client one."""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from .llm import SMALL, TINYLLAMA, make_checkpoint
from .scratch import temp_dir
from .timing import machine_line


def run_level(batcher, clients, per_client, prompt_len, new_tokens, vocab):
    rng = np.random.default_rng(clients)
    ttft, itl, counts = [], [], []
    lock = threading.Lock()

    def client(k):
        for _ in range(per_client):
            prompt = rng.integers(3, vocab, prompt_len).tolist()
            t0 = time.perf_counter()
            seq = batcher.submit(prompt, new_tokens, temperature=0.0)
            stamps = [time.perf_counter() for _ in seq]
            with lock:
                ttft.append(stamps[0] - t0)
                itl.extend(np.diff(stamps).tolist())
                counts.append(len(stamps))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    pct = lambda v, q: float(np.percentile(np.array(v) * 1e3, q)) if v else float("nan")  # noqa: E731
    return {"tok_s": sum(counts) / seconds, "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99),
            "itl50": pct(itl, 50), "itl99": pct(itl, 99), "tokens": sum(counts)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill-chunk", type=int, default=64)
    ap.add_argument("--small", action="store_true", help="a 4-layer 512-wide model (a quick check)")
    a = ap.parse_args(argv)
    import cuvil.llm
    from cuvil.serve.continuous import ContinuousBatcher
    levels = [int(c) for c in a.clients.split(",")]
    shape = SMALL if a.small else TINYLLAMA
    ckpt = make_checkpoint(shape, "llama-small" if a.small else "tinyllama-shape")
    llm = cuvil.llm.from_transformers(ckpt, precision=a.precision, max_batch=max(levels),
                                      max_seq_len=a.prompt + a.new_tokens + 8, num_threads=a.threads,
                                      cache_dir=temp_dir("cuvil-bench-serve-llm-"), measure_error=False)
    batcher = ContinuousBatcher(llm, prefill_chunk=a.prefill_chunk)
    try:
        run_level(batcher, 1, 1, 16, 8, shape["vocab_size"])           # warm-up
        results = {c: run_level(batcher, c, a.requests_per_client, a.prompt, a.new_tokens, shape["vocab_size"])
                   for c in levels}
    finally:
        batcher.close()
    base = results[levels[0]]["tok_s"]
    print(f"machine: {machine_line()}")
    print(f"{'TinyLlama-1.1B shape' if not a.small else 'small Llama'} {a.precision}, max_batch {max(levels)}, "
          f"{a.prompt}-token prompts, {a.new_tokens} new tokens, {a.requests_per_client} requests per client, "
          f"{a.threads} threads, prefill chunk {a.prefill_chunk}")
    print("| clients | tokens/s | vs 1 client | TTFT p50 ms | TTFT p99 ms | inter-token p50 ms | inter-token p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for c, r in results.items():
        print(f"| {c} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | {r['ttft50']:.0f} | {r['ttft99']:.0f} | "
              f"{r['itl50']:.1f} | {r['itl99']:.1f} |")
    one = statistics.median([results[levels[0]]["itl50"]])
    print(f"inter-token p99 at {levels[-1]} clients / 1-client median: {results[levels[-1]]['itl99'] / one:.2f}x")


if __name__ == "__main__":
    main()
