"""Linear algebra, convolution, pooling, and the composite ops kernels care about
(softmax, layer/RMS norm, batch norm). Composites keep a numpy reference that is their
decomposition's meaning; passes may match them to fused kernels."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .. import dims as D
from ..types import TensorType
from .registry import OpDef, declare
from ._shape import broadcast, norm_axis
from .fused import ACTIVATIONS, check_range



def _float(name, t):
    if not t.dtype.startswith(("float", "bfloat")):
        raise ShapeError(f"{name} expects float tensors, got {t.dtype}")


# ---- matmul: numpy semantics (batch dims broadcast) -----------------------------------
def _matmul_infer(types, attrs, inputs):
    a, b = types
    check_range("matmul", attrs)
    if a.dtype != b.dtype:
        raise ShapeError(f"matmul: dtypes differ ({a.dtype} vs {b.dtype})")
    if a.rank < 1 or b.rank < 1:
        raise ShapeError("matmul: operands must have rank >= 1")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.rank >= 2 else b.shape[0]
    if not D.dims_equal(ka, kb):
        raise ShapeError(f"matmul: inner dims differ: {a} @ {b}")
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    m = (a.shape[-2],) if a.rank >= 2 else ()
    n = (b.shape[-1],) if b.rank >= 2 else ()
    return [TensorType(batch + m + n, a.dtype)]


def _matmul_ref(xs, a):
    x, y = xs
    if x.dtype.kind == "f":
        return np.matmul(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)
    return np.matmul(x, y).astype(x.dtype)


declare(OpDef("matmul", {"int8_range": None}, _matmul_infer, _matmul_ref, kind="matmul"))   # fused.py: int8_range


# ---- grouped_matmul: rows of x sorted by group, group e's rows [offs[e-1], offs[e]) times w[e] ---------
# (mixture-of-experts layers: each expert's tokens as one GEMM); rows past the last offset are zeros.
# Offsets are clamped into [previous offset, rows], so malformed ones never read outside x.
def _grouped_matmul_infer(types, attrs, inputs):
    x, w, offs = types
    if x.rank != 2 or w.rank != 3 or offs.rank != 1 or offs.dtype not in ("int32", "int64"):
        raise ShapeError(f"grouped_matmul: expects x[S, K], w[E, K, N], int offs[E]; got {x}, {w}, {offs}")
    if x.dtype != w.dtype or not D.dims_equal(x.shape[1], w.shape[1]) or not D.dims_equal(w.shape[0], offs.shape[0]):
        raise ShapeError(f"grouped_matmul: x {x}, w {w} and offs {offs} do not agree (K, E or dtype)")
    return [TensorType((x.shape[0], w.shape[2]), x.dtype)]


def _grouped_matmul_ref(xs, a):
    x, w, offs = xs
    out = np.zeros((x.shape[0], w.shape[2]), np.float64)
    start = 0
    for e, end in enumerate(offs.tolist()):
        end = min(max(int(end), start), x.shape[0])
        out[start:end] = x[start:end].astype(np.float64) @ w[e].astype(np.float64)
        start = end
    return out.astype(x.dtype)


declare(OpDef("grouped_matmul", {}, _grouped_matmul_infer, _grouped_matmul_ref))


# ---- convolution over N spatial dims, NCHW ------------------------------------------
def _conv_out(n, k, s, lo, hi, d):
    return D.as_dim((n + lo + hi - d * (k - 1) - 1) // s + 1) if isinstance(n, int) else \
        D.as_dim(__import__("sympy").floor((n + lo + hi - d * (k - 1) - 1) / s) + 1)


def _spatial(attrs, nsp, kernel):
    attrs["strides"] = tuple(attrs["strides"] or (1,) * nsp)
    attrs["dilations"] = tuple(attrs["dilations"] or (1,) * nsp)
    attrs["pads"] = tuple(tuple(p) for p in (attrs["pads"] or [(0, 0)] * nsp))
    if not (len(attrs["strides"]) == len(attrs["dilations"]) == len(attrs["pads"]) == len(kernel) == nsp):
        raise ShapeError(f"convolution attributes do not match {nsp} spatial dims: {attrs}")


def _conv_infer(types, attrs, inputs):
    x, w = types[0], types[1]
    _float("conv", x)
    nsp = x.rank - 2
    if nsp < 1 or w.rank != x.rank:
        raise ShapeError(f"conv: input {x} and weight {w} ranks do not fit")
    g = attrs["groups"]
    if not D.dims_equal(x.shape[1], w.shape[1] * g):
        raise ShapeError(f"conv: input channels {x.shape[1]} != weight in-channels {w.shape[1]} x groups {g}")
    if isinstance(w.shape[0], int) and w.shape[0] % g:
        raise ShapeError(f"conv: {w.shape[0]} output channels are not divisible by groups {g}")
    if len(types) > 2 and types[2] is not None and types[2].shape != (w.shape[0],):
        raise ShapeError(f"conv: bias shape {types[2].shape}, expected ({w.shape[0]},)")
    if attrs["act"] not in ACTIVATIONS:
        raise ShapeError(f"conv: unknown act {attrs['act']!r}")
    for key in ("int8_range", "int8_res_range", "int8_res_seen"):
        check_range("conv", attrs, key)
    if attrs.get("int8_res_range") is not None and (len(types) < 4 or types[3] is None):
        raise ShapeError("conv: int8_res_range without a residual to read as bytes")
    _check_byte_out("conv", attrs)
    if attrs.get("int8_in", 0) not in (0, 1) or (attrs.get("int8_in") and attrs.get("int8_range") is None):
        raise ShapeError(f"conv: int8_in {attrs.get('int8_in')!r} is 0, or 1 with an int8_range")
    for key in ("bf16_in", "bf16_res", "bf16_out"):
        if attrs.get(key, 0) not in (0, 1) or (attrs.get(key) and attrs.get("bf16_act", 0) not in (1, 2)):
            raise ShapeError(f"conv: {key} {attrs.get(key)!r} is 0, or 1 with a bf16_act")
    if attrs.get("bf16_res") and (len(types) < 4 or types[3] is None):
        raise ShapeError("conv: bf16_res without a residual to read as bf16")
    _spatial(attrs, nsp, w.shape[2:])
    out = [_conv_out(n, k, s, lo, hi, d) for n, k, s, (lo, hi), d in
           zip(x.shape[2:], w.shape[2:], attrs["strides"], attrs["pads"], attrs["dilations"])]
    if any(isinstance(o, int) and o <= 0 for o in out):
        raise ShapeError(f"conv: output spatial size {out} is empty for input {x} and kernel {w.shape[2:]}")
    y = (x.shape[0], w.shape[0], *out)
    r = types[3] if len(types) > 3 else None
    if r is not None and not (r.rank == len(y) and all(D.dims_equal(a, b) for a, b in zip(r.shape, y))):
        raise ShapeError(f"conv: residual shape {list(r.shape)}, expected the output's {list(y)}")
    _check_gate(types[4] if len(types) > 4 else None, x)
    if attrs.get("mean_out", 0) not in (0, 1) or (attrs.get("mean_out") and nsp != 2):
        raise ShapeError(f"conv: mean_out {attrs.get('mean_out')!r} is 0, or 1 for a 2-d conv")
    mean = [TensorType((y[0], y[1], 1, 1), x.dtype)] if attrs.get("mean_out") else []
    return [TensorType(y, x.dtype)] + mean


def _check_gate(g, x):
    """A conv's gate (passes/squeeze_excite.py): one scale per image (or one for all) and input channel."""
    if g is None:
        return
    if not (g.rank == 4 and D.dims_equal(g.shape[1], x.shape[1]) and tuple(g.shape[2:]) == (1, 1)
            and (g.shape[0] == 1 or D.dims_equal(g.shape[0], x.shape[0])) and g.dtype == x.dtype):
        raise ShapeError(f"conv: gate {g}, expected {x.dtype}[{x.shape[0]} or 1, {x.shape[1]}, 1, 1]")


