"""A QDQ model's linear layers on its own activation grid (issue "Precision for every model"): a
transformer FFN (768 -> 3072, GELU, -> 768) exported to ONNX and quantized by ONNX Runtime's
quantize_static (per-channel int8 weights, uint8 activations, min / max over 4 batches); cuvil int8 on the
QDQ model (kernels/int8_matmul.c where the CPU has VNNI) against ONNX Runtime on it and cuvil fp32 on the
float model, interleaved; medians in ms.

    python -m benchmarks.qdq_linear [--rows 1 32 128] [--threads 1 2] [--rounds 10]"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.scratch import temp_dir
from benchmarks.timing import interleaved, machine_line


def _qdq(model, rows, path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": torch.randn(rows, 768).numpy()} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)
    fp, qp = f"{path}/f{rows}.onnx", f"{path}/q{rows}.onnx"
    torch.onnx.export(model, (torch.randn(rows, 768),), fp, input_names=["x"], dynamo=False)
    quantize_static(fp, qp, Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    return fp, qp


def run(rows_list, thread_counts, rounds):
    import onnxruntime as ort

    import cuvil
    print(machine_line())
    print("| rows | threads | cuvil int8 (QDQ) ms | ONNX Runtime QDQ ms | cuvil fp32 ms | int8 / ORT | int8 path |")
    print("|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768)).eval()
    work = temp_dir("cuvil-qdq-linear-")
    for rows in rows_list:
        fp, qp = _qdq(model, rows, work)
        x = np.random.default_rng(0).standard_normal((rows, 768)).astype(np.float32)
        for threads in thread_counts:
            q = cuvil.compile(qp, precision="int8", num_threads=threads, cache_dir=temp_dir("cuvil-bench-cache-"))
            f = cuvil.compile(fp, num_threads=threads, cache_dir=temp_dir("cuvil-bench-cache-"))
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            sess = ort.InferenceSession(qp, so)
            t = interleaved({"q": lambda: q.run(x), "ort": lambda: sess.run(None, {"x": x}), "f": lambda: f.run(x)},
                            rounds=rounds)
            path = "model's grid" if "cuvil_matmul_int8" in q.c_source else "dynamic int8 blocks"
            print(f"| {rows} | {threads} | {1e3 * t['q']:.3f} | {1e3 * t['ort']:.3f} | {1e3 * t['f']:.3f} | "
                  f"{t['q'] / t['ort']:.2f}x | {path} |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args(argv)
    run(a.rows, a.threads, a.rounds)


if __name__ == "__main__":
    main()
