"""Ops that move data: reshape, transpose, expand, slice, bind_dim, concat, pad, gather, scatter, iota, full, relayout."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .. import dims as D
from ..types import TensorType
from .registry import REQUIRED, OpDef, declare
from ._shape import norm_axis


def _reshape_infer(types, attrs, inputs):
    t = types[0]
    shape = tuple(D.as_dim(d) for d in attrs["shape"])
    a, b = D.numel(t.shape), D.numel(shape)
    if not D.dims_equal(a, b):
        raise ShapeError(f"reshape: cannot view {t} ({a} elements) as {list(shape)} ({b} elements)")
    attrs["shape"] = shape
    return [TensorType(shape, t.dtype)]


declare(OpDef("reshape", {"shape": REQUIRED}, _reshape_infer,
              lambda xs, a: xs[0].reshape(a["shape"]), kind="movement"))


# the transposes between NCHW and NHWC: either may read (in_layout) or write (layout) its NCHW side
# channel-blocked (passes/layout.py), a ConvNeXt block's way into and out of its channels-last MLP
TO_NHWC, FROM_NHWC = (0, 2, 3, 1), (0, 3, 1, 2)


def _transpose_infer(types, attrs, inputs):
    t = types[0]
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(t.rank)):
        raise ShapeError(f"transpose: perm {perm} is not a permutation of rank {t.rank}")
    attrs["perm"] = perm
    out = TensorType(tuple(t.shape[p] for p in perm), t.dtype)
    for key, side, nchw in (("in_layout", TO_NHWC, t), ("layout", FROM_NHWC, out)):
        block = layout_block(attrs.get(key, "nchw"))
        if block and (perm != side or nchw.dtype != "float32" or not isinstance(nchw.shape[1], int)
                      or nchw.shape[1] % block):
            raise ShapeError(f"transpose: {key}={attrs[key]} takes perm {side} of a float32 NCHW tensor whose "
                             f"channels fill blocks of {block}; got perm {perm} of {t}")
    return [out]


declare(OpDef("transpose", {"perm": REQUIRED, "in_layout": "nchw", "layout": "nchw"}, _transpose_infer,
              lambda xs, a: np.ascontiguousarray(np.transpose(xs[0], a["perm"])), kind="movement"))


# The physical layouts of a 4-d float tensor (passes/layout.py): NCHW, or channel-blocked "nchw<B>c",
# [N][C/B][H][W][B] with B the target's vector width in floats. The IR's shapes and the reference
# interpreter stay logical (NCHW); a layout is how the C code stores the value, so relayout is the
# identity to the interpreter and a copy between layouts in C.
LAYOUTS = ("nchw", "nchw4c", "nchw8c", "nchw16c")


def layout_block(layout: str) -> int:
    """Channels per block of a layout: 0 for NCHW. Anything not in LAYOUTS is an error (a layout's
    block is rendered into generated C)."""
    if layout not in LAYOUTS:
        raise ShapeError(f"unknown layout {layout!r} (one of {', '.join(LAYOUTS)})")
    return 0 if layout == "nchw" else int(layout[4:-1])


def _relayout_infer(types, attrs, inputs):
    for k in ("to", "from"):
        if attrs[k] not in LAYOUTS:
            raise ShapeError(f"relayout: unknown layout {attrs[k]!r} (one of {', '.join(LAYOUTS)})")
    blocks = sorted((layout_block(attrs["from"]), layout_block(attrs["to"])))
    if blocks[0] != 0 or blocks[1] == 0:
        raise ShapeError(f"relayout: converts between nchw and a blocked layout, not {attrs['from']} -> {attrs['to']}")
    t = types[0]
    if t.rank != 4 or t.dtype != "float32" or not isinstance(t.shape[1], int) or t.shape[1] % blocks[1]:
        raise ShapeError(f"relayout: expects a float32 [N, C, H, W] tensor with C a multiple of {blocks[1]}, got {t}")
    return [t]


declare(OpDef("relayout", {"to": REQUIRED, "from": "nchw"}, _relayout_infer, lambda xs, a: xs[0].copy(), kind="layout"))


def _expand_infer(types, attrs, inputs):
    t = types[0]
    shape = tuple(D.as_dim(d) for d in attrs["shape"])
    if len(shape) < t.rank:
        raise ShapeError(f"expand: target rank {len(shape)} below input rank {t.rank}")
    for d, s in zip(t.shape[::-1], shape[::-1]):
        if not (d == 1 or D.dims_equal(d, s)):
            raise ShapeError(f"expand: cannot broadcast {t} to {list(shape)}")
    attrs["shape"] = shape
    return [TensorType(shape, t.dtype)]


declare(OpDef("expand", {"shape": REQUIRED}, _expand_infer,
              lambda xs, a: np.ascontiguousarray(np.broadcast_to(xs[0], a["shape"])), kind="movement"))


def _slice_infer(types, attrs, inputs):
    """Canonical slice: out[..., i, ...] = x[..., start + i*step, ...] for i < length."""
    t = types[0]
    ax = norm_axis(attrs["axis"], t.rank)
    attrs["axis"] = ax
    if attrs["step"] == 0:
        raise ShapeError("slice: step must not be 0")
    shape = list(t.shape)
    shape[ax] = attrs["length"]
    return [TensorType(tuple(shape), t.dtype)]


def _slice_ref(xs, a):
    x, ax = xs[0], a["axis"]
    idx = a["start"] + a["step"] * np.arange(a["length"], dtype=np.int64)
    return np.take(x, idx, axis=ax)


declare(OpDef("slice", {"axis": REQUIRED, "start": REQUIRED, "step": 1, "length": REQUIRED},
              _slice_infer, _slice_ref, kind="movement"))


def _bind_dim_infer(types, attrs, inputs):
    """x (its `axis` sized for the most it can hold) and a 0-d int64 count -> x's first `count` entries
    along axis, that dim now the data-dependent symbol `symbol` (nonzero's row count, unique's size)."""
    t, c = types
    ax = norm_axis(attrs["axis"], t.rank)
    attrs["axis"] = ax
    if c.rank != 0 or c.dtype != "int64":
        raise ShapeError(f"bind_dim: the count must be a 0-d int64, got {c}")
    if not isinstance(attrs["symbol"], str) or not attrs["symbol"].isidentifier():
        raise ShapeError(f"bind_dim: symbol must be an identifier, got {attrs['symbol']!r}")
    shape = list(t.shape)
    shape[ax] = D.Sym(attrs["symbol"])
    return [TensorType(tuple(shape), t.dtype)]


declare(OpDef("bind_dim", {"symbol": REQUIRED, "axis": 0}, _bind_dim_infer,
              lambda xs, a: np.take(xs[0], np.arange(int(xs[1])), axis=a["axis"]), kind="movement"))


def _concat_infer(types, attrs, inputs):
    t0 = types[0]
    ax = norm_axis(attrs["axis"], t0.rank)
    attrs["axis"] = ax
    total = 0
    for t in types:
        if t.dtype != t0.dtype or t.rank != t0.rank:
            raise ShapeError(f"concat: inputs {t0} and {t} differ in dtype or rank")
        total = total + t.shape[ax]
    shape = list(t0.shape)
    shape[ax] = D.as_dim(total)
    return [TensorType(tuple(shape), t0.dtype)]


declare(OpDef("concat", {"axis": REQUIRED}, _concat_infer,
              lambda xs, a: np.concatenate(xs, axis=a["axis"]), kind="movement"))


def _pad_infer(types, attrs, inputs):
    t = types[0]
    pads = tuple(tuple(p) for p in attrs["pads"])
    if len(pads) != t.rank:
        raise ShapeError(f"pad: {len(pads)} (lo, hi) pairs for rank {t.rank}")
    if attrs["mode"] not in ("constant", "reflect", "edge"):
        raise ShapeError(f"pad: mode {attrs['mode']!r} not one of constant, reflect, edge")
    attrs["pads"] = pads
    return [TensorType(tuple(D.as_dim(d + lo + hi) for d, (lo, hi) in zip(t.shape, pads)), t.dtype)]


def _pad_ref(xs, a):
    x = xs[0]
    # negative pads crop
    sl = tuple(slice(max(-lo, 0), d - max(-hi, 0)) for d, (lo, hi) in zip(x.shape, a["pads"]))
    x = x[sl]
    if x.ndim == 0:   # nothing to pad (np.pad rejects an empty pad list)
        return x.copy()
    pw = [(max(lo, 0), max(hi, 0)) for lo, hi in a["pads"]]
    if a["mode"] == "constant":
        return np.pad(x, pw, mode="constant", constant_values=np.array(a["value"]).astype(x.dtype))
    return np.pad(x, pw, mode=a["mode"])


declare(OpDef("pad", {"pads": REQUIRED, "value": 0.0, "mode": "constant"}, _pad_infer, _pad_ref, kind="movement"))


def _gather_infer(types, attrs, inputs):
    x, idx = types
    if idx.dtype not in ("int64", "int32"):
        raise ShapeError(f"gather: indices must be int64 or int32, got {idx.dtype}")
    ax = norm_axis(attrs["axis"], x.rank)
    attrs["axis"] = ax
    return [TensorType(x.shape[:ax] + idx.shape + x.shape[ax + 1:], x.dtype)]


def _gather_ref(xs, a):
    x, idx = xs
    n = x.shape[a["axis"]]
    i = np.where(idx < 0, idx + n, idx)
    if i.size and (i.min() < 0 or i.max() >= n):
        raise IndexError(f"gather: index out of range [0, {n})")
    return np.take(x, i, axis=a["axis"])


declare(OpDef("gather", {"axis": 0}, _gather_infer, _gather_ref, kind="gather"))


def _gather_elements_infer(types, attrs, inputs):
    x, idx = types
    if idx.rank != x.rank:
        raise ShapeError(f"gather_elements: index rank {idx.rank} != data rank {x.rank}")
    attrs["axis"] = norm_axis(attrs["axis"], x.rank)
    for k, (i, d) in enumerate(zip(idx.shape, x.shape)):   # index dims past the data's would read out of bounds
        if k != attrs["axis"] and isinstance(i, int) and isinstance(d, int) and i > d:
            raise ShapeError(f"gather_elements: index {idx} is larger than data {x} in dim {k}")
    return [TensorType(idx.shape, x.dtype)]


def _gather_elements_ref(xs, a):
    x, idx = xs
    ax, n = a["axis"], x.shape[a["axis"]]
    # torch.gather semantics: other dims of the index may be shorter than the data's (no broadcasting)
    x = x[tuple(slice(None) if k == ax else slice(0, m) for k, m in enumerate(idx.shape))]
    return np.take_along_axis(x, np.where(idx < 0, idx + n, idx), axis=ax)


declare(OpDef("gather_elements", {"axis": 0}, _gather_elements_infer, _gather_elements_ref, kind="gather"))


SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_elements_infer(types, attrs, inputs):
    x, idx, upd = types
    if idx.rank != x.rank or idx.shape != upd.shape or x.dtype != upd.dtype:
        raise ShapeError(f"scatter_elements: data {x}, indices {idx}, updates {upd} do not fit")
    if idx.dtype not in ("int64", "int32"):
        raise ShapeError(f"scatter_elements: indices must be int64 or int32, got {idx.dtype}")
    if attrs["reduction"] not in SCATTER_REDUCTIONS:
        raise ShapeError(f"scatter_elements: reduction {attrs['reduction']!r} not one of {SCATTER_REDUCTIONS}")
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
    if attrs["reduction"] not in SCATTER_REDUCTIONS:
        raise ShapeError(f"scatter_nd: reduction {attrs['reduction']!r} not one of {SCATTER_REDUCTIONS}")
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


def _iota_infer(types, attrs, inputs):
    _no_negative("iota", [attrs["length"]])
    return [TensorType((attrs["length"],), attrs["dtype"])]


def _no_negative(op, dims):
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ShapeError(f"{op}: negative size in {list(dims)}")


declare(OpDef("iota", {"length": REQUIRED, "start": 0, "step": 1, "dtype": "int64"}, _iota_infer,
              lambda xs, a: (a["start"] + a["step"] * np.arange(a["length"], dtype=np.float64)).astype(a["dtype"]),
              kind="source"))


def _full_infer(types, attrs, inputs):
    _no_negative("full", attrs["shape"])
    return [TensorType(tuple(attrs["shape"]), attrs["dtype"])]


declare(OpDef("full", {"shape": REQUIRED, "value": 0.0, "dtype": "float32"}, _full_infer,
              lambda xs, a: np.full(a["shape"], a["value"], dtype=a["dtype"]), kind="source"))
