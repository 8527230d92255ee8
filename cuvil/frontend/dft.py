"""Discrete Fourier transforms as one GEMM per transformed axis, shared by the ONNX and torch frontends.

Complex values are float pairs (a trailing axis of 2: ONNX's own form, and how the torch frontend
keeps complex tensors), so an n-point transform over one axis is (..., n * 2) @ W(2n, 2k) with a
constant W, exact to double precision (angles reduced mod n before the cosine). Dense matrices cost
O(n^2) per transform: right for the short frames of spectrogram front ends and rotary tables, and
refused past MAX_ELEMENTS rather than built into a weight file of gigabytes."""
from __future__ import annotations

import numpy as np

MAX_ELEMENTS = 1 << 24          # a 64 MiB float32 matrix: a complex transform of about 2048 points


class TooLarge(ValueError):
    """The transform's dense matrix would exceed MAX_ELEMENTS."""


def _angles(rows: int, cols: int, period: int) -> np.ndarray:
    j, k = np.arange(rows)[:, None], np.arange(cols)[None, :]
    return 2 * np.pi * ((j * k) % period) / period


def _check(rows, cols):
    if rows * cols > MAX_ELEMENTS:
        raise TooLarge(f"a {rows} x {cols} DFT matrix is over the {MAX_ELEMENTS}-element limit of the dense "
                       "transform (no FFT kernel yet)")


def forward_matrix(n_in: int, length: int, bins: int, sign: float, scale: float, real_in: bool) -> np.ndarray:
    """x (n_in samples, real or pairs) -> `bins` complex bins of a `length`-point transform, exponent
    sign * 2 pi i jk / length, times scale. Samples past `length` are dropped (ONNX's truncation);
    fewer than `length` act as zero padding."""
    rows = n_in if real_in else 2 * n_in
    _check(rows, 2 * bins)
    theta = sign * _angles(n_in, bins, length)
    keep = (np.arange(n_in) < length)[:, None] * scale
    c, s = np.cos(theta) * keep, np.sin(theta) * keep
    w = np.zeros((rows, 2 * bins))
    if real_in:
        w[:, 0::2], w[:, 1::2] = c, s
    else:                               # (a + ib)(c + is) = (ac - bs) + i(as + bc)
        w[0::2, 0::2], w[0::2, 1::2], w[1::2, 0::2], w[1::2, 1::2] = c, s, -s, c
    return w


def hermitian_matrix(bins: int, length: int, scale: float) -> np.ndarray:
    """`bins` complex bins of a Hermitian spectrum -> `length` real samples (irfft): the bins past
    length // 2 are ignored, as are the imaginary parts of bin 0 and of the Nyquist bin."""
    _check(2 * bins, length)
    k = np.arange(bins)[:, None]
    twice = np.where((k == 0) | ((length % 2 == 0) & (k == length // 2)), 1.0, 2.0) * (k <= length // 2)
    theta = _angles(bins, length, length)
    w = np.zeros((2 * bins, length))
    w[0::2], w[1::2] = twice * np.cos(theta) * scale, -twice * np.sin(theta) * scale
    return w


def transform(add, const, x, axis: int, rank: int, w: np.ndarray, pair_in: bool, pair_out: bool):
    """w applied along logical axis `axis` of x (rank `rank`, plus a trailing pair axis when pair_in).
    add(op, inputs, attrs) and const(array) build the frontend's IR nodes."""
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = perm != list(range(rank))
    if moved:
        x = add("transpose", [x], {"perm": perm + ([rank] if pair_in else [])})
    lead = list(x.type.shape[:rank - 1])
    n = x.type.shape[rank - 1]
    y = add("matmul", [add("reshape", [x], {"shape": lead + [n * 2 if pair_in else n]}),
                       const(w.astype(x.dtype))], {})
    cols = w.shape[1] // 2 if pair_out else w.shape[1]
    y = add("reshape", [y], {"shape": lead + [cols] + ([2] if pair_out else [])})
    if moved:
        inv = [perm.index(i) for i in range(rank)]
        y = add("transpose", [y], {"perm": inv + ([rank] if pair_out else [])})
    return y
