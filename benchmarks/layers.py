"""Where a conv net's time goes, layer by layer, in cuvil, ONNX Runtime and OpenVINO, in one interleaved run.

    python -m benchmarks.layers [--workload ResNet-50] [--threads 1] [--rounds 12]

Workloads: benchmarks/workloads.py's and the CNN set's (benchmarks/cnn_models.py: MobileNetV2 for its
depthwise convs, RegNetY-4GF for its grouped ones). cuvil's per-node counters (compiled with
profile=True) against ONNX Runtime's own profiler and OpenVINO's per-node counters (PERF_COUNT; skipped
where openvino is not installed) on the same exported model. Convolutions are matched
by (in channels per group, out channels, kernel, stride, output size: a depthwise conv's first is 1) and summed
over their repeats; every other node is counted as "other" on every side. The sessions alternate
call by call with a short idle gap before each, so the host's drift hits both alike. The profilers add
their own overhead (ORT's more than cuvil's): read the per-layer ratios, not the totals, as the answer.
"""
from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time

from benchmarks.cnn_models import CNNS
from benchmarks.cnn_wide import WIDE_CNNS
from benchmarks.systems import export_onnx
from benchmarks.workloads import WORKLOADS as _BASE

WORKLOADS = {**_BASE, **CNNS, **WIDE_CNNS}


def _graph_nodes(model, inputs):
    """The nodes of the graph cuvil.compile builds and profiles (the compiled model keeps no graph)."""
    from cuvil import driver
    from cuvil.frontend import torch as torch_frontend
    from cuvil.options import make_options
    graph = torch_frontend.from_exported(torch_frontend.export(model, tuple(inputs), None, None), None)[0]
    return driver.optimize(graph, make_options()).nodes


def _cuvil_layers(nodes, counters, calls):
    layers = collections.defaultdict(float)
    for (_, ns), node in zip(counters, nodes):
        ms = ns / calls / 1e6
        if node.op == "conv":
            w, y = node.inputs[1].shape, node.outputs[0].shape
            layers[(w[1], w[0], w[2], node.attrs["strides"][0], y[2])] += ms
        else:
            layers["other"] += ms
    return layers


def _ort_layers(profile_path, calls):
    layers = collections.defaultdict(float)
    for e in json.load(open(profile_path)):
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        a, ms = e["args"], e["dur"] / calls / 1000
        if a.get("op_name") != "Conv":
            layers["other"] += ms
            continue
        x, w = (list(d.values())[0] for d in a["input_type_shape"][:2])
        y = list(a["output_type_shape"][0].values())[0]
        layers[(w[1], w[0], w[2], x[2] // y[2], y[2])] += ms
    return layers


def _onnx_conv_keys(path):
    """{ONNX node name: the conv's layer key}, shapes from ONNX's shape inference."""
    import onnx
    m = onnx.shape_inference.infer_shapes(onnx.load(path))
    dims = {t.name: list(t.dims) for t in m.graph.initializer}
    for v in (*m.graph.input, *m.graph.value_info, *m.graph.output):
        dims[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
    return {n.name: (dims[n.input[1]][1], dims[n.input[1]][0], dims[n.input[1]][2],
                     dims[n.input[0]][2] // dims[n.output[0]][2], dims[n.output[0]][2])
            for n in m.graph.node if n.op_type == "Conv"}


def _openvino_request(path, threads):
    """An OpenVINO infer request with per-node counters, or None where openvino is not installed or cannot
    convert the model (EfficientNet-B0's pooling)."""
    try:
        import openvino as ov
    except ImportError:
        return None
    try:
        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERF_COUNT": "YES",
                                                         "INFERENCE_PRECISION_HINT": "f32",
                                                         "PERFORMANCE_HINT": "LATENCY"})
    except RuntimeError as e:
        print(f"OpenVINO left out: {str(e).splitlines()[-1] if str(e).strip() else e}")
        return None
    return compiled.create_infer_request()


def _add_openvino_call(layers, request, conv_keys, calls):
    """One call's counters into layers. OpenVINO names a fused conv '<ONNX node>/WithoutBiases'; its
    reorders and other nodes count as "other"."""
    for p in request.get_profiling_info():
        key = conv_keys.get(p.node_name.split("/")[0], "other")
        layers[key] += p.real_time.total_seconds() * 1e3 / calls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="ResNet-50", choices=sorted(WORKLOADS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args(argv)

    import cuvil
    import onnxruntime as ort

    model, inputs = WORKLOADS[args.workload]()
    path, _ = export_onnx(model, inputs)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
    so.enable_profiling = True
    so.profile_file_prefix = tempfile.mkdtemp() + "/ort"
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), inputs)}
    cm = cuvil.compile(model, inputs, num_threads=args.threads, profile=True, cache_dir=tempfile.mkdtemp())
    x = [a.numpy() for a in inputs]
    ov_request, ov_feed = _openvino_request(path, args.threads), list(feed.values())
    conv_keys, vino = _onnx_conv_keys(path), collections.defaultdict(float)

    warm = 3
    for _ in range(warm):
        cm.run(*x)
        sess.run(None, feed)
        if ov_request:
            ov_request.infer(ov_feed)
    cm.module.profile_counters()                # resets them: the warm-up calls are not counted
    for _ in range(args.rounds):
        time.sleep(0.05)
        cm.run(*x)
        time.sleep(0.05)
        sess.run(None, feed)
        if ov_request:
            time.sleep(0.05)
            ov_request.infer(ov_feed)
            _add_openvino_call(vino, ov_request, conv_keys, args.rounds)
    ours = _cuvil_layers(_graph_nodes(model, inputs), cm.module.profile_counters(), args.rounds)
    theirs = _ort_layers(sess.end_profiling(), warm + args.rounds)   # ORT's profile keeps the warm-up calls too
    _print_layers(args, ours, theirs, vino)


def _print_layers(args, ours, ort_layers, ov_layers):
    """One row a layer, the layers where cuvil loses most to the faster peer first."""
    def best(k):
        peers = [t[k] for t in (ort_layers, ov_layers) if k in t]
        return min(peers) if peers else 0.0

    def ratio(a, b):
        return f"{a / b:6.2f}" if b else "     -"

    print(f"{args.workload}, {args.threads} thread(s), {args.rounds} calls each; ms per call")
    print(f"{'layer (in, out, k, stride, @out)':34s} {'cuvil':>8s} {'ORT':>8s} {'OV':>8s} {'/ORT':>6s} {'/OV':>6s} "
          f"{'- best':>7s}")
    keys = set(ours) | set(ort_layers) | set(ov_layers)
    for k in sorted(keys, key=lambda k: -(ours.get(k, 0) - best(k))):
        a, b, c = ours.get(k, 0.0), ort_layers.get(k, 0.0), ov_layers.get(k, 0.0)
        print(f"{str(k):34s} {a:8.2f} {b:8.2f} {c:8.2f} {ratio(a, b)} {ratio(a, c)} {a - best(k):+7.2f}")
    tc, to, tv = (sum(t.values()) for t in (ours, ort_layers, ov_layers))
    print(f"{'total':34s} {tc:8.2f} {to:8.2f} {tv:8.2f} {ratio(tc, to)} {ratio(tc, tv)}")


if __name__ == "__main__":
    main()
