"""Convolution and pooling op handlers.

Conv, ConvTranspose (zero insertion, then a conv with the flipped, transposed kernel; a GEMM into patches
where the kernel equals the strides), Max / Average / Lp pooling and their global forms, MaxPool's Indices
output, MaxUnpool, Col2Im and DeformConv."""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...errors import ShapeError
from ..conv_patches import patches_transposed
from .helpers import Unsupported, auto_pad, contig, dequantized_range, dtype_of, rank_of, shape_of
from .registry import handler


# ---- convolution and pooling ----------------------------------------------------------------------
@handler("Conv")
def _conv(c):
    x, w, b = c.inp(0), c.inp(1), c.inp(2)
    nsp = rank_of(x) - 2
    kernel = list(shape_of(w)[2:])
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    pads = auto_pad(c, shape_of(x)[2:], kernel, strides, dil)
    ins = [x, w] + ([b] if b is not None else [])
    grid = dequantized_range(c, c.node.input[0]) if c.integer_kernels else None
    return c.op("conv", ins, strides=tuple(strides), pads=pads, dilations=tuple(dil), groups=c.attr("group", 1),
                **({"int8_range": grid} if grid else {}))


@handler("ConvTranspose")
def _conv_transpose(c):
    x, w, b = c.inp(0), c.inp(1), c.inp(2)
    nsp = rank_of(x) - 2
    g = c.attr("group", 1)
    kernel = list(shape_of(w)[2:])
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    outpad = c.attr("output_padding") or [0] * nsp
    insp = list(shape_of(x)[2:])
    if not all(isinstance(d, int) for d in insp):
        raise Unsupported("symbolic spatial dims")
    ap = c.attr("auto_pad", "NOTSET")
    out_shape = c.attr("output_shape")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    if out_shape and ap not in ("SAME_UPPER", "SAME_LOWER"):
        # onnx's reference: the declared pads (default 0) at the start, the end cropped / extended to fit
        p = c.attr("pads") or [0] * (2 * nsp)
        pads = [(p[i], s * (n - 1) + op_ + e - p[i] - t)
                for i, (n, s, e, op_, t) in enumerate(zip(insp, strides, eff, outpad, out_shape[-nsp:]))]
    elif out_shape or ap in ("SAME_UPPER", "SAME_LOWER"):
        tgt = out_shape[-nsp:] if out_shape else [n * s for n, s in zip(insp, strides)]
        pads = []
        for n, s, e, op_, t in zip(insp, strides, eff, outpad, tgt):
            total = s * (n - 1) + op_ + e - t
            lo = total // 2 if (ap != "SAME_LOWER" and not out_shape) or (out_shape and ap != "SAME_LOWER") else total - total // 2
            if ap == "SAME_LOWER":
                lo = total - total // 2
            pads.append((lo, total - lo))
    elif ap == "VALID":
        pads = [(0, 0)] * nsp
    else:
        p = c.attr("pads") or [0] * (2 * nsp)
        pads = [(p[i], p[i + nsp]) for i in range(nsp)]
    N, C = shape_of(x)[:2]
    if nsp == 2 and g == 1 and list(kernel) == list(strides) and all(d == 1 for d in dil) and not any(outpad) \
            and all(p == (0, 0) for p in pads) and isinstance(N, int):
        return patches_transposed(lambda op, ins, attrs: c.op(op, ins, **attrs), x, w, b)
    # zero-insertion upsampling of x, then a conv with the flipped, transposed kernel
    y = x
    if any(s > 1 for s in strides):
        shp, exp_shape, final = [N, C], [N, C], [N, C]
        for n, s in zip(insp, strides):
            shp += [n, 1]
            exp_shape += [n, s]
            final += [n * s]
        y = c.reshape(y, shp)
        padspec = [(0, 0)] * 2 + sum([[(0, 0), (0, s - 1)] for s in strides], [])
        y = c.op("pad", [y], pads=padspec, value=0.0)
        y = c.reshape(y, final)
        for k, (n, s) in enumerate(zip(insp, strides)):
            if s > 1:
                y = c.op("slice", [y], axis=2 + k, start=0, step=1, length=(n - 1) * s + 1)
    conv_pads = []
    for e, (lo, hi), op_ in zip(eff, pads, outpad):
        conv_pads.append((e - 1 - lo, e - 1 - hi + op_))
    # negative conv pads crop: apply them with a pad op first
    if any(lo < 0 or hi < 0 for lo, hi in conv_pads):
        y = c.op("pad", [y], pads=[(0, 0), (0, 0)] + [(min(lo, 0), min(hi, 0)) for lo, hi in conv_pads], value=0.0)
        conv_pads = [(max(lo, 0), max(hi, 0)) for lo, hi in conv_pads]
    Cin, Og = shape_of(w)[:2]
    if isinstance(w, np.ndarray):
        wk = w.reshape((g, Cin // g, Og) + tuple(kernel))
        wk = np.flip(wk, axis=tuple(range(3, 3 + nsp)))
        wk = contig(np.swapaxes(wk, 1, 2).reshape((g * Og, Cin // g) + tuple(kernel)))
    else:
        wk = c.reshape(w, (g, Cin // g, Og) + tuple(kernel))
        for k, kk in enumerate(kernel):
            if kk > 1:
                wk = c.op("slice", [wk], axis=3 + k, start=kk - 1, step=-1, length=kk)
        wk = c.op("transpose", [wk], perm=(0, 2, 1) + tuple(range(3, 3 + nsp)))
        wk = c.reshape(wk, (g * Og, Cin // g) + tuple(kernel))
    ins = [y, wk] + ([b] if b is not None else [])
    return c.op("conv", ins, strides=(1,) * nsp, pads=conv_pads, dilations=tuple(dil), groups=g)


def _pool(kind):
    def h(c):
        x = c.inp(0)
        nsp = rank_of(x) - 2
        kernel = c.attr("kernel_shape")
        strides = c.attr("strides") or [1] * nsp
        dil = c.attr("dilations") or [1] * nsp
        want_idx = len(c.node.output) > 1 and bool(c.node.output[1])
        ceil = bool(c.attr("ceil_mode", 0))
        ap = c.attr("auto_pad", "NOTSET")
        if ap in ("SAME_UPPER", "SAME_LOWER"):
            pads = []
            for n, k, s, d in zip(shape_of(x)[2:], kernel, strides, dil):
                o = -(-n // s)
                total = max((o - 1) * s + (k - 1) * d + 1 - n, 0)
                small = total // 2
                pads.append((small, total - small) if ap == "SAME_UPPER" else (total - small, small))
        else:
            pads = auto_pad(c, shape_of(x)[2:], kernel, strides, dil)
        attrs = dict(kernel=tuple(kernel), strides=tuple(strides), pads=pads, dilations=tuple(dil), ceil_mode=ceil)
        if kind == "avg_pool":
            attrs["count_include_pad"] = bool(c.attr("count_include_pad", 0))
        if want_idx:
            if kind != "max_pool" or not dtype_of(x).startswith("float"):
                raise Unsupported("Indices output")
            return _max_pool_with_indices(c, x, kernel, strides, pads, dil, ceil)
        if kind == "max_pool" and dtype_of(x) in ("uint8", "int8"):     # exact in float32
            return c.cast(c.op(kind, [c.cast(x, "float32")], **attrs), dtype_of(x))
        return c.op(kind, [x], **attrs)
    return h


handler("MaxPool")(_pool("max_pool"))
handler("AveragePool")(_pool("avg_pool"))


@handler("LpPool")
def _lppool(c):
    x = c.inp(0)
    p = c.attr("p", 2)
    dt = dtype_of(x)
    kernel = c.attr("kernel_shape")
    nsp = rank_of(x) - 2
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    pads = auto_pad(c, shape_of(x)[2:], kernel, strides, dil)
    xp = c.op("pow", [c.op("abs", [x]), c.scalar(p, dt)])
    s = c.op("avg_pool", [xp], kernel=tuple(kernel), strides=tuple(strides), pads=pads, dilations=tuple(dil),
             ceil_mode=bool(c.attr("ceil_mode", 0)), count_include_pad=True)
    s = c.op("mul", [s, c.scalar(math.prod(kernel), dt)])
    return c.op("pow", [s, c.scalar(1.0 / p, dt)])


@handler("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _gpool(c):
    x = c.inp(0)
    axes = tuple(range(2, rank_of(x)))
    if c.node.op_type == "GlobalLpPool":
        p = c.attr("p", 2)
        dt = dtype_of(x)
        s = c.op("reduce_sum", [c.op("pow", [c.op("abs", [x]), c.scalar(p, dt)])], axes=axes, keepdims=True)
        return c.op("pow", [s, c.scalar(1.0 / p, dt)])
    return c.op("reduce_mean" if c.node.op_type == "GlobalAveragePool" else "reduce_max", [x], axes=axes,
                keepdims=True)


def _max_pool_with_indices(c, x, kernel, strides, pads, dil, ceil_mode):
    """Max over the kernel offsets of strided slices of the -inf padded input, tracking the flat index
    of the first maximum (storage_order 0)."""
    xs = list(shape_of(x))
    nsp = len(xs) - 2
    if not all(isinstance(d, int) for d in xs):
        raise Unsupported("symbolic shapes")
    y = c.op("max_pool", [x], kernel=tuple(kernel), strides=tuple(strides), pads=pads, dilations=tuple(dil),
             ceil_mode=ceil_mode)
    outs = list(shape_of(y)[2:])
    ext = [max(0, (outs[i] - 1) * strides[i] + dil[i] * (kernel[i] - 1) + 1 - (xs[2 + i] + pads[i][0]))
           for i in range(nsp)]
    xp = c.op("pad", [x], pads=[(0, 0), (0, 0)] + [(pads[i][0], ext[i]) for i in range(nsp)], value=float("-inf"))
    flat = np.arange(int(np.prod(xs)), dtype=np.int64).reshape(xs)
    if c.attr("storage_order", 0):      # column-major spatial indices
        flat = np.arange(int(np.prod(xs)), dtype=np.int64).reshape(xs[:2] + xs[2:][::-1])
        flat = flat.transpose([0, 1] + list(range(len(xs) - 1, 1, -1)))
    fp = np.pad(flat, [(0, 0), (0, 0)] + [(pads[i][0], ext[i]) for i in range(nsp)], constant_values=-1)
    best = bi = None
    for kidx in itertools.product(*[range(k) for k in kernel]):
        v, ind = xp, fp
        sl = [slice(None), slice(None)]
        for i in range(nsp):
            start = kidx[i] * dil[i]
            v = c.op("slice", [v], axis=2 + i, start=start, step=strides[i], length=outs[i])
            sl.append(slice(start, start + strides[i] * (outs[i] - 1) + 1, strides[i]))
        ind = np.ascontiguousarray(fp[tuple(sl)])
        if best is None:
            best, bi = v, ind
            continue
        upd = c.op("gt", [v, best])
        best = c.op("where", [upd, v, best])
        bi = c.op("where", [upd, ind, bi])
    return [y, bi]


@handler("MaxUnpool")
def _max_unpool(c):
    """Zeros with x scattered at its (flat, whole-tensor) indices."""
    x, idx, oshape = c.inp(0), c.cast(c.inp(1), "int64"), c.inp(2)
    xs = list(shape_of(x))
    nsp = len(xs) - 2
    k = c.attr("kernel_shape")
    st = c.attr("strides") or [1] * nsp
    p = c.attr("pads") or [0] * (2 * nsp)
    inferred = xs[:2] + [(xs[2 + i] - 1) * st[i] + k[i] - p[i] - p[i + nsp] for i in range(nsp)]
    out = [int(v) for v in np.asarray(c.known(2, "output_shape")).ravel()] if oshape is not None else inferred
    if not all(isinstance(d, int) for d in xs + out):
        raise Unsupported("symbolic shapes")
    n = int(np.prod(xs))
    zeros = np.zeros([int(np.prod(inferred))], dtype=dtype_of(x))
    y = c.reshape(c.op("scatter_elements", [zeros, c.reshape(idx, [n]), c.reshape(x, [n])], axis=0), inferred)
    if out != inferred:     # onnx's reference: the inferred block at the origin of a zero output
        y = c.op("pad", [y], pads=[(0, o - i) for o, i in zip(out, inferred)], value=0.0)
    return y


@handler("Col2Im")
def _col2im(c):
    """Sum over kernel offsets of the column block, zero-stuffed by the strides and shifted into place."""
    x = c.inp(0)
    img = [int(v) for v in np.asarray(c.known(1, "image_shape")).ravel()]
    blk = [int(v) for v in np.asarray(c.known(2, "block_shape")).ravel()]
    k = len(img)
    dil = c.attr("dilations") or [1] * k
    st = c.attr("strides") or [1] * k
    p = c.attr("pads") or [0] * (2 * k)
    N, CK, L = shape_of(x)
    K = int(np.prod(blk))
    C = CK // K
    padded = [img[i] + p[i] + p[i + k] for i in range(k)]
    outs = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(k)]
    if int(np.prod(outs)) != L:
        raise ShapeError(f"Col2Im: {L} blocks, the shapes imply {int(np.prod(outs))}")
    xr = c.reshape(x, [N, C, K] + outs)
    acc = None
    for kf, kidx in enumerate(itertools.product(*[range(b) for b in blk])):
        y = c.reshape(c.op("slice", [xr], axis=2, start=kf, length=1), [N, C] + outs)
        pads = [(0, 0), (0, 0)]
        for i in range(k):
            if st[i] > 1:      # zero insertion along dim 2 + i
                sh = list(shape_of(y))
                y = c.reshape(y, sh[:2 + i + 1] + [1] + sh[2 + i + 1:])
                y = c.op("pad", [y], pads=[(0, 0)] * (3 + i) + [(0, st[i] - 1)] + [(0, 0)] * (k - i - 1), value=0.0)
                y = c.reshape(y, sh[:2 + i] + [sh[2 + i] * st[i]] + sh[2 + i + 1:])
                y = c.op("slice", [y], axis=2 + i, start=0, length=(outs[i] - 1) * st[i] + 1)
            lo = kidx[i] * dil[i]
            pads.append((lo, padded[i] - lo - ((outs[i] - 1) * st[i] + 1)))
        y = c.op("pad", [y], pads=pads, value=0.0)
        acc = y if acc is None else c.op("add", [acc, y])
    for i in range(k):
        if p[i] or p[i + k]:
            acc = c.op("slice", [acc], axis=2 + i, start=p[i], length=img[i])
    return acc


@handler("DeformConv")
def _deform_conv(c):
    """2-d deformable conv: bilinear samples (zero outside) at the offset kernel taps, then one matmul."""
    x, w, off, b, mask = (c.inp(i) for i in range(5))
    if rank_of(x) != 4 or c.attr("group", 1) != 1:
        raise Unsupported("only 2-d DeformConv with group=1")
    N, C, H, W = shape_of(x)
    O, _, KH, KW = shape_of(w)
    OH, OW = shape_of(off)[2:]
    if not all(isinstance(d, int) for d in (N, C, H, W, OH, OW)):
        raise Unsupported("symbolic shapes")
    G = c.attr("offset_group", 1)
    st = c.attr("strides") or [1, 1]
    dl = c.attr("dilations") or [1, 1]
    p = c.attr("pads") or [0, 0, 0, 0]
    K, P, Cg = KH * KW, OH * OW, C // G
    dt = dtype_of(x)

    def op(name, *a, **kw):
        return c.op(name, list(a), **kw)
    offr = c.reshape(off, [N, G, K, 2, P])
    base = [np.array([[-p[a] + st[a] * (q // OW if a == 0 else q % OW) + (k // KW if a == 0 else k % KW) * dl[a]
                       for q in range(P)] for k in range(K)], dtype=dt) for a in (0, 1)]    # [K, P]
    ys = op("add", c.reshape(op("slice", offr, axis=3, start=0, length=1), [N, G, K, P]), base[0])
    xs = op("add", c.reshape(op("slice", offr, axis=3, start=1, length=1), [N, G, K, P]), base[1])
    y0, x0 = op("floor", ys), op("floor", xs)
    fy, fx = op("sub", ys, y0), op("sub", xs, x0)
    one = c.scalar(1, dt)
    xflat = c.reshape(x, [N, G, Cg, H * W])
    cols = None
    for dy, wy in ((0, op("sub", one, fy)), (1, fy)):
        for dx, wx in ((0, op("sub", one, fx)), (1, fx)):
            yy, xx = op("add", y0, c.scalar(dy, dt)), op("add", x0, c.scalar(dx, dt))
            ok = op("and", op("and", op("ge", yy, c.scalar(0, dt)), op("le", yy, c.scalar(H - 1, dt))),
                    op("and", op("ge", xx, c.scalar(0, dt)), op("le", xx, c.scalar(W - 1, dt))))
            yi = c.cast(op("clip", yy, min=0.0, max=float(H - 1)), "int64")
            xi = c.cast(op("clip", xx, min=0.0, max=float(W - 1)), "int64")
            flat = op("add", op("mul", yi, c.scalar(W, "int64")), xi)                     # N, G, K, P
            idx = op("expand", c.reshape(flat, [N, G, 1, K * P]), shape=(N, G, Cg, K * P))
            v = c.reshape(op("gather_elements", xflat, idx, axis=3), [N, G, Cg, K, P])
            wgt = c.reshape(op("mul", op("mul", wy, wx), c.cast(ok, dt)), [N, G, 1, K, P])
            t = op("mul", v, wgt)
            cols = t if cols is None else op("add", cols, t)
    if mask is not None:
        cols = op("mul", cols, c.reshape(mask, [N, G, 1, K, P]))
    cols = c.reshape(cols, [N, C * K, P])
    y = op("matmul", c.reshape(w, [O, C * K]), cols)                                       # N, O, P
    if b is not None:
        y = op("add", y, c.reshape(b, [O, 1]))
    return c.reshape(y, [N, O, OH, OW])