def _check_byte_out(op, attrs):
    """int8_out (a byte image [hp, wp, ph, pw] that reaches C as constants) and its int8_out_range."""
    check_range(op, attrs, "int8_out_range")
    img = attrs.get("int8_out")
    if img is not None and not (isinstance(img, (list, tuple)) and len(img) == 4 and attrs.get("int8_out_range")
                                and all(isinstance(v, int) and 0 <= v < 1 << 20 for v in img)):
        raise ShapeError(f"{op}: int8_out {img!r} is None or [hp, wp, ph, pw] with an int8_out_range")


def _conv_ref(xs, a):
    x, w = xs[0].astype(np.float64), xs[1].astype(np.float64)
    if len(xs) > 4 and xs[4] is not None:       # a gate folded in (passes/squeeze_excite.py): the input scaled
        x = x * xs[4].astype(x.dtype)
    b = xs[2] if len(xs) > 2 else None
    nsp = x.ndim - 2
    pads = [(0, 0), (0, 0)] + [tuple(p) for p in a["pads"]]
    xp = np.pad(x, pads)
    N, C = x.shape[:2]
    O, Cg = w.shape[:2]
    g = a["groups"]
    ksp, st, dl = w.shape[2:], a["strides"], a["dilations"]
    outsp = [(xp.shape[2 + i] - dl[i] * (ksp[i] - 1) - 1) // st[i] + 1 for i in range(nsp)]
    out = np.zeros((N, O, *outsp))
    og = O // g
    for gi in range(g):
        xg = xp[:, gi * Cg:(gi + 1) * Cg]
        wg = w[gi * og:(gi + 1) * og]
        for kidx in np.ndindex(*ksp):
            sl = tuple(slice(kidx[i] * dl[i], kidx[i] * dl[i] + st[i] * (outsp[i] - 1) + 1, st[i]) for i in range(nsp))
            patch = xg[(slice(None), slice(None)) + sl]            # N, Cg, *outsp
            out[:, gi * og:(gi + 1) * og] += np.einsum("nc...,oc->no...", patch, wg[(slice(None), slice(None)) + kidx])
    if b is not None:
        out += b.reshape((1, -1) + (1,) * nsp)
    if len(xs) > 3 and xs[3] is not None:       # fused residual
        out += xs[3]
    from .fused import apply_act
    out = apply_act(out.astype(xs[0].dtype), a["act"])
    if a.get("live_channels"):           # channels padded to whole blocks (passes/pad_channels.py): zeros
        out[:, a["live_channels"]:] = 0
    if a.get("mean_out"):                # the squeeze's mean taken as the map is written (passes/squeeze_excite.py)
        return [out, out.astype(np.float64).mean(axis=(2, 3), keepdims=True)]
    return out


# inputs: x, w, [bias], [residual], [gate]: a per-image, per-input-channel scale [N or 1, C, 1, 1] of x
# (passes/squeeze_excite.py folds a squeeze-and-excitation multiply into the 1x1 conv after it); mean_out 1: a
# second output, the output's mean over its pixels [N, O, 1, 1] (the squeeze before such a gate); act is the fused activation (passes set it); layout: how C stores
# the output and residual, in_layout x's when it differs (movement.py: LAYOUTS; passes/layout.py sets
# them, the reference ignores them); bf16_act 1 (precision="bf16"): the input and filters may be rounded
# to bf16 where the target multiplies in bf16 (matmul_q's bf16_act; the reference stays fp32), 2: a 3x3
# conv that takes direct bf16 products there rather than fp32 Winograd; int8_act 1 or 2
# (precision="int8"; 2: 3x3 convs too, not Winograd): the target has integer convs and the input is
# quantized to bytes over
# int8_range ([lo, hi] from calibration data, or None: each image's own) and the filters to int8 per
# output channel (the reference stays fp32). Between two integer convs (passes/quantize.link_int8_convs):
# int8_out [hp, wp, ph, pw] and int8_out_range: the output is stored as the next conv's input bytes (its
# padded image over its int8_range), and that conv's int8_in 1 reads them (the values stay logically
# fp32, as a layout changes only how C stores them; a depthwise conv with int8_in computes on them in fp32);
# int8_res_range: the residual is such bytes (its producer's int8_out_range), read back in the epilogue;
# int8_res_seen: the residual's [lo, hi] over the calibration data, the range its producer's bytes take
# where no conv reads that map as its input (a ResNet projection's output).
# Between two convs in bf16 products (passes/quantize.link_bf16_convs): bf16_out 1 stores the output as
# bf16 (the layout's order, where the floats would be), and its readers' bf16_in / bf16_res 1 read it so
# (the values stay logically fp32; rounded as the reader would round its input anyway)
declare(OpDef("conv", {"strides": None, "pads": None, "dilations": None, "groups": 1, "act": "none",
                       "layout": "nchw", "in_layout": None, "bf16_act": 0, "int8_act": 0, "int8_range": None,
                       "int8_out": None, "int8_out_range": None, "int8_in": 0, "int8_res_range": None,
                       "int8_res_seen": None, "bf16_in": 0, "bf16_res": 0, "bf16_out": 0, "live_channels": 0,
                       "mean_out": 0},
              _conv_infer,
              _conv_ref,
              kind="conv"))


# ---- pooling ------------------------------------------------------------------------
def _pool_out(n, k, s, lo, hi, d, ceil_mode):
    if not isinstance(n, int):
        raise ShapeError("pooling over a symbolic spatial dim is not supported")
    eff = d * (k - 1) + 1
    if ceil_mode:
        o = -(-(n + lo + hi - eff) // s) + 1
        if (o - 1) * s >= n + lo:   # last window must start inside the input or left pad
            o -= 1
    else:
        o = (n + lo + hi - eff) // s + 1
    return o


def _pool_infer(name):
    def infer(types, attrs, inputs):
        x = types[0]
        _float(name, x)
        nsp = x.rank - 2
        attrs["kernel"] = tuple(attrs["kernel"])
        attrs["strides"] = tuple(attrs["strides"] or attrs["kernel"])
        _spatial(attrs, nsp, attrs["kernel"])
        out = [_pool_out(n, k, s, lo, hi, d, attrs["ceil_mode"]) for n, k, s, (lo, hi), d in
               zip(x.shape[2:], attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"])]
        if any(o <= 0 for o in out):
            raise ShapeError(f"{name}: empty output for input {x} and kernel {attrs['kernel']}")
        if name == "max_pool":
            _check_byte_out(name, attrs)
            if attrs.get("int8_in", 0) not in (0, 1) or bool(attrs.get("int8_in")) != (attrs.get("int8_out") is not None):
                raise ShapeError(f"max_pool: int8_in {attrs.get('int8_in')!r} is 0, or 1 with an int8_out")
        return [TensorType(x.shape[:2] + tuple(out), x.dtype)]
    return infer


def _pool_ref(mode):
    def ref(xs, a):
        x = xs[0].astype(np.float64)
        nsp = x.ndim - 2
        ks, st, dl, pads = a["kernel"], a["strides"], a["dilations"], a["pads"]
        outsp = [_pool_out(x.shape[2 + i], ks[i], st[i], *pads[i], dl[i], a["ceil_mode"]) for i in range(nsp)]
        fill = -np.inf if mode == "max" else 0.0
        extra = [max(0, (outsp[i] - 1) * st[i] + dl[i] * (ks[i] - 1) + 1 - (x.shape[2 + i] + pads[i][0])) for i in range(nsp)]
        xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i][0], extra[i]) for i in range(nsp)], constant_values=fill)
        ones = np.pad(np.ones(x.shape[2:]), [(pads[i][0], extra[i]) for i in range(nsp)])
        # count_include_pad counts the declared pads, not the ceil_mode overhang
        declared = np.pad(np.ones(x.shape[2:]), [(pads[i][0], pads[i][1]) for i in range(nsp)], constant_values=1)
        declared = np.pad(declared, [(0, max(0, e - pads[i][1])) for i, e in enumerate(extra)])
        acc = np.full(x.shape[:2] + tuple(outsp), fill)
        cnt = np.zeros(tuple(outsp))
        for kidx in np.ndindex(*ks):
            sl = tuple(slice(kidx[i] * dl[i], kidx[i] * dl[i] + st[i] * (outsp[i] - 1) + 1, st[i]) for i in range(nsp))
            patch = xp[(slice(None), slice(None)) + sl]
            if mode == "max":
                acc = np.maximum(acc, patch)
            else:
                acc = acc + patch
                cnt = cnt + (declared if a["count_include_pad"] else ones)[sl]
        if mode == "avg":
            acc = acc / np.maximum(cnt, 1)
        return acc.astype(xs[0].dtype)
    return ref


