"""Quantized GEMV/GEMM kernels alone: one TinyLlama-sized projection (K 2048, N 5632) at fp32, bf16,
int8 and int4, float activations (dequantize into the fp32 micro-kernel) vs int8 activations
(integer dot products), interleaved, medians; GB/s of weights streamed per call.

    python -m benchmarks.qgemv [--threads 1] [--rows 1]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cuvil.build import cache
from cuvil.driver import Progress, build_graph
from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.ir.ops.llm import act_block
from cuvil.ir import quant as quantize
from cuvil.options import make_options

from .timing import interleaved


def _graph(kind, w, M):
    K, N = w.shape
    g = Graph()
    x = Value(TensorType((M, K), "float32"), "x")
    g.inputs, g.input_names = [x], ["x"]
    if kind == "fp32":
        y, nbytes = g.add("matmul", [x, g.const(w)]), w.nbytes
    elif kind == "bf16":
        q = quantize.to_bf16(w)
        y, nbytes = g.add("matmul_q", [x, g.const(q), None], {"bits": 16}), q.nbytes
    else:
        bits, grp = (8, K) if kind.startswith("int8") else (4, 64)
        q, s = quantize.quantize_int8(w) if bits == 8 else quantize.quantize_int4(w, grp)
        ab = act_block(bits, K, grp) if kind.endswith("dot") else 0
        y = g.add("matmul_q", [x, g.const(q), g.const(s)], {"bits": bits, "group": grp, "act_block": ab})
        nbytes = q.nbytes + s.nbytes
    g.outputs, g.output_names = [y], ["y"]
    return g, nbytes


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--N", type=int, default=5632)
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((a.K, a.N)).astype(np.float32) * 0.02
    x = rng.standard_normal((a.rows, a.K)).astype(np.float32)
    kinds = ["fp32", "bf16", "int8", "int8-dot", "int4", "int4-dot"]
    fns, sizes = {}, {}
    for k in kinds:
        g, sizes[k] = _graph(k, w, a.rows)
        cm = build_graph(g, make_options(num_threads=a.threads), cache.default_dir(), Progress(False))
        fns[k] = (lambda m: (lambda: m.run(x)))(cm)
    ref = x.astype(np.float64) @ w
    times = interleaved(fns, rounds=a.repeat)
    import cuvil
    print(f"M={a.rows} K={a.K} N={a.N} threads={a.threads}, kernels of {Path(cuvil.__file__).resolve().parent.parent}")
    for k in kinds:
        err = np.abs(fns[k]()[0] - ref).max() / np.abs(ref).max()
        t = times[k]
        print(f"{k:9s} {t * 1e3:8.3f} ms  {sizes[k] / t / 1e9:6.1f} GB/s  rel err {err:.2e}")


if __name__ == "__main__":
    main()
