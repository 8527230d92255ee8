"""GEMM sweep: cuvil's packed GEMM (weights prepacked) against numpy/OpenBLAS, GFLOP/s."""
from __future__ import annotations


import numpy as np

from benchmarks.timing import interleaved
from benchmarks.scratch import temp_dir

SHAPES = [(m, n, k) for m in (1, 16, 128, 1024) for n in (1024, 4096) for k in (1024, 4096)]


def _graph(M, N, K, w):
    from cuvil.ir.graph import Graph, TensorType, Value
    g = Graph()
    x = Value(TensorType((M, K), "float32"), "x")
    g.inputs = [x]
    g.outputs = [g.add("matmul", [x, g.const(w)])]
    return g


def run(thread_counts):
    from threadpoolctl import threadpool_limits

    from cuvil.driver import Progress, build_graph
    from cuvil.options import make_options
    cache = temp_dir("cuvil-gemm-")
    rows = []
    rng = np.random.default_rng(0)
    for M, N, K in SHAPES:
        x = rng.standard_normal((M, K), dtype=np.float32)
        w = rng.standard_normal((K, N), dtype=np.float32)
        cm = build_graph(_graph(M, N, K, w), make_options(), __import__("pathlib").Path(cache), Progress(False))
        out = [np.empty((M, N), np.float32)]
        res = np.empty((M, N), np.float32)
        for threads in thread_counts:
            cm.set_num_threads(threads)
            with threadpool_limits(threads):
                med = interleaved({"numpy": lambda: np.matmul(x, w, out=res), "cuvil": lambda: cm.run(x, out=out)},
                                  rounds=5, warmup=1, min_seconds=0.5)
            flop = 2.0 * M * N * K
            rows.append((threads, M, N, K, flop / med["numpy"] / 1e9, flop / med["cuvil"] / 1e9))
            print(f"[{threads}t] gemm {M}x{N}x{K}: numpy {rows[-1][4]:.1f} GFLOP/s, cuvil {rows[-1][5]:.1f}", flush=True)
    return rows


if __name__ == "__main__":     # python -m benchmarks.gemm_sweep [--threads 1,2]: the sweep alone
    import argparse
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", default="1,2")
    result = run([int(t) for t in ap.parse_args().threads.split(",")])
    print("| threads | M | N | K | numpy/OpenBLAS | cuvil | ratio |\n|---|---|---|---|---|---|---|")
    for threads, M, N, K, np_g, cv_g in result:
        print(f"| {threads} | {M} | {N} | {K} | {np_g:.1f} | {cv_g:.1f} | {cv_g / np_g:.2f} |")
