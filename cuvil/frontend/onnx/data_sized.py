"""Ops whose output size depends on the input's values: NonZero, Compress and Unique (without an axis),
through the frontends' shared padded-result-and-count helpers (../data_sized.py) and bind_dim."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from .. import data_sized
from .helpers import Unsupported, norm_axis, rank_of, shape_of
from .registry import handler


def _builders(c):
    return (lambda op, ins, attrs=None: c.op(op, ins, **(attrs or {}))), c.g.const


def _static(x):
    shape = shape_of(x)
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported("a data-dependent size over a symbolic input size")
    return list(shape)


@handler("NonZero")
def _nonzero(c):
    """The coordinates of the nonzero elements in row-major order, [rank, count]."""
    x = c.val(c.inp(0))
    shape = _static(x)
    n = D.numel(shape)
    add, const = _builders(c)
    if n == 0 or not shape:
        raise Unsupported("NonZero of an empty or 0-d tensor")
    flat = c.reshape(x, [n])
    hit = flat if x.dtype == "bool" else add("ne", [flat, const(np.zeros((), x.dtype))], {})
    pos, count = data_sized.compact(add, const, hit)
    coords = np.stack(np.unravel_index(np.arange(n), shape)).astype(np.int64)        # [rank, n]
    padded = add("gather", [const(coords), pos], {"axis": 1})
    return data_sized.bind(add, c.g, padded, count, 1, data_sized.fresh_symbol(c.g))


@handler("Compress")
def _compress(c):
    """The slices of x along axis (or of x flattened) where condition is true; a condition shorter than
    the axis leaves the rest out."""
    x, cond = c.val(c.inp(0)), c.val(c.inp(1))
    shape = _static(x)
    add, const = _builders(c)
    axis = c.attr("axis")
    if axis is None:
        x, axis = c.reshape(x, [D.numel(shape)]), 0
    axis = norm_axis(axis, rank_of(x))
    length = _static(cond)[0]
    if length > x.shape[axis]:
        raise Unsupported("a condition longer than the axis it selects along")
    hit = cond if cond.dtype == "bool" else add("ne", [cond, const(np.zeros((), cond.dtype))], {})
    pos, count = data_sized.compact(add, const, hit)
    return data_sized.bind(add, c.g, add("gather", [x, pos], {"axis": axis}), count, axis,
                           data_sized.fresh_symbol(c.g))


@handler("Unique")
def _unique(c):
    """(Y, indices of first occurrences, inverse indices, counts) of x flattened, Y sorted or in order of
    first occurrence."""
    if c.attr("axis") is not None:
        raise Unsupported("Unique along an axis")
    x = c.val(c.inp(0))
    n = D.numel(_static(x))
    if n == 0:
        raise Unsupported("Unique of an empty tensor")
    add, const = _builders(c)
    flat = c.reshape(x, [n])
    vals, order = add("topk", [flat], {"k": n, "axis": 0, "largest": False, "sorted": True})   # stable: ties by index
    first, run = data_sized.runs(add, const, vals)
    pos, count = data_sized.compact(add, const, first)
    y = add("gather", [vals, pos], {"axis": 0})
    firsts = add("gather", [order, pos], {"axis": 0})          # a run's first entry is its earliest occurrence
    inverse = add("scatter_elements", [run, order, run], {"axis": 0, "reduction": "none"})
    counts = add("scatter_elements", [const(np.zeros(n, np.int64)), run, const(np.ones(n, np.int64))],
                 {"axis": 0, "reduction": "add"})
    if not c.attr("sorted", 1):          # by first occurrence: the runs reordered by their first index
        live = add("lt", [const(np.arange(n, dtype=np.int64)), count], {})
        key = add("where", [live, firsts, const(np.int64(n))], {})
        _, by_first = add("topk", [key], {"k": n, "axis": 0, "largest": False, "sorted": True})
        y, firsts, counts = (add("gather", [v, by_first], {"axis": 0}) for v in (y, firsts, counts))
        rank = add("scatter_elements", [const(np.zeros(n, np.int64)), by_first,
                                        const(np.arange(n, dtype=np.int64))], {"axis": 0, "reduction": "none"})
        inverse = add("gather", [rank, inverse], {"axis": 0})
    name = data_sized.fresh_symbol(c.g)
    y, firsts, counts = (data_sized.bind(add, c.g, v, count, 0, name) for v in (y, firsts, counts))
    return [y, firsts, inverse, counts]
