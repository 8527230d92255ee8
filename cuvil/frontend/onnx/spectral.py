"""Spectral op handlers.

DFT as one GEMM per transformed axis with a constant matrix (../dft.py), STFT through the same
transform over strided frames, and MelWeightMatrix evaluated at compile time."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .. import dft
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
    """x (..., n, 1 | 2): real samples or (real, imaginary) pairs along logical axis ax -> pairs (..., k, 2),
    or real samples (..., L, 1) for an inverse one-sided transform (irfft)."""
    x = c.val(x)
    shp = list(shape_of(x))
    r, nin, comp = len(shp) - 1, shp[ax], shp[-1]
    scale = 1.0 / L if inverse else 1.0
    if inverse and onesided:
        w, pair_out = dft.hermitian_matrix(nin, L, scale), False
    else:
        bins = L // 2 + 1 if onesided else L
        w, pair_out = dft.forward_matrix(nin, L, bins, 1.0 if inverse else -1.0, scale, False), True
    if comp == 1:                      # real samples: only the rows that read real parts
        w, x = w[0::2], c.reshape(x, shp[:-1])
    try:
        y = dft.transform(lambda op, ins, attrs: c.op(op, ins, **attrs), c.g.const, x, ax, r, w, comp == 2, pair_out)
    except dft.TooLarge as e:
        raise Unsupported(str(e)) from None
    return y if pair_out else c.reshape(y, list(y.shape) + [1])


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
