"""int8 CNNs (issue "Precision for every model"): cuvil int8 (each image's own range, and ranges
calibrated on the same images ONNX Runtime calibrates on) against cuvil fp32, ONNX Runtime on
quantize_static's QDQ model of the same network (per-channel int8 weights, uint8 activations, min/max
calibration) and OpenVINO on that QDQ model, in one interleaved run per network and thread count.
Medians; the error columns are max |error| / max |output| against fp32 eager on the example input.

    python -m benchmarks.int8_cnn [--threads 1 2] [--rounds 10] [--set issue|vision|all] [--only NAME ...]
                                  [--target x86_64-avx2]

`--set vision` runs the other vision networks of benchmarks.cnn (issue 44's and the wider set's).

--target builds cuvil for another target this CPU runs (an AVX2 build on an AVX-512 host: int8 on
vpmaddubsw); ONNX Runtime and OpenVINO pick their kernels from the CPU, so they are left out then."""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from benchmarks import precision
from benchmarks.cnn_models import CNNS
from benchmarks.cnn_wide import with_vision_set
from benchmarks.scratch import temp_dir
from benchmarks.systems import export_onnx
from benchmarks.timing import interleaved, machine_line

# the issue's two networks, and three it did not name (SE blocks with SiLU / hardswish; channels that fill
# no block: ShuffleNet's)
ISSUE_TABLE = {name: CNNS[name] for name in ("ResNet-50", "MobileNetV2", "EfficientNet-B0", "MobileNetV3-ish",
                                             "ShuffleNetV2-ish")}
WORKLOADS, SETS = with_vision_set(ISSUE_TABLE)
CALIBRATION_IMAGES = 8


def _qdq_model(model, args, calibration):
    """quantize_static's QDQ model of the network (path), or None without onnxruntime."""
    try:
        from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quant_pre_process,
                                              quantize_static)
    except ImportError:
        return None
    path, _ = export_onnx(model, args)
    d = temp_dir("cuvil-bench-qdq-")
    pre, qpath = os.path.join(d, "pre.onnx"), os.path.join(d, "model.qdq.onnx")
    quant_pre_process(path, pre)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"input0": x.numpy()} for x in calibration])

        def get_next(self):
            return next(self.items, None)
    quantize_static(pre, qpath, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return qpath


def _ort(qpath, args, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(qpath, so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: args[0].numpy()}
    return lambda: sess.run(None, feed)


def _openvino(qpath, args, threads):
    try:
        import openvino as ov
    except ImportError:
        return None
    compiled = ov.Core().compile_model(qpath, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
    req = compiled.create_infer_request()
    feed = [args[0].numpy()]
    return lambda: req.infer(feed)


def _rel(want, got):
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    return float(np.abs(got - want).max() / np.abs(want).max())


def _cuvil(model, args, threads, precision_, calibration=None, target="native"):
    import cuvil
    cm = cuvil.compile(model, args, precision=precision_, num_threads=threads, calibration_data=calibration,
                       cache_dir=temp_dir("cuvil-bench-cache-"), target=target)
    x = args[0].numpy()
    outs = [np.empty(o.shape, o.dtype) for o in cm.run(x)]
    return (lambda: cm.run(x, out=outs)), cm


def run(names, thread_counts, rounds, target="native", peers=("ort", "openvino")):
    print(machine_line() + ("" if target == "native" else f"; cuvil built for {target}"))
    print("| network | threads | cuvil fp32 ms | cuvil int8 ms | int8 / fp32 | int8 calibrated ms | ORT QDQ ms | "
          "OpenVINO QDQ ms | cuvil int8 / best peer | calibrated / best peer | rel err: cuvil int8, calibrated, ORT QDQ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, model, args in precision.table_models(names, WORKLOADS):
        torch.manual_seed(1)
        calibration = [torch.randn(*args[0].shape) for _ in range(CALIBRATION_IMAGES)]
        with torch.no_grad():
            want = model(*args).numpy()
        try:
            qpath = _qdq_model(model, args, calibration) if target == "native" else None
        except Exception as e:      # a peer's failure (its export or quantization) costs its cells, not the table
            print(f"(no QDQ model of {name}: {type(e).__name__}: {str(e)[:80]})", flush=True)
            qpath = None
        for threads in thread_counts:
            fns, errs = {}, {}
            fns["fp32"], _ = _cuvil(model, args, threads, "fp32", target=target)
            fns["int8"], cm = _cuvil(model, args, threads, "int8", target=target)
            fns["int8 cal"], cmc = _cuvil(model, args, threads, "int8", calibration, target=target)
            errs["int8"], errs["int8 cal"] = _rel(want, cm.run(args[0].numpy())), _rel(want, cmc.run(args[0].numpy()))
            ran = []                # the peers that run this model (`peers`: those asked for)
            if qpath:
                if "ort" in peers:
                    fns["ort"] = _ort(qpath, args, threads)
                    errs["ort"] = _rel(want, fns["ort"]())
                    ran.append("ort")
                ov = _openvino(qpath, args, threads) if "openvino" in peers else None
                if ov:
                    fns["openvino"] = ov
                    ran.append("openvino")
            t = interleaved(fns, rounds=rounds)
            best = min(t[p] for p in ran) if ran else None
            ms = {k: f"{1000 * v:.2f}" for k, v in t.items()}
            over_best = lambda v: f"{v / best:.2f}x" if best else "-"    # noqa: E731  (no peer ran: no ratio)
            print(f"| {name} | {threads} | {ms['fp32']} | {ms['int8']} | {t['int8'] / t['fp32']:.2f}x | {ms['int8 cal']} | "
                  f"{ms.get('ort', 'n/a')} | {ms.get('openvino', 'n/a')} | {over_best(t['int8'])} | "
                  f"{over_best(t['int8 cal'])} | "
                  f"{errs['int8']:.3g}, {errs['int8 cal']:.3g}, {errs.get('ort', float('nan')):.3g} |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--set", choices=list(SETS), default="issue", help="a named group of networks")
    ap.add_argument("--only", nargs="+", choices=list(WORKLOADS), help="these networks instead of --set's")
    ap.add_argument("--target", default="native")
    ap.add_argument("--peers", default="ort,openvino",
                    help="which peers run the QDQ model (OpenVINO 2026.4 segfaults on DenseNet-121-ish's: ort alone)")
    a = ap.parse_args(argv)
    run(a.only or SETS[a.set], a.threads, a.rounds, a.target, tuple(a.peers.split(",")))


if __name__ == "__main__":
    main()
