"""Data-movement op handlers.

Slice and Gather (both also fold symbolic shape vectors), GatherElements, GatherND, Pad, Tile, EyeLike,
Trilu, DepthToSpace / SpaceToDepth, OneHot, ScatterElements / ScatterND, TensorScatter, ReverseSequence
and ai.onnx.ml ArrayFeatureExtractor."""
from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ...ir import dims as D
from ...ir.graph import Value
from .helpers import Unsupported, dtype_of, ints, is_sym, maybe_int, norm_axis, rank_of, shape_of, transpose
from .model import ONNX_DTYPES
from .registry import handler, symfold


def _clamp_slice(n, s, e, st):
    if isinstance(n, int):
        if s < 0:
            s += n
        if e < 0:
            e += n
        if st > 0:
            s = min(max(s, 0), n)
            e = min(max(e, 0), n)
            length = max(0, -(-(e - s) // st))
        else:
            s = min(max(s, -1), n - 1)
            e = min(max(e, -1), n - 1)
            length = max(0, -(-(s - e) // -st))
        return s, length
    if st != 1:
        raise Unsupported("symbolic slice with a step")
    big = 2**62
    s = D.as_dim(n + s) if s < 0 else s
    e = n if e >= big else (D.as_dim(n + e) if e < 0 else e)
    return s, D.as_dim(e - s)


@handler("Slice")
@symfold("Slice")
def _slice(c, ins=None):
    x = c.inp(0)
    sh = shape_of(x)
    r = len(sh)
    if c.opset < 10:
        starts, ends = c.attr("starts"), c.attr("ends")
        axes = c.attr("axes") or list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        k = _window_length(c.inp(1), c.inp(2)) if isinstance(c.inp(1), Value) and c.g is not c.main else None
        if k is not None and k >= 0 and not is_sym(x):
            return _window(c, x)        # inside a loop body; at top level the session specializes on the start
        starts, ends = ints(c.known(1, "starts")), ints(c.known(2, "ends"))
        a = c.known(3, "axes")
        axes = ints(a) if a is not None else list(range(len(starts)))
        s = c.known(4, "steps")
        steps = ints(s) if s is not None else [1] * len(starts)
    y = x
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = norm_axis(ax, r)
        if st == 0:
            raise ShapeError("slice step 0")
        start, length = _clamp_slice(sh[ax], s, e, st)
        if isinstance(y, np.ndarray):
            idx = start + st * np.arange(length)
            y = np.take(y, idx.astype(np.int64), axis=ax)
            continue
        if isinstance(length, int) and isinstance(sh[ax], int) and start == 0 and st == 1 and length == sh[ax]:
            continue
        y = c.op("slice", [y], axis=ax, start=start, step=st, length=length)
    return y


def _peel(v):
    while isinstance(v, Value) and v.producer is not None and v.producer.op == "reshape":
        v = v.producer.inputs[0]
    return v


def _window_length(starts, ends):
    """k when ends is computed as starts + k (k a constant of one element, starts of one element)."""
    s, e = _peel(starts), _peel(ends)
    if not isinstance(e, Value) or e.producer is None or e.producer.op != "add" or D.numel(starts.shape) != 1:
        return None
    a, b = (_peel(v) for v in e.producer.inputs)
    k = b if a is s else a if b is s else None
    if not isinstance(k, Value) or not k.is_const or k.data.size != 1:
        return None
    return int(k.data.ravel()[0])


def _window(c, x):
    """Slice (inside a loop or branch) whose start is known only at run time and whose end is start + k,
    one axis, step 1 (the x[i:i+k] exporters write inside loops) -> a gather of the k entries from start. A window that does
    not fit inside the dim, a negative start included, fails the run where ONNX would return fewer
    entries: the result keeps its length k."""
    sh = shape_of(x)
    axes = ints(c.known(3, "axes")) if c.inp(3) is not None else [0]
    steps = ints(c.known(4, "steps")) if c.inp(4) is not None else [1]
    k = _window_length(c.inp(1), c.inp(2))
    if steps != [1] or len(axes) != 1:
        raise Unsupported("a run-time Slice other than x[i:i+k] along one axis with step 1")
    ax = norm_axis(axes[0], len(sh))
    if isinstance(sh[ax], int) and k > sh[ax]:
        raise Unsupported(f"a run-time Slice of {k} entries from a dim of {sh[ax]}")
    start = c.reshape(c.cast(c.inp(1), "int64"), [])
    idx = c.op("add", [start, c.op("iota", [], length=k, dtype="int64")])
    past = np.array(sh[ax], np.int64) if isinstance(sh[ax], int) else c.op("full", [], shape=[], value=sh[ax], dtype="int64")
    idx = c.op("where", [c.op("lt", [idx, np.array(0, np.int64)]), past, idx])
    return c.op("gather", [x, idx], axis=ax)


@handler("Gather")
@symfold("Gather")
def _gather(c, ins=None):
    x, idx = c.inp(0), c.inp(1)
    axis = norm_axis(c.attr("axis", 0), rank_of(x))
    if isinstance(x, np.ndarray) and isinstance(idx, np.ndarray):
        n = x.shape[axis]
        i = np.where(idx < 0, idx + n, idx)
        if i.size and (i.min() < 0 or i.max() >= n):
            raise ShapeError(f"gather index out of range for a dim of size {n}")
        if is_sym(x):
            return maybe_int(np.asarray(np.take(x, i, axis=axis), dtype=object))
        return np.take(x, i, axis=axis)
    if isinstance(idx, np.ndarray) and idx.dtype not in (np.int64, np.int32):
        idx = idx.astype(np.int64)
    return c.op("gather", [x, idx], axis=axis)


@handler("GatherElements")
def _gather_el(c):
    x, idx = c.inp(0), c.inp(1)
    return c.op("gather_elements", [x, idx], axis=norm_axis(c.attr("axis", 0), rank_of(x)))


@handler("GatherND")
def _gather_nd(c):
    x, idx = c.inp(0), c.inp(1)
    bd = c.attr("batch_dims", 0)
    if bd:      # batch dims fold into the linear index: gather from x flattened over batch + indexed dims
        xs, ishape = shape_of(x), shape_of(idx)
        m = ishape[-1]
        if not all(isinstance(d, int) for d in list(xs[:bd + (m if isinstance(m, int) else 0)]) + [m]):
            raise Unsupported("symbolic batch or index dims")
        inner = int(math.prod(xs[bd:bd + m]))
        strides = np.array([int(math.prod(xs[bd + k + 1:bd + m])) for k in range(m)], np.int64)
        dims = np.array(xs[bd:bd + m], np.int64)
        idx = c.cast(idx, "int64")
        fixed = c.op("where", [c.op("lt", [idx, c.scalar(0, "int64")]), c.op("add", [idx, dims]), idx])
        lin = c.op("reduce_sum", [c.op("mul", [fixed, strides])], axes=(len(ishape) - 1,), keepdims=False)
        nb = int(math.prod(xs[:bd]))
        boff = (np.arange(nb, dtype=np.int64) * inner).reshape(list(xs[:bd]) + [1] * (len(ishape) - 1 - bd))
        lin = c.op("add", [lin, boff])
        return c.op("gather", [c.reshape(x, [nb * inner] + list(xs[bd + m:])), lin], axis=0)
    xs, ishape = shape_of(x), shape_of(idx)
    m = ishape[-1]
    if not isinstance(m, int) or not all(isinstance(d, int) for d in xs[:m]):
        raise Unsupported("symbolic index depth")
    strides = [int(math.prod(xs[k + 1:m])) for k in range(m)]
    dims = np.array(xs[:m], np.int64)
    idx = c.cast(idx, "int64")
    if isinstance(idx, np.ndarray):
        lin = (np.where(idx < 0, idx + dims, idx) * np.array(strides)).sum(-1)
    else:
        neg = c.op("lt", [idx, c.scalar(0, "int64")])
        fixed = c.op("where", [neg, c.op("add", [idx, dims]), idx])
        lin = c.op("reduce_sum", [c.op("mul", [fixed, np.array(strides, np.int64)])], axes=(len(ishape) - 1,),
                   keepdims=False)
    flat = c.reshape(x, [int(math.prod(xs[:m]))] + list(xs[m:]))
    return c.op("gather", [flat, lin], axis=0)


@handler("Pad")
def _pad(c):
    x = c.inp(0)
    r = rank_of(x)
    mode = c.attr("mode", "constant")
    if c.opset < 11:
        pads = c.attr("pads") or c.attr("paddings")
        value = c.attr("value", 0.0)
        axes = list(range(r))
    else:
        pads = ints(c.known(1, "pads"))
        v = c.inp(2)
        if isinstance(v, Value):
            value = v             # a run-time pad value: pad with 0, then select it through a constant mask
        else:
            value = 0 if v is None or v.size == 0 else v.ravel()[0].item()
        a = c.known(3, "axes")
        axes = [norm_axis(k, r) for k in ints(a)] if a is not None else list(range(r))
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise Unsupported(f"mode {mode}")
    na = len(axes)
    if len(pads) != 2 * na:
        raise ShapeError(f"pads {pads} do not fit {na} axes")
    full = [(0, 0)] * r
    for k, ax in enumerate(axes):
        full[ax] = (pads[k], pads[k + na])
    if all(p == (0, 0) for p in full):
        return x
    if mode == "wrap":
        if any(lo < 0 or hi < 0 for lo, hi in full) or any(
                (lo or hi) and (not isinstance(shape_of(x)[k], int) or max(lo, hi) > shape_of(x)[k])
                for k, (lo, hi) in enumerate(full)):
            raise Unsupported("wrap padding by more than the dim, or cropping")
        for k, (lo, hi) in enumerate(full):
            n = shape_of(x)[k]
            parts = ([c.op("slice", [x], axis=k, start=n - lo, length=lo)] if lo else []) + [x] + (
                [c.op("slice", [x], axis=k, start=0, length=hi)] if hi else [])
            x = parts[0] if len(parts) == 1 else c.op("concat", parts, axis=k)
        return x
    if isinstance(value, Value):
        if mode != "constant" or not all(isinstance(d, int) for d in shape_of(x)):
            raise Unsupported("run-time pad value")
        y = c.op("pad", [x], pads=full, value=0, mode=mode)
        mask = np.pad(np.ones(shape_of(x), bool), [(max(lo, 0), max(hi, 0)) for lo, hi in full])
        mask = mask[tuple(slice(max(-lo, 0), mask.shape[k] - max(-hi, 0)) for k, (lo, hi) in enumerate(full))]
        return c.op("where", [mask, y, c.reshape(value, [])])
    return c.op("pad", [x], pads=full, value=value, mode=mode)


@handler("Tile")
def _tile(c):
    x = c.inp(0)
    reps = ints(c.known(1, "repeats"))
    sh = shape_of(x)
    if len(reps) != len(sh):
        raise ShapeError(f"repeats {reps} do not fit rank {len(sh)}")
    if all(r == 1 for r in reps):
        return x
    inter, exp_, final = [], [], []
    for d, r in zip(sh, reps):
        inter += [1, d]
        exp_ += [r, d]
        final.append(D.as_dim(d * r))
    y = c.reshape(x, inter)
    y = c.op("expand", [y], shape=tuple(exp_))
    return c.reshape(y, final)


@handler("EyeLike")
def _eyelike(c):
    x = c.inp(0)
    sh = shape_of(x)
    if not all(isinstance(d, int) for d in sh):
        raise Unsupported("symbolic shape")
    dt = c.attr("dtype")
    dt = ONNX_DTYPES.get(dt) if dt is not None else dtype_of(x)
    if dt is None:
        raise Unsupported("dtype")
    return np.eye(sh[0], sh[1], k=c.attr("k", 0), dtype=dt)


@handler("Trilu")
def _trilu(c):
    x = c.inp(0)
    k = c.known(1, "k")
    k = 0 if k is None else int(np.asarray(k).ravel()[0])
    sh = shape_of(x)
    n, m = sh[-2], sh[-1]
    if not (isinstance(n, int) and isinstance(m, int)):
        raise Unsupported("symbolic matrix dims")
    ones = np.ones((n, m), bool)
    mask = np.triu(ones, k) if c.attr("upper", 1) else np.tril(ones, k)
    return c.op("where", [mask, x, c.scalar(0, dtype_of(x))])


@handler("DepthToSpace")
def _d2s(c):
    x = c.inp(0)
    b = c.attr("blocksize")
    N, C, H, W = shape_of(x)
    if c.attr("mode", "DCR") == "DCR":
        y = c.reshape(x, [N, b, b, C // (b * b), H, W])
        y = transpose(c, y, (0, 3, 4, 1, 5, 2))
    else:
        y = c.reshape(x, [N, C // (b * b), b, b, H, W])
        y = transpose(c, y, (0, 1, 4, 2, 5, 3))
    return c.reshape(y, [N, C // (b * b), H * b, W * b])


@handler("SpaceToDepth")
def _s2d(c):
    x = c.inp(0)
    b = c.attr("blocksize")
    N, C, H, W = shape_of(x)
    y = c.reshape(x, [N, C, H // b, b, W // b, b])
    y = transpose(c, y, (0, 3, 5, 1, 2, 4) if c.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4))
    return c.reshape(y, [N, C * b * b, H // b, W // b])


@handler("OneHot")
def _onehot(c):
    idx, depth, values = c.inp(0), c.known(1, "depth"), c.inp(2)
    depth = int(np.asarray(depth).ravel()[0])
    r = rank_of(idx) + 1
    axis = norm_axis(c.attr("axis", -1), r)
    dt = dtype_of(values)
    idx = c.cast(idx, "int64")
    if isinstance(idx, np.ndarray):
        idx = c.val(idx)
    idx = c.op("where", [c.op("lt", [idx, c.scalar(0, "int64")]), c.op("add", [idx, c.scalar(depth, "int64")]), idx])
    sh = list(shape_of(idx))
    sh.insert(axis, 1)
    idx = c.reshape(idx, sh)
    io = np.arange(depth, dtype=np.int64).reshape([depth] + [1] * (r - axis - 1))
    hit = c.op("eq", [idx, io])
    if isinstance(values, np.ndarray):
        off, on = values.ravel()[0], values.ravel()[1]
        return c.op("where", [hit, np.array(on, dt), np.array(off, dt)])
    off = c.reshape(c.op("slice", [values], axis=0, start=0, step=1, length=1), [])
    on = c.reshape(c.op("slice", [values], axis=0, start=1, step=1, length=1), [])
    return c.op("where", [hit, on, off])


@handler("ScatterElements", "Scatter")
def _scatter_el(c):
    x, idx, upd = c.inp(0), c.inp(1), c.inp(2)
    return c.op("scatter_elements", [x, idx, upd], axis=norm_axis(c.attr("axis", 0), rank_of(x)),
                reduction=c.attr("reduction", "none"))


@handler("ScatterND")
def _scatter_nd(c):
    return c.op("scatter_nd", [c.inp(0), c.inp(1), c.inp(2)], reduction=c.attr("reduction", "none"))


@handler("TensorScatter")
def _tensor_scatter(c):
    """present[b, .., s] = update[b, .., (s - w[b]) (mod S)] where that index is < the update length."""
    cache, upd, w = c.inp(0), c.inp(1), c.inp(2)
    mode = c.attr("mode", "linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    shp = list(shape_of(cache))
    r = len(shp)
    a = c.attr("axis", -2) % r
    S, Sn = shp[a], shape_of(upd)[a]
    if not all(isinstance(d, int) for d in shp) or not isinstance(Sn, int):
        raise Unsupported("symbolic shapes")
    s = c.reshape(c.op("iota", [], length=S, dtype="int64"), [S if i == a else 1 for i in range(r)])
    w = c.cast(w, "int64") if w is not None else np.zeros([shp[0]], np.int64)
    j = c.op("sub", [s, c.reshape(w, [shp[0]] + [1] * (r - 1))])
    if mode == "circular":
        j = c.op("mod", [j, c.scalar(S, "int64")])
    valid = c.op("and", [c.op("ge", [j, c.scalar(0, "int64")]), c.op("lt", [j, c.scalar(Sn, "int64")])])
    jc = c.op("expand", [c.op("clip", [j], min=0.0, max=float(Sn - 1))], shape=tuple(shp))
    return c.op("where", [c.op("expand", [valid], shape=tuple(shp)), c.op("gather_elements", [upd, jc], axis=a), cache])


@handler("ReverseSequence")
def _reverse_sequence(c):
    """out[t, b] = x[len[b] - 1 - t, b] for t < len[b], else x[t, b]: one gather_elements over time."""
    x, lens = c.inp(0), c.cast(c.inp(1), "int64")
    ta, ba = c.attr("time_axis", 0), c.attr("batch_axis", 1)
    shp = shape_of(x)
    r = len(shp)
    T, B = shp[ta], shp[ba]
    tshape, bshape = [1] * r, [1] * r
    tshape[ta], bshape[ba] = T, B
    t = c.reshape(c.op("iota", [], length=T, dtype="int64"), tshape)
    n = c.reshape(lens, bshape)
    rev = c.op("sub", [c.op("sub", [n, c.scalar(1, "int64")]), t])
    idx = c.op("where", [c.op("lt", [t, n]), rev, c.op("expand", [t], shape=tuple(
        T if i == ta else B if i == ba else 1 for i in range(r)))])
    idx = c.op("expand", [idx], shape=tuple(shp))
    return c.op("gather_elements", [x, idx], axis=ta)


@handler("ai.onnx.ml:ArrayFeatureExtractor")
def _array_feature_extractor(c):
    x, idx = c.inp(0), c.cast(c.inp(1), "int64")
    return c.op("gather", [x, c.reshape(idx, [D.numel(shape_of(idx))]) if rank_of(idx) != 1 else idx], axis=rank_of(x) - 1)
