"""bf16 against OpenVINO's bf16 (issue "Precision for every model"): on a CPU with AVX512-BF16 (or
AMX), cuvil's precision="bf16" multiplies in bf16 (kernels/bf16dot.c: linear layers and channel-blocked
convs other than Winograd's and depthwise) and OpenVINO's default hint there is bf16. Per workload and thread count, interleaved medians of cuvil fp32, cuvil bf16,
OpenVINO f32 and OpenVINO bf16 (INFERENCE_PRECISION_HINT), the ratio cuvil bf16 / OpenVINO bf16, and
cuvil bf16's error against fp32 (its accuracy report: max |error| / output scale, worst row cosine).

    python -m benchmarks.bf16 [--threads 1 2] [--rounds 10] [--set issue|vision|all] [--only MiniLM b1 s128 ...]

`--set vision` runs the vision networks of benchmarks.cnn (issue 44's set and the wider one) instead
of the issue's table; `all` runs both.

On a CPU without bf16 products cuvil's bf16 is bf16 weights widened to fp32 (the table says which
ran: the kernel column)."""
from __future__ import annotations

from benchmarks import workloads
from benchmarks import precision
from benchmarks.cnn_wide import with_vision_set
from benchmarks.precision import compiled_runs
from benchmarks.systems import export_onnx
from benchmarks.timing import interleaved, machine_line

ISSUE_TABLE = {
    "MLP b1": workloads.mlp(1), "MLP b64": workloads.mlp(64),
    "MiniLM b1 s128": workloads.minilm(1), "MiniLM b32 s128": workloads.minilm(32),
    "BERT-base s128": workloads.bert_base, "ResNet-50": workloads.resnet50,
}
WORKLOADS, SETS = with_vision_set(ISSUE_TABLE)


def _openvino(model, args, threads, hint):
    """OpenVINO on the exported model at one precision hint, or None without openvino."""
    try:
        import openvino as ov
    except ImportError:
        return None
    path, _ = export_onnx(model, args)
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": hint,
                                                     "PERFORMANCE_HINT": "LATENCY"})
    req = compiled.create_infer_request()
    feed = [a.numpy() for a in args]
    return lambda: req.infer(feed)


def run(names, thread_counts, rounds):
    print(machine_line())
    print("| workload | threads | cuvil fp32 ms | cuvil bf16 ms | OpenVINO f32 ms | OpenVINO bf16 ms | "
          "cuvil bf16 / OpenVINO bf16 | cuvil bf16 rel err, worst cosine | matmul kernel |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, model, args in precision.table_models(names, WORKLOADS, wrap=lambda name: not name.startswith("MLP")):
        for threads in thread_counts:
            runs, compiled = compiled_runs(model, args, ("fp32", "bf16"), threads)
            fns = {f"cuvil {p}": f for p, f in runs.items()}
            for hint in ("f32", "bf16"):
                f = _openvino(model, args, threads, hint)
                if f:
                    fns[f"ov {hint}"] = f
            t = interleaved(fns, rounds=rounds)
            ms = {k: f"{1000 * v:.2f}" for k, v in t.items()}
            ratio = f"{t['cuvil bf16'] / t['ov bf16']:.2f}x" if "ov bf16" in t else "n/a (no openvino)"
            e = compiled["bf16"].accuracy["outputs"][0]
            src = compiled["bf16"].c_source
            kernel = ", ".join(k for k, call in (("matmuls", "cuvil_sgemm_bf16dot("), ("convs", "cuvil_conv_blocked_bf16("))
                               if call in src)
            kernel = f"bf16 dot: {kernel}" if kernel else "bf16 weights, fp32 math"
            print(f"| {name} | {threads} | {ms['cuvil fp32']} | {ms['cuvil bf16']} | {ms.get('ov f32', 'n/a')} | "
                  f"{ms.get('ov bf16', 'n/a')} | {ratio} | {e['rel']:.3g}, {e['cosine']:.5f} | {kernel} |", flush=True)


def main(argv=None):
    precision.main(argv, table=run, workloads=WORKLOADS, rounds=10, doc=__doc__, sets=SETS)


if __name__ == "__main__":
    main()
