"""Sequence and optional op handlers.

A sequence is a Seq: its length is known at compile time (an AOT plan has no room for a list that
grows at run time), its elements are ordinary tensors, run-time or known. Positions must be known at
compile time. The empty optional is ABSENT; a present optional is its value itself. A sequence or
optional graph input is fixed at compile time (constant_inputs; cuvil.InferenceSession does it from
the feed); a sequence graph output is returned as one output per element."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .helpers import ABSENT, Absent, Seq, Unsupported, ints, norm_axis, rank_of, shape_of
from .model import MAX_UNROLL, ONNX_DTYPES
from .registry import handler
from .regions import stack
from .subgraphs import inline_subgraph


def _seq(c, i):
    s = c.inp(i)
    if not isinstance(s, Seq):
        raise Unsupported(f"input {i} is not a sequence")
    return s


def _tensor(c, i):
    x = c.inp(i)
    if x is None or isinstance(x, (Seq, Absent)):
        raise Unsupported(f"input {i} is not a tensor (a sequence holds tensors)")
    return x


def _position(c, i, n, insert=False):
    """Input i as a position in a sequence of n (negative counts from the end); absent -> the end."""
    if c.inp(i) is None:
        return n if insert else n - 1
    p = ints(c.known(i, "position"))[0]
    p = p + n if p < 0 else p
    if not 0 <= p <= n - (not insert):
        raise ShapeError(f"position {ints(c.inp(i))[0]} is outside a sequence of {n}")
    return p


@handler("SequenceEmpty")
def _empty(c):
    return [Seq([], ONNX_DTYPES.get(c.attr("dtype", 1)))]


@handler("SequenceConstruct")
def _construct(c):
    return [Seq([_tensor(c, i) for i in range(len(c.node.input))])]


@handler("SequenceLength")
def _length(c):
    return np.array(len(_seq(c, 0)), np.int64)


@handler("SequenceAt")
def _at(c):
    s = _seq(c, 0)
    return s.items[_position(c, 1, len(s))]


@handler("SequenceInsert")
def _insert(c):
    s = _seq(c, 0)
    items = list(s.items)
    items.insert(_position(c, 2, len(s), insert=True), _tensor(c, 1))
    return [Seq(items, s.dtype)]


@handler("SequenceErase")
def _erase(c):
    s = _seq(c, 0)
    items = list(s.items)
    del items[_position(c, 1, len(s))]
    return [Seq(items, s.dtype)]


@handler("ConcatFromSequence")
def _concat_from(c):
    s = _seq(c, 0)
    if not s.items:
        raise ShapeError("ConcatFromSequence of an empty sequence")
    if c.attr("new_axis", 0):
        return stack(c, s.items, c.attr("axis"))
    axis = norm_axis(c.attr("axis"), rank_of(s.items[0]))
    if all(isinstance(x, np.ndarray) for x in s.items):
        return np.concatenate(s.items, axis=axis)
    return s.items[0] if len(s) == 1 else c.op("concat", list(s.items), axis=axis)


@handler("SplitToSequence")
def _split_to(c):
    x = c.inp(0)
    axis = norm_axis(c.attr("axis", 0), rank_of(x))
    n = shape_of(x)[axis]
    if not isinstance(n, int):
        raise Unsupported("SplitToSequence along a symbolic dim (the sequence's length must be known)")
    split = c.known(1, "split") if c.inp(1) is not None else None
    if split is None:
        sizes, keep = [1] * n, c.attr("keepdims", 1)
    elif np.ndim(split) == 0:
        k = int(split)
        if k <= 0:
            raise ShapeError(f"SplitToSequence: split {k} must be positive")
        sizes, keep = [k] * (n // k) + ([n % k] if n % k else []), 1
    else:
        sizes, keep = ints(split), 1
        if sum(sizes) != n or min(sizes, default=0) < 0:
            raise ShapeError(f"SplitToSequence: split {sizes} does not add up to the dim's {n}")
    if len(sizes) > MAX_UNROLL:
        raise Unsupported(f"a sequence of {len(sizes)} elements (more than {MAX_UNROLL})")
    parts, at = [], 0
    for k in sizes:
        part = np.take(x, range(at, at + k), axis=axis) if isinstance(x, np.ndarray) else \
            c.op("slice", [x], axis=axis, start=at, step=1, length=k)
        if not keep:
            sh = list(shape_of(part))
            del sh[axis]
            part = c.reshape(part, sh)
        parts.append(part)
        at += k
    return [Seq(parts, x.dtype if not isinstance(x, np.ndarray) else str(x.dtype))]


@handler("SequenceMap")
def _map(c):
    """The body run once per element (every sequence input the same length), its outputs gathered into
    sequences; tensor inputs are passed to every run as they are."""
    body = c.attr("body")
    ins = [c.inp(i) for i in range(len(c.node.input))]
    lengths = {len(x) for x in ins if isinstance(x, Seq)}
    if len(lengths) != 1:
        raise ShapeError(f"SequenceMap: the sequence inputs differ in length: {sorted(lengths)}")
    names = [i.name for i in body.input]
    runs = [inline_subgraph(c, body, {nm: x.items[k] if isinstance(x, Seq) else x for nm, x in zip(names, ins)})
            for k in range(lengths.pop())]
    return [Seq([r[j] for r in runs]) for j in range(len(body.output))]


@handler("Optional")
def _optional(c):
    x = c.inp(0)
    return x if x is not None else ABSENT


@handler("OptionalHasElement")
def _has_element(c):
    x = c.inp(0) if c.node.input else None
    return np.array(x is not None and x is not ABSENT)


@handler("OptionalGetElement")
def _get_element(c):
    x = c.inp(0)
    if x is ABSENT:
        raise ShapeError("OptionalGetElement of an empty optional")
    return [x]