_POOL_ATTRS = {"kernel": None, "strides": None, "pads": None, "dilations": None, "ceil_mode": False}
# max_pool's int8_in 1 with int8_out [OH, OW, 0, 0] and its range (passes/quantize.link_int8_convs): between an
# integer conv and integer convs that read it, it takes the conv's bytes and gives its readers theirs, the
# maximum of the bytes (a monotone map commutes with the maximum: the same bytes as the floats' maximum
# mapped); the values stay logically fp32, as for conv's byte links
declare(OpDef("max_pool", dict(_POOL_ATTRS, layout="nchw", int8_in=0, int8_out=None, int8_out_range=None),
              _pool_infer("max_pool"), _pool_ref("max"), kind="pool"))
declare(OpDef("avg_pool", dict(_POOL_ATTRS, count_include_pad=False, layout="nchw"), _pool_infer("avg_pool"),
              _pool_ref("avg"), kind="pool"))


# ---- softmax / log_softmax ------------------------------------------------------------
def _axis_infer(name):
    def infer(types, attrs, inputs):
        _float(name, types[0])
        attrs["axis"] = norm_axis(attrs["axis"], types[0].rank)
        return [types[0]]
    return infer


def _softmax_ref(xs, a):
    x = xs[0].astype(np.float64)
    e = np.exp(x - np.max(x, axis=a["axis"], keepdims=True))
    return (e / e.sum(axis=a["axis"], keepdims=True)).astype(xs[0].dtype)


