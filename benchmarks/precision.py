"""Lower precisions for general models (issue "Precision for every model"): cuvil bf16 / fp16 / int8
against cuvil fp32, and int8 against ONNX Runtime's quantize_dynamic of the same network, in one
interleaved run per workload and thread count. Medians; ratios are against cuvil fp32 and ORT int8
measured in the same rounds.

    python -m benchmarks.precision [--threads 1 2] [--rounds 15] [--only NAME ...]

The error columns are cuvil's own accuracy report (max |error| / output scale, worst and mean row
cosine) on the workload's inputs; MiniLM's inputs are padded to 128 tokens, and the worst rows are
padded positions."""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from benchmarks import workloads
from benchmarks.scratch import temp_dir
from benchmarks.systems import export_onnx
from benchmarks.timing import interleaved, machine_line

WORKLOADS = {
    "MLP b1": workloads.mlp(1), "MLP b64": workloads.mlp(64),
    "MiniLM b1 s128": workloads.minilm(1), "MiniLM b32 s128": workloads.minilm(32),
    "BERT-base s128": workloads.bert_base,
}
PRECISIONS = ("fp32", "bf16", "fp16", "int8")


class _LastHidden(torch.nn.Module):
    """transformers models return a ModelOutput: one tensor out for every system alike."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *args):
        out = self.m(*args)
        return out if isinstance(out, torch.Tensor) else out[0]


def table_models(names, workloads, wrap=lambda name: True):
    """(name, model, args) per workload, the model wrapped to return one tensor where wrap(name); every
    model kept alive while the table runs (export_onnx caches by id(model): none may be freed and its id
    reused)."""
    keep = []
    for name in names:
        model, args = workloads[name]()
        model = _LastHidden(model).eval() if wrap(name) else model
        keep.append(model)
        yield name, model, args


def _ort_int8(model, args, threads):
    """ONNX Runtime on quantize_dynamic's model (int8 weights, per-tensor uint8 activations): a call, or
    the reason there is none (onnxruntime not installed, the export or quantization failed), so one peer's
    failure costs its cells, not the table."""
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        return "no onnxruntime"
    try:
        path, _ = export_onnx(model, args)
        qpath = os.path.join(temp_dir("cuvil-bench-q-"), "model.int8.onnx")
        quantize_dynamic(path, qpath, weight_type=QuantType.QInt8)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(qpath, so, providers=["CPUExecutionProvider"])
    except Exception as e:           # a peer's failure is a cell of the table, not the end of it
        return f"{type(e).__name__}: {str(e)[:60]}"
    feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    return lambda: sess.run(None, feed)


def compiled_runs(model, args, precisions, threads):
    """({precision: a call running cuvil's artifact at it into preallocated outputs}, {precision: the
    CompiledModel}), compiled into one fresh cache."""
    import cuvil
    cache = temp_dir("cuvil-bench-cache-")
    arrays = [a.numpy() for a in args]
    fns, compiled = {}, {}
    for p in precisions:
        cm = compiled[p] = cuvil.compile(model, args, precision=p, num_threads=threads, cache_dir=cache)
        outs = [np.empty(o.shape, o.dtype) for o in cm.run(*arrays)]
        fns[p] = (lambda cm=cm, outs=outs: cm.run(*arrays, out=outs))
    return fns, compiled


def run(names, thread_counts, rounds):
    print(machine_line())
    print("| workload | threads | fp32 ms | bf16 | fp16 | int8 | ORT int8 ms | int8 / ORT int8 | int8 rel err, row cosine worst / mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, model, args in table_models(names, WORKLOADS):
        for threads in thread_counts:
            fns, compiled = compiled_runs(model, args, PRECISIONS, threads)
            errs = {p: cm.accuracy["outputs"][0] for p, cm in compiled.items() if cm.accuracy}
            ort = _ort_int8(model, args, threads)
            if callable(ort):
                fns["ort int8"] = ort
            t = interleaved(fns, rounds=rounds)
            ratio = {p: t[p] / t["fp32"] for p in PRECISIONS}
            vs_ort = f"{t['int8'] / t['ort int8']:.2f}x" if callable(ort) else f"n/a ({ort})"
            ort_ms = f"{1000 * t['ort int8']:.2f}" if callable(ort) else "n/a"
            e = errs["int8"]
            print(f"| {name} | {threads} | {1000 * t['fp32']:.2f} | {ratio['bf16']:.2f}x | {ratio['fp16']:.2f}x | "
                  f"{ratio['int8']:.2f}x | {ort_ms} | {vs_ort} | {e['rel']:.3g}, {e['cosine']:.4f} / {e['mean_cosine']:.5f} |", flush=True)


def main(argv=None, table=None, workloads=WORKLOADS, rounds=15, doc=__doc__, sets=None):
    """The command line of this benchmark, or of another table over named workloads (benchmarks.bf16).
    sets: {name: [workload, ...]} for --set, the first the default; without it, every workload."""
    sets = sets or {"all": list(workloads)}
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--set", choices=list(sets), default=next(iter(sets)), help="a named group of workloads")
    ap.add_argument("--only", nargs="+", choices=list(workloads), help="these workloads instead of --set's")
    a = ap.parse_args(argv)
    (table or run)(a.only or sets[a.set], a.threads, a.rounds)


if __name__ == "__main__":
    main()
