"""Normalisation op handlers.

BatchNormalization (inference, and training mode), Instance / Layer / RMS / Group / Lp normalisation,
LRN, and Softmax / LogSoftmax / Hardmax (opset < 13: over the input flattened to 2-D at the axis)."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from .helpers import Unsupported, contig, dtype_of, norm_axis, rank_of, shape_of
from .registry import handler


# ---- normalisation --------------------------------------------------------------------------------
@handler("BatchNormalization")
def _bn(c):
    if c.attr("training_mode", 0) or any(o for o in c.node.output[1:]):
        return _bn_training(c)
    x = c.inp(0)
    if c.opset < 7 and c.attr("is_test", 0) == 0 and False:
        raise Unsupported("training")
    params = [c.inp(i) for i in range(1, 5)]
    return c.op("batch_norm", [x] + params, eps=c.attr("epsilon", 1e-5))


def _bn_training(c):
    """Batch statistics normalise; the running mean / var outputs are updated with momentum."""
    x, scale, bias, mean, var = (c.inp(i) for i in range(5))
    if c.opset < 14:
        raise Unsupported("training mode before opset 14")
    r, dt = rank_of(x), dtype_of(x)
    axes = (0,) + tuple(range(2, r))
    m = c.op("reduce_mean", [x], axes=axes, keepdims=True)
    d = c.op("sub", [x, m])
    v = c.op("reduce_mean", [c.op("mul", [d, d])], axes=axes, keepdims=True)
    ps = [shape_of(x)[1]] + [1] * (r - 2)
    y = c.op("div", [d, c.op("sqrt", [c.op("add", [v, c.scalar(c.attr("epsilon", 1e-5), dt)])])])
    y = c.op("add", [c.op("mul", [y, c.reshape(scale, ps)]), c.reshape(bias, ps)])
    mom = c.attr("momentum", 0.9)
    C = shape_of(x)[1]
    upd = [c.op("add", [c.op("mul", [s0, c.scalar(mom, dt)]), c.op("mul", [c.reshape(s1, [C]), c.scalar(1 - mom, dt)])])
           for s0, s1 in ((mean, m), (var, v))]
    return [y] + upd


@handler("InstanceNormalization")
def _instnorm(c):
    x, s, b = c.inp(0), c.inp(1), c.inp(2)
    r = rank_of(x)
    y = c.op("layer_norm", [c.reshape(x, list(shape_of(x)[:2]) + [D.numel(shape_of(x)[2:])])], axis=2,
             eps=c.attr("epsilon", 1e-5))
    y = c.reshape(y, shape_of(x))
    ps = [shape_of(x)[1]] + [1] * (r - 2)
    return c.op("add", [c.op("mul", [y, c.reshape(s, ps)]), c.reshape(b, ps)])


def _expand_param(c, p, inner):
    if p is None:
        return None
    if D.dims_equal(D.numel(shape_of(p)), D.numel(inner)):
        return p
    if isinstance(p, np.ndarray):
        return contig(np.broadcast_to(p, tuple(int(d) for d in inner)))
    return c.op("expand", [p], shape=tuple(inner))


@handler("LayerNormalization")
def _layernorm(c):
    x, s, b = c.inp(0), c.inp(1), c.inp(2)
    r = rank_of(x)
    axis = norm_axis(c.attr("axis", -1), r)
    eps = c.attr("epsilon", 1e-5)
    inner = shape_of(x)[axis:]
    want_stats = any(o for o in c.node.output[1:])
    if not want_stats and dtype_of(x) == "float32":
        return c.op("layer_norm", [x, _expand_param(c, s, inner)] + ([_expand_param(c, b, inner)] if b is not None else []),
                    axis=axis, eps=eps)
    dt = dtype_of(x)
    axes = tuple(range(axis, r))
    mu = c.op("reduce_mean", [x], axes=axes, keepdims=True)
    d = c.op("sub", [x, mu])
    var = c.op("reduce_mean", [c.op("mul", [d, d])], axes=axes, keepdims=True)
    inv = c.op("rsqrt", [c.op("add", [var, c.scalar(eps, dt)])])
    y = c.op("mul", [c.op("mul", [d, inv]), s])
    if b is not None:
        y = c.op("add", [y, b])
    return [y, mu, inv]


@handler("RMSNormalization")
def _rmsnorm(c):
    x, s = c.inp(0), c.inp(1)
    axis = norm_axis(c.attr("axis", -1), rank_of(x))
    inner = shape_of(x)[axis:]
    if dtype_of(x) != "float32":
        raise Unsupported("non-float32")
    return c.op("rms_norm", [x, _expand_param(c, s, inner)], axis=axis, eps=c.attr("epsilon", 1e-5))


@handler("GroupNormalization")
def _groupnorm(c):
    x, s, b = c.inp(0), c.inp(1), c.inp(2)
    G = c.attr("num_groups")
    sh = shape_of(x)
    N, C = sh[:2]
    if not isinstance(C, int):
        raise Unsupported("symbolic channels")
    y = c.reshape(x, [N, G, D.numel([C // G] + list(sh[2:]))])
    y = c.op("layer_norm", [y], axis=2, eps=c.attr("epsilon", 1e-5))
    y = c.reshape(y, sh)
    if c.opset < 21:
        idx = np.arange(C) // (C // G)
        s = np.take(s, idx) if isinstance(s, np.ndarray) else c.op("gather", [s, idx], axis=0)
        b = np.take(b, idx) if isinstance(b, np.ndarray) else c.op("gather", [b, idx], axis=0)
    ps = [C] + [1] * (len(sh) - 2)
    return c.op("add", [c.op("mul", [y, c.reshape(s, ps)]), c.reshape(b, ps)])


@handler("LpNormalization")
def _lpnorm(c):
    x = c.inp(0)
    axis = norm_axis(c.attr("axis", -1), rank_of(x))
    p = c.attr("p", 2)
    if p == 1:
        n = c.op("reduce_sum", [c.op("abs", [x])], axes=(axis,), keepdims=True)
    elif p == 2:
        n = c.op("sqrt", [c.op("reduce_sum", [c.op("mul", [x, x])], axes=(axis,), keepdims=True)])
    else:
        raise Unsupported(f"p={p}")
    zero = c.op("eq", [n, c.scalar(0, dtype_of(x))])          # a zero vector stays zero (onnx's reference)
    return c.op("div", [x, c.op("where", [zero, c.scalar(1, dtype_of(x)), n])])


@handler("LRN")
def _lrn(c):
    x = c.inp(0)
    dt = dtype_of(x)
    size = c.attr("size")
    alpha, beta, bias = c.attr("alpha", 1e-4), c.attr("beta", 0.75), c.attr("bias", 1.0)
    C = shape_of(x)[1]
    sq = c.op("mul", [x, x])
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    p = c.op("pad", [sq], pads=[(0, 0), (lo, hi)] + [(0, 0)] * (rank_of(x) - 2), value=0.0)
    acc = None
    for k in range(size):
        s = c.op("slice", [p], axis=1, start=k, step=1, length=C)
        acc = s if acc is None else c.op("add", [acc, s])
    den = c.op("add", [c.op("mul", [acc, c.scalar(alpha / size, dt)]), c.scalar(bias, dt)])
    return c.op("div", [x, c.op("pow", [den, c.scalar(beta, dt)])])


def _softmax(kind):
    def h(c):
        x = c.inp(0)
        r = rank_of(x)
        if c.opset < 13:
            axis = norm_axis(c.attr("axis", 1), r)
            sh = shape_of(x)
            x2 = c.reshape(x, [D.numel(sh[:axis]), D.numel(sh[axis:])])
            y = _softmax_axis(c, kind, x2, 1)
            return c.reshape(y, sh)
        return _softmax_axis(c, kind, x, norm_axis(c.attr("axis", -1), r))
    return h


def _softmax_axis(c, kind, x, axis):
    if kind == "hardmax":
        am = c.op("argmax", [x], axis=axis, keepdims=True)
        n = shape_of(x)[axis]
        io = c.op("iota", [], length=n, dtype="int64")
        io = c.reshape(io, [n] + [1] * (rank_of(x) - axis - 1))
        return c.op("cast", [c.op("eq", [am, io])], to=dtype_of(x))
    return c.op(kind, [x], axis=axis)


handler("Softmax")(_softmax("softmax"))
handler("LogSoftmax")(_softmax("log_softmax"))
handler("Hardmax")(_softmax("hardmax"))
