"""One conv's time at fp32 and at a lower precision, over filter and channel counts: the conv sits between
two 3x3 convs (so its input and output are channel-blocked maps, as inside a network), profile builds,
the best of 3 profiles of N runs each. How conv_plan.BF16_MIN_FILTERS and BF16_MIN_K were chosen.

    python -m benchmarks.conv_precision_sweep [--hw 56] [--channels 16,32,64,128] [--filters 16,32,48,64,96,128]
                                              [--kernel 1] [--precision bf16] [--runs 40]
"""
from __future__ import annotations

import argparse
import itertools
import tempfile

import torch

from benchmarks.timing import machine_line


def _conv_ms(model, x, precision, c, o, runs):
    """(ms of the conv with o filters over c channels, its node) in a profile build at `precision`."""
    import cuvil
    import cuvil.profiler
    cm = cuvil.compile(model, (x,), precision=precision, num_threads=1, profile=True, cache_dir=tempfile.mkdtemp())
    node = next(n for n in cm.graph.nodes if n.op == "conv" and tuple(n.inputs[1].shape[:2]) == (o, c))
    index = cm.graph.nodes.index(node)
    best = float("inf")
    for _ in range(3):
        _, rows = cuvil.profiler.profile(cm, x.numpy(), runs=runs)
        best = min(best, next(ms for label, ms in rows if int(label.split(":")[0]) == index))
    return best, node


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", type=int, default=56)
    ap.add_argument("--channels", default="16,32,64,128")
    ap.add_argument("--filters", default="16,32,48,64,96,128")
    ap.add_argument("--kernel", type=int, default=1)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--runs", type=int, default=40)
    a = ap.parse_args(argv)
    print(machine_line())
    print(f"| channels | filters | layout ({a.hw}x{a.hw}, {a.kernel}x{a.kernel} conv) | fp32 ms | {a.precision} ms | {a.precision} / fp32 |")
    print("|---|---|---|---|---|---|")
    for c, o in itertools.product(map(int, a.channels.split(",")), map(int, a.filters.split(","))):
        torch.manual_seed(0)
        # the convs around it have 24 and 40 filters: no weight shape of theirs is (o, c)
        model = torch.nn.Sequential(torch.nn.Conv2d(24, c, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(c, o, a.kernel, padding=a.kernel // 2), torch.nn.ReLU(),
                                    torch.nn.Conv2d(o, 40, 3, padding=1)).eval()
        x = torch.randn(1, 24, a.hw, a.hw)
        base, _ = _conv_ms(model, x, "fp32", c, o, a.runs)
        low, node = _conv_ms(model, x, a.precision, c, o, a.runs)
        print(f"| {c} | {o} | {node.attrs.get('layout')} | {base:.4f} | {low:.4f} | {low / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
