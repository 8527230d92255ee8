"""KV cache precision: fp16 (kv_cache="fp16") against fp32, a Llama-family model decoding at long
contexts. Reports the cache's bytes (what fp16 is for: twice the sequences or the context in the same
memory), the decode step time at each context length (fp16 / fp32, interleaved round by round,
median), and the error the compile measured against fp32 (top-1 agreement, mean KL).

    python -m benchmarks.kv_cache [--shape small|tinyllama] [--precision int4] [--contexts 256,1024,1792]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.llm import SMALL, TINYLLAMA, make_checkpoint
from benchmarks.timing import machine_line


def decode_ms(llm, context, steps):
    """Median ms of one decode step after a prompt of `context` tokens."""
    rng = np.random.default_rng(context)
    llm.reset()
    llm.prefill(rng.integers(0, llm.meta["vocab"], context).tolist())
    times = []
    for k in range(steps):
        t = time.perf_counter()
        llm.decode([int(rng.integers(0, llm.meta["vocab"]))])
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    import cuvil.llm
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=["small", "tinyllama"], default="small")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--contexts", default="256,1024,1792")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    shape = SMALL if a.shape == "small" else TINYLLAMA
    ckpt = make_checkpoint(shape, "llm-small" if a.shape == "small" else "llm-tinyllama")
    llms = {kv: cuvil.llm.from_transformers(ckpt, precision=a.precision, max_seq_len=2048, num_threads=a.threads,
                                            kv_cache=kv, error_prompts=None) for kv in ("fp32", "fp16")}
    contexts = [int(c) for c in a.contexts.split(",")]
    times = {(kv, c): [] for kv in llms for c in contexts}
    for _ in range(a.rounds):
        for c in contexts:
            for kv, llm in llms.items():
                times[kv, c].append(decode_ms(llm, c, a.steps))
    print(machine_line())
    print(f"`python -m benchmarks.kv_cache --shape {a.shape} --precision {a.precision} --contexts {a.contexts} "
          f"--rounds {a.rounds} --threads {a.threads}`\n")
    print(f"KV cache bytes (K and V, max_seq_len 2048): fp32 {llms['fp32'].k_cache.nbytes * 2 / 2**20:.0f} MiB, "
          f"fp16 {llms['fp16'].k_cache.nbytes * 2 / 2**20:.0f} MiB")
    for kv, llm in llms.items():          # measured by the compile against the fp32 transformers model
        e = llm.meta.get("error", {})
        print(f"{a.precision} weights, {kv} KV cache vs transformers fp32: top-1 agreement "
              f"{e.get('top1_agreement', float('nan')):.3f}, mean KL {e.get('kl_mean', float('nan')):.3g}")
    print()
    print("| context | fp32 KV decode (ms) | fp16 KV decode (ms) | fp16 / fp32 |")
    print("|---|---|---|---|")
    for c in contexts:
        f32, f16 = (statistics.median(times[kv, c]) for kv in ("fp32", "fp16"))
        print(f"| {c} | {f32:.2f} | {f16:.2f} | {f16 / f32:.2f} |")


if __name__ == "__main__":
    main()
