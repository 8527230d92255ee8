"""Ops whose output size depends on the input's values: NonZero, Compress and Unique (flattened or along an axis),
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


MAX_UNIQUE_SLICE = 64      # elements of a slice Unique along an axis sorts by (one stable sort per element)


@handler("Unique")
def _unique(c):
    """(Y, indices of first occurrences, inverse indices, counts) of x flattened, or of its slices along
    axis (compared element by element, in order); Y sorted or in order of first occurrence."""
    x = c.val(c.inp(0))
    shape = _static(x)
    add, const = _builders(c)
    axis = c.attr("axis")
    if axis is None:
        n = D.numel(shape)
        if n == 0:
            raise Unsupported("Unique of an empty tensor")
        vals, order = add("topk", [c.reshape(x, [n])], {"k": n, "axis": 0, "largest": False, "sorted": True})
        first, run = data_sized.runs(add, const, vals)        # (topk is stable: ties by index)
    else:
        axis = norm_axis(axis, len(shape))
        n, rest = shape[axis], shape[:axis] + shape[axis + 1:]
        m = D.numel(rest)
        if n == 0 or m == 0 or m > MAX_UNIQUE_SLICE:
            raise Unsupported(f"Unique along an axis of {n} slices of {m} elements (at most {MAX_UNIQUE_SLICE})")
        perm = [axis] + [k for k in range(len(shape)) if k != axis]
        rows = c.reshape(add("transpose", [x], {"perm": perm}) if axis else x, [n, m])
        order = _lexicographic_order(add, const, rows, n, m)
        vals = add("gather", [rows, order], {"axis": 0})
        first, run = _row_runs(add, const, vals, n, m)
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
    if axis is not None:                 # the unique rows back into slices along axis
        y = c.reshape(y, [y.type.shape[0]] + rest)
        if axis:
            back = list(range(1, len(shape)))
            back.insert(axis, 0)
            y = add("transpose", [y], {"perm": back})
    return [y, firsts, inverse, counts]


def _lexicographic_order(add, const, rows, n, m):
    """The stable order of rows [n, m] compared element by element: one stable sort per column, the
    last column first (a least-significant-digit sort)."""
    order = const(np.arange(n, dtype=np.int64))
    for j in reversed(range(m)):
        col = add("reshape", [add("slice", [rows], {"axis": 1, "start": j, "step": 1, "length": 1})], {"shape": [n]})
        _, step = add("topk", [add("gather", [col, order], {"axis": 0})], {"k": n, "axis": 0, "largest": False, "sorted": True})
        order = add("gather", [order, step], {"axis": 0})
    return order


def _row_runs(add, const, vals, n, m):
    """As data_sized.runs, for sorted rows [n, m]: where a run of equal rows starts, each row's run."""
    prev = add("slice", [vals], {"axis": 0, "start": 0, "step": 1, "length": n - 1})
    rest = add("slice", [vals], {"axis": 0, "start": 1, "step": 1, "length": n - 1})
    differs = add("reduce_max", [add("cast", [add("ne", [rest, prev])], {"to": "int32"})], {"axes": [1], "keepdims": False})
    first = add("concat", [const(np.ones(1, bool)), add("cast", [differs], {"to": "bool"})], {"axis": 0})
    run = add("sub", [add("cumsum", [add("cast", [first], {"to": "int64"})], {"axis": 0}), const(np.int64(1))])
    return first, run
