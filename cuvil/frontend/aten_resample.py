"""ATen resampling -> IR: nearest, (bi/tri)linear and bicubic resizing (align_corners both ways, and
antialiased as torchvision's Resize does it), adaptive average and max pooling, max-pool indices and their backward (a
scatter-add of the gradient). Each spatial axis is a weighted sum of a few gathers ("taps") whose indices
and weights are computed here from the static sizes, by torch's own rules (aten/src/ATen/native/
UpSample.h: area_pixel_compute_scale, area_pixel_compute_source_index, nearest_idx)."""
from __future__ import annotations

import numpy as np

from ..ir import dims as D
from .aten import Unsupported, aten, handles, max_pool

CUBIC_A = -0.75     # torch's bicubic kernel (Keys, a = -0.75)


def _scale(in_size, out_size, align_corners, scale):
    """Source pixels per output pixel, in float32 as torch computes it."""
    if align_corners:
        return np.float32((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    return np.float32(1.0 / scale if scale and scale > 0 else in_size / out_size)


def _source(scale, out_size, align_corners, cubic=False):
    dst = np.arange(out_size, dtype=np.float32)
    if align_corners:
        return scale * dst
    src = scale * (dst + np.float32(0.5)) - np.float32(0.5)
    return src if cubic else np.maximum(src, np.float32(0))


def nearest_taps(in_size, out_size, scale):
    if out_size == in_size:
        idx = np.arange(out_size)
    elif out_size == 2 * in_size:
        idx = np.arange(out_size) >> 1
    else:
        s = _scale(in_size, out_size, False, scale)
        idx = np.minimum(np.floor(np.arange(out_size, dtype=np.float32) * s).astype(np.int64), in_size - 1)
    return [(idx, None)]


def linear_taps(in_size, out_size, align_corners, scale):
    src = _source(_scale(in_size, out_size, align_corners, scale), out_size, align_corners)
    i0 = np.minimum(src.astype(np.int64), in_size - 1)
    lam = (src - i0).astype(np.float32)
    i1 = np.minimum(i0 + 1, in_size - 1)
    return [(i0, np.float32(1) - lam), (i1, lam)]


def _cubic_weights(t):
    a = np.float32(CUBIC_A)
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1            # |x| <= 1
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a       # 1 < |x| < 2
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def cubic_taps(in_size, out_size, align_corners, scale):
    src = _source(_scale(in_size, out_size, align_corners, scale), out_size, align_corners, cubic=True)
    i = np.floor(src).astype(np.int64)
    ws = _cubic_weights((src - i).astype(np.float32))
    return [(np.clip(i - 1 + k, 0, in_size - 1), w.astype(np.float32)) for k, w in enumerate(ws)]


def adaptive_taps(in_size, out_size):
    """Window o covers [floor(o * in / out), ceil((o + 1) * in / out)); shorter windows repeat their last
    index with weight 0."""
    o = np.arange(out_size)
    start, end = (o * in_size) // out_size, -((-(o + 1) * in_size) // out_size)
    length = end - start
    return [(np.minimum(start + t, end - 1), np.where(t < length, 1 / length, 0).astype(np.float32))
            for t in range(int(length.max()))]


def _resample_axis(ctx, x, axis, taps):
    shape = [1] * x.type.rank
    shape[axis] = len(taps[0][0])
    total = None
    for idx, w in taps:
        y = ctx.add("gather", [x, ctx.g.const(idx.astype(np.int64))], {"axis": axis})
        if w is not None:
            y = ctx.add("mul", [y, ctx.g.const(w.reshape(shape).astype(x.dtype))])
        total = y if total is None else ctx.add("add", [total, y])
    return total


def _resample(ctx, x, taps_of, nsp=None):
    """taps_of(i, in_size, out_size) for each of the last nsp axes (default: all but batch and
    channels); the output sizes are the node's."""
    out_shape = tuple(ctx.node.meta["val"].shape)
    nsp = len(out_shape) - 2 if nsp is None else nsp
    for i in range(nsp):
        axis = len(out_shape) - nsp + i
        n_in, n_out = x.shape[axis], out_shape[axis]
        if not isinstance(n_in, int) or not isinstance(n_out, int):
            raise Unsupported("resampling a symbolic spatial size")
        if n_in != n_out:                  # an axis kept as it is: every kind of taps is the identity
            x = _resample_axis(ctx, x, axis, taps_of(i, n_in, int(n_out)))
    return x


def _scales(scale_factors, extra, nsp):
    if scale_factors:
        return list(scale_factors)
    return (list(extra) + [None] * nsp)[:nsp]


@handles(aten.upsample_nearest1d.vec, aten.upsample_nearest2d.vec, aten.upsample_nearest3d.vec)
def _nearest_vec(ctx, x, output_size, scale_factors):
    sc = _scales(scale_factors, [], x.type.rank - 2)
    return _resample(ctx, x, lambda i, n, m: nearest_taps(n, m, sc[i]))


@handles(aten.upsample_nearest1d.default, aten.upsample_nearest2d.default, aten.upsample_nearest3d.default)
def _nearest(ctx, x, output_size, *scales):
    sc = _scales(None, scales, x.type.rank - 2)
    return _resample(ctx, x, lambda i, n, m: nearest_taps(n, m, sc[i]))


def _interp(taps):
    def vec(ctx, x, output_size, align_corners, scale_factors):
        sc = _scales(scale_factors, [], x.type.rank - 2)
        return _resample(ctx, x, lambda i, n, m: taps(n, m, align_corners, sc[i]))

    def default(ctx, x, output_size, align_corners, *scales):
        sc = _scales(None, scales, x.type.rank - 2)
        return _resample(ctx, x, lambda i, n, m: taps(n, m, align_corners, sc[i]))
    return vec, default


for _ops, _taps in (((aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_trilinear3d), linear_taps),
                    ((aten.upsample_bicubic2d,), cubic_taps)):
    _vec, _default = _interp(_taps)
    for _op in _ops:
        handles(_op.vec)(_vec)
        handles(_op.default)(_default)


@handles(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool1d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(ctx, x, output_size):
    nsp = len(output_size)
    out = tuple(ctx.node.meta["val"].shape)[-nsp:]
    ins = x.shape[-nsp:]
    if x.type.rank == 4 and nsp == 2 and all(isinstance(n, int) and n % m == 0 for n, m in zip(ins, out)):
        k = [n // m for n, m in zip(ins, out)]      # windows that tile the input: a plain pool
        return ctx.add("avg_pool", [x], {"kernel": k, "strides": k, "pads": [(0, 0)] * len(k), "ceil_mode": False,
                                         "count_include_pad": True})
    return _resample(ctx, x, lambda i, n, m: adaptive_taps(n, m), nsp)


def _aa_filter(cubic):
    if not cubic:
        return lambda x: np.maximum(np.float32(1) - np.abs(x), np.float32(0))
    a = np.float32(-0.5)                 # torch's antialiased bicubic (not the plain bicubic's -0.75)

    def f(x):
        x = np.abs(x)
        near = ((a + 2) * x - (a + 3)) * x * x + 1
        far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return np.where(x < 1, near, np.where(x < 2, far, np.float32(0))).astype(np.float32)
    return f


def antialias_taps(in_size, out_size, align_corners, scale, cubic):
    """torch's antialiased taps (UpSampleKernel.cpp, _compute_weights_aa): when shrinking, the filter is
    stretched by the scale so each output pixel averages every input pixel under it; the window of
    pixel i is [center - support + 0.5, center + support + 0.5) clipped, its weights normalized."""
    s = _scale(in_size, out_size, align_corners, scale)
    support = np.float32((4 if cubic else 2) * 0.5) * (s if s >= 1 else np.float32(1))
    invscale = np.float32(1) / s if s >= 1 else np.float32(1)
    filt = _aa_filter(cubic)
    center = s * (np.arange(out_size, dtype=np.float32) + np.float32(0.5))
    xmin = np.maximum((center - support + np.float32(0.5)).astype(np.int64), 0)
    xsize = np.minimum((center + support + np.float32(0.5)).astype(np.int64), in_size) - xmin
    width = int(xsize.max())
    taps, total = [], np.zeros(out_size, np.float32)
    for j in range(width):
        w = np.where(j < xsize, filt((j + xmin - center + np.float32(0.5)) * invscale), np.float32(0))
        taps.append((np.minimum(xmin + j, in_size - 1), w.astype(np.float32)))
        total += w
    total = np.where(total != 0, total, np.float32(1))
    return [(idx, (w / total).astype(np.float32)) for idx, w in taps]


def _antialiased(cubic):
    def vec(ctx, x, output_size, align_corners, scale_factors):
        sc = _scales(scale_factors, [], x.type.rank - 2)
        return _resample(ctx, x, lambda i, n, m: antialias_taps(n, m, align_corners, sc[i], cubic))

    def default(ctx, x, output_size, align_corners, *scales):
        sc = _scales(None, scales, x.type.rank - 2)
        return _resample(ctx, x, lambda i, n, m: antialias_taps(n, m, align_corners, sc[i], cubic))
    return vec, default


for _op, _cubic in ((aten._upsample_bilinear2d_aa, False), (aten._upsample_bicubic2d_aa, True)):
    _vec, _default = _antialiased(_cubic)
    handles(_op.vec)(_vec)
    handles(_op.default)(_default)


@handles(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool_with_indices(ctx, x, *args, **kwargs):
    """The pool and its indices (cleanup drops the indices where nothing reads them)."""
    y = max_pool(ctx, x, *args, **kwargs)
    return y, max_pool_indices(ctx, x, y.producer.attrs, y.shape[2:])


def _static_spatial(x, out_spatial, what):
    sp = list(x.shape[x.type.rank - len(out_spatial):])
    if not all(isinstance(d, int) for d in sp + list(out_spatial)):
        raise Unsupported(f"{what} of a symbolic size")
    return sp


def _window_max(ctx, x, taps, fill=-np.inf):
    """Max over windows of x and the flat input position of each maximum (the first, on ties).
    taps[d]: [out_d, k_d] the input coordinates along spatial dim d of each window's taps (those
    outside [0, size) read `fill`; the dims before the spatial ones are kept). Every window is gathered
    from x padded with fill, then reduced."""
    nsp = len(taps)
    sp, lead = list(x.shape[x.type.rank - nsp:]), list(x.shape[:x.type.rank - nsp])
    lo = [max(0, -int(t.min())) for t in taps]
    hi = [max(0, int(t.max()) + 1 - n) for t, n in zip(taps, sp)]
    padded = [n + a + b for n, a, b in zip(sp, lo, hi)]
    out, ks = [t.shape[0] for t in taps], [t.shape[1] for t in taps]

    def flat_positions(coords, sizes):
        pos = 0
        for d, (c, n) in enumerate(zip(coords, sizes)):
            shape = [1] * (2 * nsp)
            shape[d], shape[nsp + d] = c.shape
            pos = pos * n + c.reshape(shape)
        return np.broadcast_to(pos, out + ks).reshape(out + [int(np.prod(ks))])
    padded_pos = flat_positions([t + a for t, a in zip(taps, lo)], padded)
    input_pos = flat_positions(taps, sp)
    xp = x if not any(lo + hi) else ctx.add("pad", [x], {"pads": [(0, 0)] * len(lead) + list(zip(lo, hi)),
                                                          "value": fill})
    flat = ctx.add("reshape", [xp], {"shape": lead + [int(np.prod(padded))]})
    windows = ctx.add("gather", [flat, ctx.g.const(np.ascontiguousarray(padded_pos, np.int64))], {"axis": len(lead)})
    last = len(lead) + nsp
    tap = ctx.add("argmax", [windows], {"axis": last, "keepdims": True})
    table = ctx.add("expand", [ctx.g.const(np.ascontiguousarray(input_pos, np.int64))],
                    {"shape": lead + list(input_pos.shape)})
    pos = ctx.add("reshape", [ctx.add("gather_elements", [table, tap], {"axis": last})], {"shape": lead + out})
    return ctx.add("reduce_max", [windows], {"axes": [last], "keepdims": False}), pos


def max_pool_indices(ctx, x, attrs, out_spatial):
    """The flat (h * W + w) input position of each max-pool window's maximum (the first, on ties), as
    torch's max_pool2d_with_indices returns it."""
    _static_spatial(x, out_spatial, "max-pool indices")
    taps = [np.arange(o)[:, None] * s + np.arange(k)[None, :] * dl - p
            for o, k, s, dl, (p, _) in zip(out_spatial, attrs["kernel"], attrs["strides"], attrs["dilations"],
                                           attrs["pads"])]
    return _window_max(ctx, x, taps)[1]


def _adaptive_taps(n, m):
    """[m, k] the input positions of adaptive window i ([floor(i n / m), ceil((i + 1) n / m))), the
    shorter windows' last position repeated (a max is unchanged by it)."""
    start = np.arange(m) * n // m
    end = -(-(np.arange(m) + 1) * n // m)
    k = int((end - start).max())
    return start[:, None] + np.minimum(np.arange(k)[None, :], (end - start - 1)[:, None])


@handles(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max_pool(ctx, x, output_size):
    """(the max of each adaptive window, the flat input position of it)."""
    out = tuple(ctx.node.meta["val"][0].shape)[-len(output_size):]
    sp = _static_spatial(x, out, "adaptive max pooling")
    return _window_max(ctx, x, [_adaptive_taps(n, m) for n, m in zip(sp, out)])


@handles(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(ctx, grad, x, kernel, stride, padding, dilation, ceil_mode, indices):
    """Each window's gradient added at its maximum's flat spatial index (what the forward returned)."""
    nsp = 2 if ctx.node.target is aten.max_pool2d_with_indices_backward.default else 3
    lead, spatial = list(x.shape[:-nsp]), list(x.shape[-nsp:])
    flat = [*lead, D.numel(spatial)]
    out = [*lead, D.numel(list(grad.shape[-nsp:]))]
    zeros = ctx.add("full", [], {"shape": flat, "value": 0.0, "dtype": grad.dtype})
    idx = ctx.add("reshape", [ctx.tensor(indices, "int64")], {"shape": out})
    y = ctx.add("scatter_elements", [zeros, idx, ctx.add("reshape", [grad], {"shape": out})],
                {"axis": len(lead), "reduction": "add"})
    return ctx.add("reshape", [y], {"shape": list(x.shape)})
