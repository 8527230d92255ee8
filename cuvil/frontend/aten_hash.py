"""torch.hash_tensor -> IR: each element widened to 64 bits (floats to float64, integers and bools to
int64), its bits read as uint64, xor-reduced over the dims by halving (xor has no IR reduction)."""
from __future__ import annotations

import numpy as np

from ..ir import dims as D
from .aten import Unsupported, _axes, aten, handles


def _xor_fold(ctx, x, axis):
    """x reduced by xor along its static axis, which keeps size 1."""
    n = x.shape[axis]
    while n > 1:
        if n % 2:                                   # an odd length: one zero (xor's identity) more
            pads = [(0, 0)] * x.type.rank
            pads[axis] = (0, 1)
            x, n = ctx.add("pad", [x], {"pads": pads, "value": 0}), n + 1
        half = n // 2
        lo, hi = (ctx.add("slice", [x], {"axis": axis, "start": s, "step": 1, "length": half}) for s in (0, half))
        x, n = ctx.add("bitwise_xor", [lo, hi]), half
    return x


@handles(aten.hash_tensor.default)
def _hash_tensor(ctx, x, dim=(), *, keepdim=False, mode=0):
    if mode != 0:
        raise Unsupported(f"hash_tensor mode {mode}")
    if not all(isinstance(d, int) for d in x.shape):
        raise Unsupported("hash_tensor over a symbolic shape")
    wide = "float64" if x.dtype.startswith(("float", "bfloat")) else "int64"
    bits = ctx.add("bitcast", [ctx.tensor(x, wide)], {"to": "uint64"})
    axes = _axes(bits, list(dim) or None)
    if D.numel(list(x.shape)) == 0:
        shape = [1 if a in axes else d for a, d in enumerate(x.shape)]
        out = ctx.g.const(np.zeros(shape, np.uint64))
    else:
        out = bits
        for a in axes:
            out = _xor_fold(ctx, out, a)
    if keepdim:
        return out
    return ctx.add("reshape", [out], {"shape": [d for a, d in enumerate(out.shape) if a not in axes]})
