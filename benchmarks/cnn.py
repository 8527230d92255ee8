"""The CNN table of issue 44: cuvil against ONNX Runtime (and eager PyTorch; OpenVINO and torch.compile
with --systems) on the networks of benchmarks/cnn_models.py, batch 1 (and --batch), 224 px, medians
of interleaved rounds; the ratio to the fastest peer per network, the geometric mean and the worst.

    python -m benchmarks.cnn [--threads 1,2] [--models MobileNetV2,ResNet-50] [--systems ...] [--set wide]

--set: "issue44" (default: the issue's nine networks, benchmarks/cnn_models.py), "wide" (twelve more
vision networks nobody tuned for, benchmarks/cnn_wide.py) or "all".
"""
from __future__ import annotations

import argparse
import math

from benchmarks.cnn_models import CNNS
from benchmarks.cnn_wide import WIDE_CNNS
from benchmarks.run import bench_workload
from benchmarks.timing import machine_line

PEERS = ("onnxruntime", "openvino", "torch.compile")
SETS = {"issue44": CNNS, "wide": WIDE_CNNS, "all": {**CNNS, **WIDE_CNNS}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--set", default="issue44", choices=sorted(SETS))
    ap.add_argument("--models", default=None, help="comma-separated names of the set (default: all of it)")
    ap.add_argument("--systems", default="cuvil,onnxruntime,eager")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args(argv)
    nets = SETS[a.set]
    names = a.models.split(",") if a.models else list(nets)
    unknown = [n for n in names if n not in nets]
    if unknown:
        ap.error(f"not in --set {a.set}: {', '.join(unknown)} (known: {', '.join(nets)})")
    systems = a.systems.split(",")
    print(f"{machine_line()}\n")
    print("| threads | network | " + " | ".join(f"{s} ms" for s in systems) + " | cuvil / best peer |")
    print("|---" * (len(systems) + 3) + "|")
    for threads in (int(t) for t in a.threads.split(",")):
        ratios = {}
        for name in names:
            med, _, errors = bench_workload(name, lambda: nets[name](a.batch), threads, systems, a.rounds)
            peers = {s: med[s] for s in PEERS if s in med}
            ratio = med["cuvil"] / min(peers.values()) if peers and "cuvil" in med else float("nan")
            ratios[name] = ratio
            cells = " | ".join(f"{med[s] * 1e3:.2f}" if s in med else f"- ({errors.get(s, '')[:40]})" for s in systems)
            print(f"| {threads} | {name} b{a.batch} | {cells} | {ratio:.2f}x |", flush=True)
        good = [r for r in ratios.values() if not math.isnan(r)]
        if good:
            worst = max(ratios, key=lambda k: ratios[k] if not math.isnan(ratios[k]) else -1)
            geo = math.exp(sum(map(math.log, good)) / len(good))
            print(f"| {threads} | geometric mean {geo:.2f}x, worst {worst} {ratios[worst]:.2f}x | | | | |", flush=True)


if __name__ == "__main__":
    main()
