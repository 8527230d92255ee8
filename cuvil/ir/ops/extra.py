"""Ops the ONNX frontend needs beyond the core set: bitwise ops and shifts on integers,
cumulative product, scatter (elements / nd) and top-k."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ..types import TensorType
from . import REQUIRED, OpDef, declare
from ._shape import broadcast, norm_axis


def _int_only(name, t):
    if t.dtype.startswith(("float", "bfloat")) or t.dtype == "bool":   # C's ~1 is 254, not a bool: use not/and/or/xor
        raise ShapeError(f"{name} expects integer tensors, got {t.dtype}")


def _bitwise(name, fn):
    def infer(types, attrs, inputs):
        a, b = types
        _int_only(name, a)
        if a.dtype != b.dtype:
            raise ShapeError(f"{name}: operand dtypes differ ({a.dtype} vs {b.dtype})")
        return [TensorType(broadcast(a.shape, b.shape), a.dtype)]
    declare(OpDef(name, {}, infer, lambda xs, a: np.asarray(fn(xs[0], xs[1])).astype(xs[0].dtype), kind="binary"))


def _shift_left(a, b):
    bits = a.dtype.itemsize * 8
    out = np.left_shift(a, np.clip(b, 0, bits - 1).astype(a.dtype))
    return np.where((b < 0) | (b >= bits), 0, out)


def _shift_right(a, b):
    bits = a.dtype.itemsize * 8
    out = np.right_shift(a, np.clip(b, 0, bits - 1).astype(a.dtype))
    return np.where((b < 0) | (b >= bits), np.where(a < 0, -1, 0), out)   # a negative count acts as a huge one


_bitwise("bitwise_and", np.bitwise_and)
_bitwise("bitwise_or", np.bitwise_or)
_bitwise("bitwise_xor", np.bitwise_xor)
_bitwise("shift_left", _shift_left)
_bitwise("shift_right", _shift_right)


def _bitnot_infer(types, attrs, inputs):
    _int_only("bitwise_not", types[0])
    return [types[0]]


declare(OpDef("bitwise_not", {}, _bitnot_infer, lambda xs, a: np.invert(xs[0]), kind="unary"))


def _cumprod_infer(types, attrs, inputs):
    attrs["axis"] = norm_axis(attrs["axis"], types[0].rank)
    return [types[0]]


def _cumprod_ref(xs, attrs):
    x, ax = xs[0], attrs["axis"]
    if attrs["reverse"]:
        x = np.flip(x, ax)
    r = np.cumprod(x, axis=ax, dtype=x.dtype)
    if attrs["exclusive"] and x.shape[ax]:   # (an empty axis stays empty)
        sh = list(x.shape)
        sh[ax] = 1
        r = np.concatenate([np.ones(sh, x.dtype), np.take(r, range(x.shape[ax] - 1), axis=ax)], axis=ax)
    return np.flip(r, ax) if attrs["reverse"] else r


declare(OpDef("cumprod", {"axis": 0, "exclusive": False, "reverse": False}, _cumprod_infer, _cumprod_ref,
              kind="scan"))

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_elements_infer(types, attrs, inputs):
    x, idx, upd = types
    if idx.rank != x.rank or idx.shape != upd.shape or x.dtype != upd.dtype:
        raise ShapeError(f"scatter_elements: data {x}, indices {idx}, updates {upd} do not fit")
    if idx.dtype not in ("int64", "int32"):
        raise ShapeError(f"scatter_elements: indices must be int64 or int32, got {idx.dtype}")
    if attrs["reduction"] not in REDUCTIONS:
        raise ShapeError(f"scatter_elements: reduction {attrs['reduction']!r} not one of {REDUCTIONS}")
    attrs["axis"] = norm_axis(attrs["axis"], x.rank)
    for d, (i, n) in enumerate(zip(idx.shape, x.shape)):   # an index past the data's other dims writes out of bounds
        if d != attrs["axis"] and isinstance(i, int) and isinstance(n, int) and i > n:
            raise ShapeError(f"scatter_elements: indices {idx} larger than data {x} in dim {d}")
    return [x]


def _combine(red, old, new):
    if red == "none":
        return new
    if red == "add":
        return old + new
    if red == "mul":
        return old * new
    if red == "max":
        return max(old, new)
    return min(old, new)


def _scatter_elements_ref(xs, a):
    x, idx, upd = xs
    out = x.copy()
    ax = a["axis"]
    n = x.shape[ax]
    for pos in np.ndindex(*idx.shape):
        j = int(idx[pos])
        j = j + n if j < 0 else j
        if not 0 <= j < n:
            raise IndexError(f"scatter_elements: index {idx[pos]} out of range for a dim of size {n}")
        tgt = pos[:ax] + (j,) + pos[ax + 1:]
        out[tgt] = _combine(a["reduction"], out[tgt], upd[pos])
    return out


declare(OpDef("scatter_elements", {"axis": 0, "reduction": "none"}, _scatter_elements_infer,
              _scatter_elements_ref, kind="scatter"))


def _scatter_nd_infer(types, attrs, inputs):
    x, idx, upd = types
    if idx.dtype not in ("int64", "int32") or x.dtype != upd.dtype:
        raise ShapeError(f"scatter_nd: data {x}, indices {idx}, updates {upd} do not fit")
    k = idx.shape[-1]
    if not isinstance(k, int) or k > x.rank:
        raise ShapeError(f"scatter_nd: index depth {k} for data of rank {x.rank}")
    want = tuple(idx.shape[:-1]) + tuple(x.shape[k:])
    if tuple(upd.shape) != want:
        raise ShapeError(f"scatter_nd: updates shape {upd.shape}, expected {want}")
    if attrs["reduction"] not in REDUCTIONS:
        raise ShapeError(f"scatter_nd: reduction {attrs['reduction']!r} not one of {REDUCTIONS}")
    return [x]


def _scatter_nd_ref(xs, a):
    x, idx, upd = xs
    out = x.copy()
    k = idx.shape[-1]
    for pos in np.ndindex(*idx.shape[:-1]):
        tgt = tuple(int(i) + (x.shape[d] if i < 0 else 0) for d, i in enumerate(idx[pos]))
        for d, t in enumerate(tgt):
            if not 0 <= t < x.shape[d]:
                raise IndexError(f"scatter_nd: index {tuple(idx[pos])} out of range for {x.shape}")
        if a["reduction"] == "none":
            out[tgt] = upd[pos]
        else:
            cur = out[tgt]
            out[tgt] = np.vectorize(lambda o, u: _combine(a["reduction"], o, u), otypes=[x.dtype])(cur, upd[pos]) \
                if np.ndim(cur) else _combine(a["reduction"], cur, upd[pos])
    del k
    return out


declare(OpDef("scatter_nd", {"reduction": "none"}, _scatter_nd_infer, _scatter_nd_ref, kind="scatter"))


def _topk_infer(types, attrs, inputs):
    x = types[0]
    ax = norm_axis(attrs["axis"], x.rank)
    attrs["axis"] = ax
    k = attrs["k"]
    if isinstance(x.shape[ax], int) and isinstance(k, int) and not 0 <= k <= x.shape[ax]:
        raise ShapeError(f"topk: k={k} for a dim of size {x.shape[ax]}")
    shape = list(x.shape)
    shape[ax] = k
    return [TensorType(tuple(shape), x.dtype), TensorType(tuple(shape), "int64")]


def _topk_ref(xs, a):
    x, ax, k = xs[0], a["axis"], a["k"]
    xm = np.moveaxis(x, ax, -1)
    n = xm.shape[-1]
    pos = np.broadcast_to(np.arange(n), xm.shape)
    # stable: ties keep the lower index first; NaN counts as the largest value (numpy's sort, torch.topk)
    key = -xm.astype(np.float64) if a["largest"] else xm.astype(np.float64)
    nan_rank = ~np.isnan(key) if a["largest"] else np.isnan(key)
    order = np.lexsort((pos, key, nan_rank), axis=-1)[..., :k]
    vals = np.take_along_axis(xm, order, axis=-1)
    return [np.moveaxis(vals, -1, ax).copy(), np.moveaxis(order.astype(np.int64), -1, ax).copy()]


declare(OpDef("topk", {"k": REQUIRED, "axis": -1, "largest": True, "sorted": True}, _topk_infer, _topk_ref,
              kind="other"))


def _bitcast_infer(types, attrs, inputs):
    x = types[0]
    if np.dtype(x.dtype).itemsize != np.dtype(attrs["to"]).itemsize:
        raise ShapeError(f"bitcast: {x.dtype} and {attrs['to']} differ in size")
    return [TensorType(x.shape, attrs["to"])]


# reinterpret the bytes of each element as another dtype of the same size (ONNX BitCast)
declare(OpDef("bitcast", {"to": REQUIRED}, _bitcast_infer, lambda xs, a: xs[0].view(np.dtype(a["to"])), kind="movement"))