def _log_softmax_ref(xs, a):
    x = xs[0].astype(np.float64)
    m = np.max(x, axis=a["axis"], keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=a["axis"], keepdims=True))).astype(xs[0].dtype)


declare(OpDef("softmax", {"axis": -1}, _axis_infer("softmax"), _softmax_ref, kind="composite"))
declare(OpDef("log_softmax", {"axis": -1}, _axis_infer("log_softmax"), _log_softmax_ref, kind="composite"))


# ---- normalisations over trailing dims [axis, rank) ------------------------------------
def _norm_infer(name, nparams):
    def infer(types, attrs, inputs):
        x = types[0]
        _float(name, x)
        attrs["axis"] = norm_axis(attrs["axis"], x.rank)
        inner = x.shape[attrs["axis"]:]
        for p in types[1:1 + nparams]:
            if p is not None and not (len(p.shape) <= len(inner) and all(
                    D.dims_equal(a, b) for a, b in zip(p.shape[::-1], inner[::-1]))):
                raise ShapeError(f"{name}: parameter shape {p.shape} does not match normalised dims {inner}")
        return [x]
    return infer


def _layer_norm_ref(xs, a):
    x = xs[0].astype(np.float64)
    axes = tuple(range(a["axis"], x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + a["eps"])
    if len(xs) > 1 and xs[1] is not None:
        y = y * xs[1]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    return y.astype(xs[0].dtype)


def _rms_norm_ref(xs, a):
    x = xs[0].astype(np.float64)
    axes = tuple(range(a["axis"], x.ndim))
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + a["eps"])
    if len(xs) > 1 and xs[1] is not None:
        y = y * xs[1]
    return y.astype(xs[0].dtype)


