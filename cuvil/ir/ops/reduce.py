"""Reductions over a set of axes, arg-reductions, top-k, and cumulative sums and products."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ..types import TensorType
from .registry import REQUIRED, OpDef, declare
from ._shape import norm_axes, norm_axis

REDUCE = {
    "reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max,
    "reduce_min": np.min, "reduce_prod": np.prod,
}


def reduced_shape(shape, axes, keepdims):
    return tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(shape)
                 if keepdims or i not in axes)


def _reduce(name, fn):
    def infer(types, attrs, inputs):
        t = types[0]
        axes = norm_axes(attrs["axes"] if attrs["axes"] is not None else range(t.rank), t.rank)
        attrs["axes"] = axes
        if name == "reduce_mean" and not t.dtype.startswith(("float", "bfloat")):
            raise ShapeError(f"reduce_mean expects a float tensor, got {t.dtype}")
        if name in ("reduce_sum", "reduce_prod") and t.dtype == "bool":   # a bool sum would wrap at 256 in C
            raise ShapeError(f"{name} of a bool tensor: cast it to an integer dtype first")
        return [TensorType(reduced_shape(t.shape, axes, attrs["keepdims"]), t.dtype)]

    def ref(xs, attrs):
        x = xs[0]
        if x.size == 0 and name in ("reduce_max", "reduce_min"):
            init = -np.inf if name == "reduce_max" else np.inf
            if np.issubdtype(x.dtype, np.integer):
                info = np.iinfo(x.dtype)
                init = info.min if name == "reduce_max" else info.max
            elif x.dtype == bool:   # any() of nothing is False, all() of nothing is True
                init = name == "reduce_min"
            return np.asarray(fn(x, axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"], initial=init)).astype(x.dtype)
        acc = np.float64 if x.dtype.kind == "f" and name in ("reduce_sum", "reduce_mean") else None
        r = fn(x, axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"], dtype=acc) if acc else \
            fn(x, axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"])
        return np.asarray(r).astype(x.dtype)
    declare(OpDef(name, {"axes": None, "keepdims": False}, infer, ref, kind="reduce"))


for _n, _f in REDUCE.items():
    _reduce(_n, _f)


def _arg(name, fn):
    def infer(types, attrs, inputs):
        t = types[0]
        ax = norm_axis(attrs["axis"], t.rank)
        attrs["axis"] = ax
        return [TensorType(reduced_shape(t.shape, (ax,), attrs["keepdims"]), "int64")]

    def ref(xs, attrs):
        x, ax = xs[0], attrs["axis"]
        if attrs["select_last_index"]:
            r = x.shape[ax] - 1 - fn(np.flip(x, ax), axis=ax)
        else:
            r = fn(x, axis=ax)
        r = np.asarray(r, dtype=np.int64)
        return np.expand_dims(r, ax) if attrs["keepdims"] else r
    declare(OpDef(name, {"axis": 0, "keepdims": False, "select_last_index": False}, infer, ref, kind="argreduce"))


_arg("argmax", np.argmax)
_arg("argmin", np.argmin)


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


def _exclusive_product(x, r, ax):
    """The inclusive product shifted one step along ax, starting from 1."""
    if not x.shape[ax]:   # (an empty axis stays empty)
        return r
    sh = list(x.shape)
    sh[ax] = 1
    return np.concatenate([np.ones(sh, x.dtype), np.take(r, range(x.shape[ax] - 1), axis=ax)], axis=ax)


def _scan(name, fn, exclusive, accepts_bool=True):
    """A cumulative op along one axis: fn (np.cumsum, np.cumprod) gives the inclusive result,
    exclusive(x, inclusive, axis) the exclusive one."""
    def infer(types, attrs, inputs):
        if not accepts_bool and types[0].dtype == "bool":
            raise ShapeError(f"{name} of a bool tensor: cast it to an integer dtype first")
        attrs["axis"] = norm_axis(attrs["axis"], types[0].rank)
        return [types[0]]

    def ref(xs, attrs):
        x, ax = xs[0], attrs["axis"]
        if attrs["reverse"]:
            x = np.flip(x, ax)
        r = fn(x, axis=ax, dtype=x.dtype)
        if attrs["exclusive"]:
            r = exclusive(x, r, ax)
        return np.flip(r, ax) if attrs["reverse"] else r
    declare(OpDef(name, {"axis": 0, "exclusive": False, "reverse": False}, infer, ref, kind="scan"))


_scan("cumsum", np.cumsum, lambda x, r, ax: r - x, accepts_bool=False)
_scan("cumprod", np.cumprod, _exclusive_product)
