"""Where a conv net's time goes, layer by layer, in cuvil and in ONNX Runtime, in one interleaved run.

    python -m benchmarks.layers [--workload ResNet-50] [--threads 1] [--rounds 12]

Workloads: benchmarks/workloads.py's and the CNN set's (benchmarks/cnn_models.py: MobileNetV2 for its
depthwise convs, RegNetY-4GF for its grouped ones). cuvil's per-node counters (compiled with
profile=True) against ONNX Runtime's own profiler on the same exported model. Convolutions are matched
by (in channels per group, out channels, kernel, stride, output size: a depthwise conv's first is 1) and summed
over their repeats; every other node is counted as "other" on both sides. The two sessions alternate
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
from benchmarks.systems import export_onnx
from benchmarks.workloads import WORKLOADS as _BASE

WORKLOADS = {**_BASE, **CNNS}


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

    warm = 3
    for _ in range(warm):
        cm.run(*x)
        sess.run(None, feed)
    cm.module.profile_counters()                # resets them: the warm-up calls are not counted
    for _ in range(args.rounds):
        time.sleep(0.05)
        cm.run(*x)
        time.sleep(0.05)
        sess.run(None, feed)
    ours = _cuvil_layers(_graph_nodes(model, inputs), cm.module.profile_counters(), args.rounds)
    theirs = _ort_layers(sess.end_profiling(), warm + args.rounds)   # ORT's profile keeps the warm-up calls too

    tc, to = sum(ours.values()), sum(theirs.values())
    print(f"{args.workload}, {args.threads} thread(s), {args.rounds} calls each; ms per call")
    print(f"{'layer (in, out, k, stride, @out)':34s} {'cuvil':>8s} {'ORT':>8s} {'ratio':>6s} {'delta':>7s}")
    for k in sorted(set(ours) | set(theirs), key=lambda k: -(ours.get(k, 0) - theirs.get(k, 0))):
        a, b = ours.get(k, 0.0), theirs.get(k, 0.0)
        ratio = f"{a / b:6.2f}" if b else "     -"
        print(f"{str(k):34s} {a:8.2f} {b:8.2f} {ratio} {a - b:+7.2f}")
    print(f"{'total':34s} {tc:8.2f} {to:8.2f} {tc / to:6.2f} {tc - to:+7.2f}")


if __name__ == "__main__":
    main()
