"""Weight quantization of a [K, N] weight (K = input features) into matmul_q's storage (ir/ops/llm.py):
int8 per output channel, int4 in groups along K with one scale per group and column, bf16 and fp16
by rounding to nearest even. Shared by the LLM path and the general precision pass (passes/quantize.py)."""
from __future__ import annotations

import numpy as np

from ..errors import QuantizationError

PRECISIONS = ("fp32", "bf16", "int8", "int4")
INT8_MAX_K = 65792      # kernels/int8dot.h CUVIL_I8_MAX_K: the most K an integer conv sums without overflow


def to_bf16(w: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(w, np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def to_fp16(w: np.ndarray) -> np.ndarray:
    """fp32 -> IEEE half, rounding to nearest even; a weight beyond half's range (65504) is an error,
    not an infinity."""
    big = float(np.abs(w).max()) if w.size else 0.0
    if big > 65504:
        raise QuantizationError(f"fp16: a weight of magnitude {big:.4g} exceeds float16's range (65504)")
    return np.asarray(w, np.float32).astype(np.float16)


def int8_grid(w: np.ndarray):
    """(int8 [K, N], float32 scales [1, N]) when every column of w is integers in [-128, 127] times a
    scale of its own: the weights of a model quantized before it reached cuvil (ONNX QDQ per tensor or
    per channel, QAT fake-quant, MatMulInteger's integers), kept exactly rather than re-rounded onto
    quantize_int8's amax / 127 grid. None for any other weight.

    A column's scale is its largest |value| over its largest |integer| k, which is not known (a QAT
    weight moved after its scale was fixed; per tensor, most columns stop short of 127): each k in
    128..1 is tried on the first rows, then the whole column is checked at the k that fits."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2 or w.size == 0:
        return None
    col = np.abs(w).max(axis=0)
    ks = np.arange(128, 0, -1, dtype=np.float32)[:, None]

    positive_peak = w[np.abs(w).argmax(axis=0), np.arange(w.shape[1])] > 0

    def largest_fitting_k(cols):
        """Per column of cols: the scale at the largest k that fits its first 32 rows (None if one has none);
        k = 128 only where the column's largest magnitude is negative (+128 is no int8)."""
        sample, c = w[:32, cols], col[cols]
        scales = np.where(c > 0, c / ks, 1).astype(np.float32)                     # [128, n]
        q = np.rint(sample[None] / scales[:, None, :])
        fits = np.all(np.abs(q * scales[:, None, :] - sample[None]) <= 2 ** -20 * np.abs(sample[None]), axis=1)
        fits[0] &= ~positive_peak[cols]
        return scales[fits.argmax(axis=0), np.arange(len(c))] if fits.any(axis=0).all() else None

    N = w.shape[1]
    if largest_fitting_k(np.unique([0, N // 2, N - 1])) is None:                   # a float weight: said at once
        return None
    parts = [largest_fitting_k(np.arange(n, min(n + 1024, N))) for n in range(0, N, 1024)]
    if any(p is None for p in parts):
        return None
    s = np.concatenate(parts)[None, :]
    q = np.rint(w / s)
    if q.min() < -128 or q.max() > 127 or not np.allclose(q * s, w, rtol=2 ** -20, atol=0):
        return None
    return q.astype(np.int8), s


def byte_grid(scale, zero_point, qmin, qmax):
    """[lo, hi] = [(qmin - zero_point) * scale, (qmax - zero_point) * scale]: the values a per-tensor
    dequantize of integers in [qmin, qmax] gives (a quantized model's conv input, which an int8 conv then
    reads as those very bytes: the conv's int8_range), or None where that is no byte grid (more than 256
    levels), the scale is not positive, or an end leaves float32's range (NaN too). scale and zero_point
    come from the model file: checked here, once for every frontend."""
    s, z = float(scale), float(zero_point)
    r = [(qmin - z) * s, (qmax - z) * s]
    fits = all(abs(v) <= float(np.finfo(np.float32).max) for v in r)
    return r if qmax - qmin <= 255 and s > 0 and fits else None


def quantize_int8(w: np.ndarray):
    """Symmetric per output channel: returns (int8 [K, N], float32 scales [1, N])."""
    amax = np.abs(w).max(axis=0, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.divide(w, scale)
    np.rint(q, out=q)
    np.clip(q, -127, 127, out=q)
    return q.astype(np.int8), scale


def quantize_int4(w: np.ndarray, group: int):
    """Symmetric in groups of `group` rows of K: returns (uint8 [K, N/2] two columns per byte,
    float32 scales [ceil(K/group), N] holding float16 values). Values are stored + 8 in [1, 15]."""
    K, N = w.shape
    if N % 2:
        raise QuantizationError("int4 needs an even number of output features")
    G = -(-K // group)
    padded = np.zeros((G * group, N), np.float32)
    padded[:K] = w
    g = padded.reshape(G, group, N)
    amax = np.abs(g).max(axis=1)
    # scales are stored as float16 (matmul_q's int4 contract): the values are quantized against the
    # rounded scale, so the rounding costs nothing beyond it
    with np.errstate(over="ignore"):
        scale = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float16)
    if not np.isfinite(scale).all():
        raise QuantizationError(f"int4: a weight of magnitude {float(amax.max()):.4g} exceeds what float16 "
                                f"scales hold (|w| <= {7 * 65504})")
    scale = np.where(scale > 0, scale, np.float16(1)).astype(np.float32)   # below float16's range: all zeros
    # in place, one temporary: the build quantizes every weight of the model through here
    np.divide(g, scale[:, None, :], out=g)
    np.rint(g, out=g)
    np.clip(g, -7, 7, out=g)
    g += 8
    q = padded[:K].astype(np.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale
