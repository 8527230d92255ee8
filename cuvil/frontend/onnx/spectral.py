"""Spectral op handlers.

DFT as matmuls with constant cos / sin matrices over the transformed axis, STFT through the same
transform over strided frames, and MelWeightMatrix evaluated at compile time."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .helpers import Unsupported, dtype_of, rank_of, shape_of
from .registry import handler


@handler("DFT")
def _dft(c):
    """DFT as matmuls with constant cos / sin matrices over the transformed axis (moved last)."""
    x = c.inp(0)
    r = rank_of(x)
    shp = list(shape_of(x))
    L = c.inp(1)
    if c.opset >= 20:
        ax = c.known(2, "axis") if c.inp(2) is not None else -2
        ax = int(np.asarray(ax).ravel()[0])
    else:
        ax = c.attr("axis", 1)
    ax = ax % r
    inverse, onesided = bool(c.attr("inverse", 0)), bool(c.attr("onesided", 0))
    nin = shp[ax]
    if not isinstance(nin, int):
        raise Unsupported("symbolic signal length")
    if L is not None:
        L = int(np.asarray(c.known(1, "dft_length")).ravel()[0])
    else:
        L = 2 * (nin - 1) if inverse and onesided else nin
    return _dft_apply(c, x, ax, L, inverse, onesided)


def _dft_apply(c, x, ax, L, inverse, onesided):
    r = rank_of(x)
    shp = list(shape_of(x))
    nin = shp[ax]
    dt = dtype_of(x)
    comp = shp[-1]
    perm = [i for i in range(r - 1) if i != ax] + [ax]

    def part(k):
        p = c.reshape(c.op("slice", [x], axis=r - 1, start=k, length=1), shp[:-1])
        return c.op("transpose", [p], perm=tuple(perm)) if perm != list(range(r - 1)) else p
    xr = part(0)
    xi = part(1) if comp == 2 else None
    n = np.arange(nin)[:, None].astype(np.float64)
    if inverse and onesided:          # irfft: hermitian input of L // 2 + 1 bins -> L real samples
        kout = L
        theta = 2 * np.pi * n * np.arange(L)[None, :] / L
        w = np.where((n == 0) | ((L % 2 == 0) & (n == L // 2)), 1.0, 2.0) * (n <= L // 2)
        A, B, Cm, Dm = w * np.cos(theta) / L, -w * np.sin(theta) / L, None, None
    else:
        kout = L // 2 + 1 if onesided and not inverse else L
        sgn = 1.0 if inverse else -1.0
        theta = sgn * 2 * np.pi * n * np.arange(kout)[None, :] / L
        keep = (n < L).astype(np.float64)
        scale = 1.0 / L if inverse else 1.0
        A, B = keep * np.cos(theta) * scale, -keep * np.sin(theta) * scale
        Cm, Dm = keep * np.sin(theta) * scale, keep * np.cos(theta) * scale

    def mm(v, m):
        return c.op("matmul", [v, c.g.const(m.astype(dt))])
    re = mm(xr, A)
    if xi is not None:
        re = c.op("add", [re, mm(xi, B)])
    parts = [re]
    if Cm is not None:
        im = mm(xr, Cm)
        if xi is not None:
            im = c.op("add", [im, mm(xi, Dm)])
        parts.append(im)
    inv = [perm.index(i) for i in range(r - 1)]
    oshape = [kout if i == ax else d for i, d in enumerate(shp[:-1])]
    outs = []
    for p in parts:
        if perm != list(range(r - 1)):
            p = c.op("transpose", [p], perm=tuple(inv))
        outs.append(c.reshape(p, oshape + [1]))
    return outs[0] if len(outs) == 1 else c.op("concat", outs, axis=r - 1)


@handler("STFT")
def _stft(c):
    x, step, window, flen = c.inp(0), c.known(1, "frame_step"), c.inp(2), c.inp(3)
    step = int(np.asarray(step).ravel()[0])
    if flen is not None:
        fl = int(np.asarray(c.known(3, "frame_length")).ravel()[0])
    elif window is not None:
        fl = shape_of(window)[0]
    else:
        raise ShapeError("STFT needs a window or a frame_length")
    B, n, comp = shape_of(x)
    if not isinstance(n, int):
        raise Unsupported("symbolic signal length")
    nf = 1 + (n - fl) // step
    frames = [c.reshape(c.op("slice", [x], axis=1, start=f * step, length=fl), [B, 1, fl, comp]) for f in range(nf)]
    fr = frames[0] if nf == 1 else c.op("concat", frames, axis=1)
    if window is not None:
        fr = c.op("mul", [fr, c.reshape(c.cast(window, dtype_of(x)), [1, 1, fl, 1])])
    return _dft_apply(c, fr, 2, fl, False, bool(c.attr("onesided", 1)))


@handler("MelWeightMatrix")
def _mel_weight_matrix(c):
    """Every input sizes the output: evaluated at compile time by onnx's reference."""
    ins = [c.known(i, n) for i, n in enumerate(("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
                                                 "upper_edge_hertz"))]
    r = c.ref_eval(c.node, ins)
    if r is None:
        raise Unsupported("reference evaluation failed")
    return r
