"""Old against new: the artifacts of one workload built from different trees, run interleaved in one
process, so the host's drift hits them alike (how this project measures a kernel change).

    python -m benchmarks.ab --save ResNet-50 /tmp/r50_new          # build the current tree's artifact
    git stash; python -m benchmarks.ab --save ResNet-50 /tmp/r50_old; git stash pop
    python -m benchmarks.ab ResNet-50 /tmp/r50_old /tmp/r50_new --threads 1

Each round runs every artifact for a burst of `--burst` seconds, in alternating order; the medians of
the rounds and their ratios to the first artifact are printed, after the largest output difference
from the first artifact's.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from benchmarks.workloads import WORKLOADS


def save(workload: str, path: str):
    import cuvil
    model, inputs = WORKLOADS[workload]()
    cuvil.compile(model, inputs, num_threads=1, cache_dir=tempfile.mkdtemp()).save(path)
    print(f"saved {workload} to {path}")


def compare(workload: str, paths: list, threads: int, rounds: int, burst: float):
    import cuvil
    _, inputs = WORKLOADS[workload]()
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
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("paths", nargs="+", help="artifact directories (with --save: the one to write)")
    ap.add_argument("--save", action="store_true", help="compile the workload with this tree and save it")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--burst", type=float, default=0.25)
    a = ap.parse_args(argv)
    if a.save:
        save(a.workload, a.paths[0])
    else:
        compare(a.workload, a.paths, a.threads, a.rounds, a.burst)


if __name__ == "__main__":
    main()
