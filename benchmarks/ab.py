"""Old against new: the artifacts of one workload built from different trees, run interleaved in one
process, so the host's drift hits them alike (how this project measures a kernel change).

    python -m benchmarks.ab --save ResNet-50 /tmp/r50_new          # build the current tree's artifact
    git stash; python -m benchmarks.ab --save ResNet-50 /tmp/r50_old; git stash pop
    python -m benchmarks.ab ResNet-50 /tmp/r50_old /tmp/r50_new --threads 1

The LLM workload "TinyLlama int4 decode" (a TinyLlama-shaped checkpoint from its config, random weights,
int4) saves a cuvil.llm artifact and compares decode: after the same 128-token prompt, chunks of 12
greedy tokens in turn, tokens/s medians (the first artifact's logits are the reference). With
`--llm-rows 1,8,16` it times steps of that many rows instead (a step of B <= 8 slots x T tokens each, at
position 100, logits of each slot's last token: a decode of 8 sequences is 8, a prefill chunk 64), ms
medians; its
artifacts hold 8 sequences. Copy both artifacts fresh (cp -r) before comparing: a directory written
long before and one just written ran 5-10% apart with the same code (the page cache's pages).

Each round runs every artifact for a burst of `--burst` seconds, in alternating order; the medians of
the rounds and their ratios to the first artifact are printed, after the largest output difference
from the first artifact's.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.cnn_models import CNNS
from benchmarks.cnn_wide import WIDE_CNNS
from benchmarks.workloads import WORKLOADS as _BASE

VISION = {**CNNS, **WIDE_CNNS}
WORKLOADS = {**_BASE, **VISION}


LLM_WORKLOAD = "TinyLlama int4 decode"
LLM_WORKLOADS = {LLM_WORKLOAD: "int4", "TinyLlama int8 decode": "int8"}     # workload -> weight precision


def _built_by():
    """Which checkout compiled it: `python -m` puts the working directory first on sys.path, so a build
    meant for another worktree (PYTHONPATH=/tmp/old) still compiles this folder's cuvil unless run from
    inside that worktree."""
    import cuvil
    return f"(compiled by {Path(cuvil.__file__).resolve().parent.parent})"


def save_llm(path: str, workload: str = LLM_WORKLOAD):
    import cuvil.llm
    from benchmarks.llm import TINYLLAMA, make_checkpoint
    ckpt = make_checkpoint(TINYLLAMA, "tinyllama-shape")
    cuvil.llm.from_transformers(ckpt, precision=LLM_WORKLOADS[workload], max_seq_len=512, max_batch=8, num_threads=1,
                                measure_error=False).save(path)
    print(f"saved {workload} to {path} {_built_by()}")


def compare_llm(paths: list, threads: int, rounds: int, chunk: int = 12):
    import cuvil.llm
    prompt = np.random.default_rng(0).integers(100, 30000, 128).tolist()
    llms = [cuvil.llm.load(p, num_threads=threads) for p in paths]
    logits = [np.asarray(m.prefill(prompt)) for m in llms]
    for p, lg in zip(paths[1:], logits[1:]):
        print(f"{p}: max |prefill logits - first's| {float(np.abs(lg - logits[0]).max()):.3g}")
    tps = [[] for _ in llms]
    for r in range(rounds):
        order = range(len(llms)) if r % 2 else reversed(range(len(llms)))
        for i in order:
            tok, t0 = 1, time.perf_counter()
            for _ in range(chunk):
                tok = int(np.asarray(llms[i].decode([tok]))[-1].argmax())
            tps[i].append(chunk / (time.perf_counter() - t0))
        if len(prompt) + (r + 2) * chunk > 512:        # stay inside max_seq_len: the prompt again
            for m in llms:
                m.prefill(prompt)
    med = [float(np.median(t)) for t in tps]
    print(f"TinyLlama decode, {threads} thread(s), {rounds} rounds: "
          + "  ".join(f"{p} {v:.2f} tok/s ({v / med[0]:.3f}x)" for p, v in zip(paths, med)))


def compare_llm_rows(paths: list, threads: int, rounds: int, rows: list, steps: int = 5):
    """Steps of each row count (B slots x T tokens, B the largest divisor <= 8), artifacts in turn."""
    import cuvil.llm
    llms = [cuvil.llm.load(p, num_threads=threads) for p in paths]
    shape = {r: (b, r // b) for r in rows for b in [max(d for d in range(1, 9) if r % d == 0)]}
    # the logits of each slot's last token, as a decode step (T = 1: every row) and a prompt chunk take them
    run = lambda m, r: m._step_last(np.full(shape[r], 7, np.int64), np.full(shape[r][0], 100, np.int64),  # noqa: E731
                                    np.arange(shape[r][0], dtype=np.int64))
    first = [np.asarray(run(m, max(rows))) for m in llms]
    for p, lg in zip(paths[1:], first[1:]):
        print(f"{p}: max |logits - first's| at {max(rows)} rows {float(np.abs(lg - first[0]).max()):.3g}")
    ms = {}
    for r in range(rounds):
        for n in rows:
            for i in (range(len(llms)) if r % 2 else reversed(range(len(llms)))):
                t0 = time.perf_counter()
                for _ in range(steps):
                    run(llms[i], n)
                ms.setdefault((n, i), []).append((time.perf_counter() - t0) / steps * 1e3)
    for n in rows:
        med = [float(np.median(ms[(n, i)])) for i in range(len(llms))]
        print(f"TinyLlama, {n} rows a step {shape[n]}, {threads} thread(s), {rounds} rounds: "
              + "  ".join(f"{p} {v:.2f} ms ({v / med[0]:.3f}x)" for p, v in zip(paths, med)))


def _build(workload: str, batch: int):
    """The workload's model and inputs; batch: a CNN's images (the other workloads have their own)."""
    if batch == 1:
        return WORKLOADS[workload]()
    if workload not in VISION:
        raise SystemExit(f"--batch takes a CNN workload ({', '.join(VISION)}), not {workload!r}")
    return VISION[workload](batch)


CALIBRATION_IMAGES = 8        # --calibrated: random inputs as benchmarks.int8_cnn calibrates on


def save(workload: str, path: str, target: str = "native", precision: str = "fp32", batch: int = 1,
         calibrated: bool = False):
    import cuvil
    import torch
    model, inputs = _build(workload, batch)
    torch.manual_seed(1)
    calibration = [[torch.randn(*x.shape) for x in inputs] for _ in range(CALIBRATION_IMAGES)] if calibrated else None
    cuvil.compile(model, inputs, num_threads=1, target=target, precision=precision, calibration_data=calibration,
                  cache_dir=tempfile.mkdtemp()).save(path)
    print(f"saved {workload} ({target}, {precision}{', calibrated' if calibrated else ''}) to {path} {_built_by()}")


def compare(workload: str, paths: list, threads: int, rounds: int, burst: float, batch: int = 1):
    import cuvil
    _, inputs = _build(workload, batch)
    x = [a.numpy() for a in inputs]
    models = [cuvil.load(p, num_threads=threads) for p in paths]
    first = models[0].run(*x)
    for p, m in zip(paths[1:], models[1:]):
        diff = max(float(np.abs(a - b).max()) for a, b in zip(m.run(*x), first))
        print(f"{p}: max |output - first's| {diff:.3g}")
    times = [[] for _ in models]
    for r in range(rounds):
        order = range(len(models)) if r % 2 else reversed(range(len(models)))
        for i in order:
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < burst:
                models[i].run(*x)
                n += 1
            times[i].append((time.perf_counter() - t0) / n * 1e3)
    med = [float(np.median(t)) for t in times]
    print(f"{workload}, {threads} thread(s), {rounds} rounds: "
          + "  ".join(f"{p} {v:.2f} ms ({v / med[0]:.3f}x)" for p, v in zip(paths, med)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=sorted(WORKLOADS) + sorted(LLM_WORKLOADS))
    ap.add_argument("paths", nargs="+", help="artifact directories (with --save: the one to write)")
    ap.add_argument("--save", action="store_true", help="compile the workload with this tree and save it")
    ap.add_argument("--target", default="native",
                    help="with --save: the target to build for (x86_64-avx2 measures the AVX2 kernels on a newer x86)")
    ap.add_argument("--precision", default="fp32", help="with --save: compile's precision (int8: dynamic, no calibration)")
    ap.add_argument("--calibrated", action="store_true",
                    help=f"with --save and int8: ranges calibrated on {CALIBRATION_IMAGES} random inputs")
    ap.add_argument("--batch", type=int, default=1, help="a CNN workload's batch (save and compare alike)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--burst", type=float, default=0.25)
    ap.add_argument("--llm-rows", default="", help=f"{LLM_WORKLOAD}: time steps of these row counts (1,8,16)")
    a = ap.parse_args(argv)
    llm = a.workload in LLM_WORKLOADS
    if a.save:
        if llm:
            save_llm(a.paths[0], a.workload)
        else:
            save(a.workload, a.paths[0], a.target, a.precision, a.batch, a.calibrated)
    elif llm and a.llm_rows:
        compare_llm_rows(a.paths, a.threads, a.rounds, [int(r) for r in a.llm_rows.split(",")])
    elif llm:
        compare_llm(a.paths, a.threads, a.rounds)
    else:
        compare(a.workload, a.paths, a.threads, a.rounds, a.burst, a.batch)


if __name__ == "__main__":
    main()
