"""Reduction op handlers.

The Reduce* family (axes as an attribute or, by opset, an input), ArgMax / ArgMin, CumSum, CumProd and
TopK."""
from __future__ import annotations

import numpy as np

from .helpers import Unsupported, dtype_of, ints, norm_axis, rank_of, shape_of
from .registry import handler


# ---- reductions -----------------------------------------------------------------------------------
def _reduce_axes(c, since):
    x = c.inp(0)
    r = rank_of(x)
    if c.opset >= since:
        axes = c.known(1, "axes")
        axes = None if axes is None else ints(axes)
    else:
        axes = c.attr("axes")
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            return x, None
        axes = list(range(r))
    return x, tuple(sorted(norm_axis(a, r) for a in axes))


def _reduce(kind):
    def h(c):
        since = 13 if c.node.op_type == "ReduceSum" else 18
        x, axes = _reduce_axes(c, since)
        kd = bool(c.attr("keepdims", 1))
        dt = dtype_of(x)
        if axes is None:
            if kind == "l1":
                return c.op("abs", [x])
            if kind in ("l2",):
                return c.op("abs", [x])
            if kind == "sumsq":
                return c.op("mul", [x, x])
            if kind == "logsum":
                return c.op("log", [x])
            if kind == "logsumexp":
                return c.op("log", [c.op("exp", [x])])
            return x
        if kind in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"):
            if any(isinstance(shape_of(x)[a], int) and shape_of(x)[a] == 0 for a in axes) and \
                    kind in ("reduce_max", "reduce_min") and not dt.startswith(("float", "bfloat")):
                if not all(isinstance(d, int) for d in shape_of(x)):
                    raise Unsupported("empty integer max/min over symbolic dims")
                info = (0, 1) if dt == "bool" else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
                oshape = [1 if i in axes else d for i, d in enumerate(shape_of(x)) if kd or i not in axes]
                return np.full(oshape, info[0] if kind == "reduce_max" else info[1], dtype=dt)
            return c.op(kind, [x], axes=axes, keepdims=kd)
        if kind == "l1":
            return c.op("reduce_sum", [c.op("abs", [x])], axes=axes, keepdims=kd)
        if kind == "l2":
            return c.op("sqrt", [c.op("reduce_sum", [c.op("mul", [x, x])], axes=axes, keepdims=kd)]) \
                if dt.startswith(("float", "bfloat")) else _int_l2(c, x, axes, kd)
        if kind == "sumsq":
            return c.op("reduce_sum", [c.op("mul", [x, x])], axes=axes, keepdims=kd)
        if kind == "logsum":
            return c.op("log", [c.op("reduce_sum", [x], axes=axes, keepdims=kd)])
        if kind == "logsumexp":
            m = c.op("reduce_max", [x], axes=axes, keepdims=True)
            m = c.op("where", [c.op("isinf", [m]), c.scalar(0, dt), m])
            s = c.op("reduce_sum", [c.op("exp", [c.op("sub", [x, m])])], axes=axes, keepdims=kd)
            mm = m if kd else c.reshape(m, shape_of(s))
            return c.op("add", [c.op("log", [s]), mm])
        raise Unsupported(kind)
    return h


def _int_l2(c, x, axes, kd):
    s = c.op("reduce_sum", [c.op("mul", [x, x])], axes=axes, keepdims=kd)
    return c.op("cast", [c.op("sqrt", [c.op("cast", [s], to="float64")])], to=dtype_of(x))


for _k, _v in {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max",
               "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod", "ReduceL1": "l1", "ReduceL2": "l2",
               "ReduceSumSquare": "sumsq", "ReduceLogSum": "logsum", "ReduceLogSumExp": "logsumexp"}.items():
    handler(_k)(_reduce(_v))


def _arg(kind):
    def h(c):
        x = c.inp(0)
        return c.op(kind, [x], axis=norm_axis(c.attr("axis", 0), rank_of(x)), keepdims=bool(c.attr("keepdims", 1)),
                    select_last_index=bool(c.attr("select_last_index", 0)))
    return h


handler("ArgMax")(_arg("argmax"))
handler("ArgMin")(_arg("argmin"))


def _scan(kind):
    def h(c):
        x = c.inp(0)
        axis = int(np.asarray(c.known(1, "axis")).ravel()[0])
        return c.op(kind, [x], axis=norm_axis(axis, rank_of(x)), exclusive=bool(c.attr("exclusive", 0)),
                    reverse=bool(c.attr("reverse", 0)))
    return h


handler("CumSum")(_scan("cumsum"))
handler("CumProd")(_scan("cumprod"))


@handler("TopK")
def _topk(c):
    x = c.inp(0)
    if c.opset < 10:
        k = c.attr("k")
    else:
        k = int(np.asarray(c.known(1, "k")).ravel()[0])
    return c.op("topk", [x], k=k, axis=norm_axis(c.attr("axis", -1), rank_of(x)),
                largest=bool(c.attr("largest", 1)), sorted=bool(c.attr("sorted", 1)))