declare(OpDef("layer_norm", {"axis": -1, "eps": 1e-5}, _norm_infer("layer_norm", 2), _layer_norm_ref,
              kind="composite"))


def _group_norm_infer(types, attrs, inputs):
    x = types[0]
    _float("group_norm", x)
    g = attrs["groups"]
    if x.rank != 4 or not isinstance(x.shape[1], int) or not isinstance(g, int) or g < 1 or x.shape[1] % g:
        raise ShapeError(f"group_norm: {g!r} groups over a {x.rank}-d map of {x.shape[1] if x.rank > 1 else '?'} channels")
    return [x]


def _group_norm_ref(xs, a):
    x = xs[0].astype(np.float64)
    r = x.reshape(x.shape[0], a["groups"], -1)
    mu = r.mean(axis=2, keepdims=True)
    var = ((r - mu) ** 2).mean(axis=2, keepdims=True)
    return ((r - mu) / np.sqrt(var + a["eps"])).reshape(x.shape).astype(xs[0].dtype)


# a [N, C, H, W] map normalised over each group of C / groups channels and all pixels, without the
# affine (passes/simplify.group_norms: the frontends' reshape -> layer_norm -> reshape), so that it
# can read and write a channel-blocked map (passes/layout.py)
declare(OpDef("group_norm", {"groups": 1, "eps": 1e-5}, _group_norm_infer, _group_norm_ref, kind="composite"))
declare(OpDef("rms_norm", {"axis": -1, "eps": 1e-6}, _norm_infer("rms_norm", 1), _rms_norm_ref, kind="composite"))


def _bn_infer(types, attrs, inputs):
    x = types[0]
    _float("batch_norm", x)
    for p in types[1:]:
        if p.shape != (x.shape[1],):
            raise ShapeError(f"batch_norm: parameter shape {p.shape}, expected ({x.shape[1]},)")
    return [x]


def _bn_ref(xs, a):
    x, s, b, m, v = xs
    sh = (1, -1) + (1,) * (x.ndim - 2)
    y = (x.astype(np.float64) - m.reshape(sh)) / np.sqrt(v.reshape(sh).astype(np.float64) + a["eps"]) * s.reshape(sh) \
        + b.reshape(sh)
    return y.astype(x.dtype)


declare(OpDef("batch_norm", {"eps": 1e-5}, _bn_infer, _bn_ref, kind="composite"))
