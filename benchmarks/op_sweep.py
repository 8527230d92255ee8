"""Single ops at moderate sizes against torch eager: where a generic kernel is far slower than eager.

The model benchmarks time the kernels the tuned networks run; a model nobody tuned for can spend its
time in an op they never reach (a scalar softmax, a layer norm over 96 channels). Each op here is
compiled alone (1 thread) on about a million floats and timed against torch eager on the same input,
interleaved, medians; the table is sorted by cuvil's time over eager's, worst first.

    python -m benchmarks.op_sweep [--rounds 7] [--only softmax,layer_norm]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F


class Op(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _r(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# name -> (function of the inputs, inputs)
OPS = {
    "softmax last [12,128,128]": (lambda x: torch.softmax(x, -1), (_r(12, 128, 128),)),
    "softmax dim 1 [8,256,128]": (lambda x: torch.softmax(x, 1), (_r(8, 256, 128),)),
    "log_softmax [64,16000]": (lambda x: torch.log_softmax(x, -1), (_r(64, 16000),)),
    "layer_norm 96 [3136,96]": (lambda x: F.layer_norm(x, (96,)), (_r(3136, 96),)),
    "layer_norm 768 [512,768]": (lambda x: F.layer_norm(x, (768,)), (_r(512, 768),)),
    "rms_norm 2048 [256,2048]": (lambda x: F.rms_norm(x, (2048,)), (_r(256, 2048),)),
    "group_norm 32 [1,256,56,56]": (lambda x: F.group_norm(x, 32), (_r(1, 256, 56, 56),)),
    "instance_norm [1,64,112,112]": (lambda x: F.instance_norm(x), (_r(1, 64, 112, 112),)),
    "batch_norm eval [1,64,112,112]": (lambda x: F.batch_norm(x, torch.zeros(64), torch.ones(64)), (_r(1, 64, 112, 112),)),
    "max_pool 3x3 s2 [1,64,112,112]": (lambda x: F.max_pool2d(x, 3, 2, 1), (_r(1, 64, 112, 112),)),
    "avg_pool 3x3 s1 [1,64,56,56]": (lambda x: F.avg_pool2d(x, 3, 1, 1), (_r(1, 64, 56, 56),)),
    "adaptive_avg_pool 7 [1,512,28,28]": (lambda x: F.adaptive_avg_pool2d(x, 7), (_r(1, 512, 28, 28),)),
    "interpolate bilinear x2 [1,64,56,56]": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (_r(1, 64, 56, 56),)),
    "interpolate nearest x2 [1,64,56,56]": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), (_r(1, 64, 56, 56),)),
    "sum dim -1 [1024,1024]": (lambda x: x.sum(-1), (_r(1024, 1024),)),
    "sum dim 0 [1024,1024]": (lambda x: x.sum(0), (_r(1024, 1024),)),
    "amax dim 1 [64,128,128]": (lambda x: x.amax(1), (_r(64, 128, 128),)),
    "argmax dim -1 [1024,1000]": (lambda x: x.argmax(-1), (_r(1024, 1000),)),
    "cumsum dim -1 [256,4096]": (lambda x: x.cumsum(-1), (_r(256, 4096),)),
    "topk 5 [1024,1000]": (lambda x: torch.topk(x, 5, -1)[0], (_r(1024, 1000),)),
    "sort [256,4096]": (lambda x: torch.sort(x, -1)[0], (_r(256, 4096),)),
    "transpose 0213 [8,128,12,64]": (lambda x: x.transpose(1, 2).contiguous() * 1.0, (_r(8, 128, 12, 64),)),
    "permute nhwc [1,256,56,56]": (lambda x: x.permute(0, 2, 3, 1).contiguous() * 1.0, (_r(1, 256, 56, 56),)),
    "concat 4 x [1,64,56,56]": (lambda a, b, c, d: torch.cat([a, b, c, d], 1), tuple(_r(1, 64, 56, 56) for _ in range(4))),
    "pad reflect [1,64,112,112]": (lambda x: F.pad(x, (3, 3, 3, 3), mode="reflect"), (_r(1, 64, 112, 112),)),
    "embedding [32000,512] x 2048": (lambda i, w: F.embedding(i, w), (torch.randint(0, 32000, (2048,)), _r(32000, 512))),
    "gather dim 1 [1024,1000]": (lambda x, i: torch.gather(x, 1, i), (_r(1024, 1000), torch.randint(0, 1000, (1024, 100)))),
    "where [1M]": (lambda x, y: torch.where(x > 0, x, y), (_r(1 << 20), _r(1 << 20))),
    "gelu [1M]": (lambda x: F.gelu(x), (_r(1 << 20),)),
    "gelu tanh [1M]": (lambda x: F.gelu(x, approximate="tanh"), (_r(1 << 20),)),
    "silu [1M]": (lambda x: F.silu(x), (_r(1 << 20),)),
    "erf [1M]": (lambda x: torch.erf(x), (_r(1 << 20),)),
    "pow 2.5 [1M]": (lambda x: x.abs().pow(2.5), (_r(1 << 20),)),
    "sin cos [1M]": (lambda x: x.sin() + x.cos(), (_r(1 << 20),)),
    "log1p exp [1M]": (lambda x: torch.log1p(torch.exp(x)), (_r(1 << 20),)),
    "mish [1M]": (lambda x: F.mish(x), (_r(1 << 20),)),
    "bmm [32,128,64]x[32,64,128]": (lambda a, b: a @ b, (_r(32, 128, 64), _r(32, 64, 128))),
    "sdpa [1,12,128,64]": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), tuple(_r(1, 12, 128, 64) for _ in range(3))),
    "conv_transpose 2x2 s2 [1,64,56,56]": (Op(torch.nn.ConvTranspose2d(64, 32, 2, 2)).eval(), (_r(1, 64, 56, 56),)),
    "conv1d k3 [1,256,1024]": (Op(torch.nn.Conv1d(256, 256, 3, padding=1)).eval(), (_r(1, 256, 1024),)),
    "lstm 1 layer [1,64,256]": (Op(torch.nn.LSTM(256, 256, batch_first=True)).eval(), (_r(1, 64, 256),)),
}


def _time(fn, rounds, burst=0.15):
    fn()
    out = []
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < burst:
            fn()
            n += 1
        out.append((time.perf_counter() - t0) / n)
    return out


def run(names, rounds):
    import cuvil
    torch.set_num_threads(1)
    rows = []
    for name in names:
        fn, inputs = OPS[name]
        model = fn if isinstance(fn, torch.nn.Module) else Op(fn).eval()
        try:
            cm = cuvil.compile(model, inputs, num_threads=1, cache_dir=tempfile.mkdtemp(prefix="op_sweep_"))
        except Exception as e:  # noqa: BLE001 - reported in the table
            rows.append((name, None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"))
            continue
        xs = [t.numpy() for t in inputs]
        with torch.no_grad():
            want = model(*inputs)
            want = (want[0] if isinstance(want, tuple) else want).numpy()
            got = np.asarray(cm.run(*xs)[0])
            err = float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))
            c, e = [], []
            for _ in range(rounds):                       # interleaved rounds
                c += _time(lambda: cm.run(*xs), 1)
                e += _time(lambda: model(*inputs), 1)
        rows.append((name, float(np.median(c)) * 1e3, float(np.median(e)) * 1e3, f"{err:.1e}"))
        print(f"{name:40s} cuvil {rows[-1][1]:8.3f} ms  eager {rows[-1][2]:8.3f} ms  {rows[-1][1] / rows[-1][2]:5.2f}x",
              flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", help="comma-separated names (substrings)")
    a = ap.parse_args(argv)
    names = [n for n in OPS if not a.only or any(s in n for s in a.only.split(","))]
    rows = run(names, a.rounds)
    timed = sorted((r for r in rows if r[1] is not None), key=lambda r: -r[1] / r[2])
    from benchmarks.timing import machine_line
    print(f"\nmachine: {machine_line()}\n")
    print("| op | cuvil ms | eager ms | cuvil / eager | max rel err |")
    print("|---|---|---|---|---|")
    for name, c, e, err in timed:
        print(f"| {name} | {c:.3f} | {e:.3f} | {c / e:.2f}x | {err} |")
    for name, _, _, why in (r for r in rows if r[1] is None):
        print(f"| {name} | - | - | - | {why} |")
    ratios = [r[1] / r[2] for r in timed]
    if ratios:
        print(f"\ngeometric mean {float(np.exp(np.mean(np.log(ratios)))):.2f}x, worst {timed[0][0]} {ratios[0]:.2f}x")


if __name__ == "__main__":
    main()
