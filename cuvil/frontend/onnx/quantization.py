"""Quantization op handlers.

QuantizeLinear / DequantizeLinear (per-tensor, per-axis or blocked scale and zero point; integer and
float8 / float4 formats), QLinearMatMul, MatMulInteger, ConvInteger and QLinearConv."""
from __future__ import annotations

import numpy as np

from .helpers import NeedsConstant, Unsupported, auto_pad, dtype_of, norm_axis, rank_of, shape_of
from .model import ONNX_DTYPES
from .registry import handler


# ---- quantization ---------------------------------------------------------------------------------
def _q_param(c, p, x, axis, block):
    """Scale / zero point broadcast against x (per-tensor, per-axis or blocked)."""
    if p is None or rank_of(p) == 0 or (rank_of(p) == 1 and shape_of(p)[0] == 1 and not block):
        return p if p is None or rank_of(p) == 0 else c.reshape(p, [])
    r = rank_of(x)
    axis = norm_axis(axis, r)
    if block:
        if isinstance(p, np.ndarray):
            return np.repeat(p, block, axis=axis).take(range(shape_of(x)[axis]), axis=axis)
        c.need_const.update(c.input_ancestors(p))
        raise NeedsConstant("blocked quantization with run-time parameters")
    return c.reshape(p, [shape_of(p)[0]] + [1] * (r - axis - 1))


_QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
           "int32": (-2**31, 2**31 - 1), "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
_QFLOAT = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn")


@handler("QuantizeLinear")
def _quantize(c):
    x, scale, zp = c.inp(0), c.inp(1), c.inp(2)
    axis = c.attr("axis", 1)
    block = c.attr("block_size", 0)
    out_dt = dtype_of(zp) if zp is not None else ONNX_DTYPES.get(c.attr("output_dtype", 0) or 2)
    dt = dtype_of(x)
    s = _q_param(c, scale, x, axis, block)
    if out_dt in _QFLOAT:       # x / scale (+ zero point), rounded by the cast to the float format
        y = c.op("div", [x, c.cast(s, dt)])
        if zp is not None:
            y = c.op("add", [y, c.cast(_q_param(c, zp, x, axis, block), dt)])
        return c.op("cast", [y], to=out_dt, saturate=bool(c.attr("saturate", 1)))
    if out_dt not in _QRANGE:
        raise Unsupported(f"quantize to {out_dt}")
    if not c.attr("saturate", 1):
        raise Unsupported("saturate=0")
    y = c.op("round", [c.op("div", [x, c.cast(s, dt)])])
    if zp is not None:
        y = c.op("add", [y, c.cast(_q_param(c, zp, x, axis, block), dt)])
    lo, hi = _QRANGE[out_dt]
    y = c.op("clip", [y], min=float(lo), max=float(hi))
    return c.op("cast", [y], to=out_dt)


@handler("DequantizeLinear")
def _dequantize(c):
    x, scale, zp = c.inp(0), c.inp(1), c.inp(2)
    axis = c.attr("axis", 1)
    block = c.attr("block_size", 0)
    sdt = dtype_of(scale)
    y = c.cast(x, "int64" if not dtype_of(x).startswith(("float", "bfloat")) else sdt if "_" in dtype_of(x) else dtype_of(x))
    y = c.val(y) if isinstance(y, np.ndarray) else y
    if zp is not None:
        y = c.op("sub", [y, c.cast(_q_param(c, zp, x, axis, block), dtype_of(y))])
    y = c.cast(y, sdt)
    return c.op("mul", [y, _q_param(c, scale, x, axis, block)])


@handler("QLinearMatMul")
def _qlinear_matmul(c):
    """Integer matmul of the zero-point-shifted operands, requantized as onnx's reference does."""
    a, as_, azp, b, bs, bzp, ys, yzp = (c.inp(i) for i in range(8))
    out_dt = dtype_of(yzp) if yzp is not None else dtype_of(a)
    if out_dt not in _QRANGE:
        raise Unsupported(f"QLinearMatMul to {out_dt}")
    A = c.cast(a, "int32")
    if azp is not None:
        A = c.op("sub", [A, c.cast(azp, "int32")])
    B = c.cast(b, "int32")
    if bzp is not None:
        B = c.op("sub", [B, c.cast(bzp, "int32")])
    acc = c.cast(c.op("matmul", [A, B]), "float64")
    scale = c.op("div", [c.op("mul", [as_, c.cast(bs, dtype_of(as_))]), c.cast(ys, dtype_of(as_))])
    d = c.op("mul", [acc, c.cast(scale, "float64")])
    if yzp is not None:
        d = c.op("add", [d, c.cast(yzp, "float64")])
    lo, hi = _QRANGE[out_dt]
    return c.cast(c.op("clip", [c.op("round", [d])], min=float(lo), max=float(hi)), out_dt)


def _dynamic_matmul_on_integer_kernels(c):
    """quantize_dynamic's MatMulInteger(DynamicQuantizeLinear(x), constant W) at precision="int8":
    round(x @ (W - W_zero_point) / x_scale) in int32, what the node computes up to its activation
    rounding. The float matmul over integer weights is what passes/quantize.py puts on the integer
    kernels, W's values kept exactly (ir/quant.int8_grid); the model's Cast and scale multiply follow
    as it has them. ONNX Runtime quantizes x per tensor to uint8 with a zero point, the kernels per
    block of K to int8: the results differ by about ORT's own activation rounding. None where the
    pattern does not hold (the exact int32 emulation below runs instead)."""
    p = c.producer(c.node.input[0])
    azp_name = c.node.input[2] if len(c.node.input) > 2 else ""
    # A must be the quantized x and its zero point the one computed with it (without it, the node
    # would take A's zero point as 0 and the rewrite would not compute the same thing)
    if p is None or p.op_type != "DynamicQuantizeLinear" or c.node.input[0] != p.output[0] or \
            azp_name != p.output[2]:
        return None
    b, bzp = c.inp(1), c.inp(3)
    if not isinstance(b, np.ndarray) or b.dtype not in (np.int8, np.uint8) or b.ndim != 2 or \
            not (bzp is None or isinstance(bzp, np.ndarray) and bzp.size in (1, b.shape[1])):
        return None
    w = b.astype(np.float32) - (np.asarray(bzp, np.float32).reshape(-1) if bzp is not None else np.float32(0))
    x = c.env[p.input[0]]
    if w.min() < -128 or w.max() > 127 or dtype_of(x) != "float32" or rank_of(x) < 2:
        return None
    y = c.op("div", [c.op("matmul", [c.val(x), c.g.const(w)]), c.val(c.env[p.output[1]])])
    return c.cast(c.op("round", [y]), "int32")


@handler("MatMulInteger")
def _matmul_integer(c):
    if c.integer_kernels and (y := _dynamic_matmul_on_integer_kernels(c)) is not None:
        return y
    a, b, azp, bzp = (c.inp(i) for i in range(4))
    A = c.cast(a, "int32")
    if azp is not None:
        z = c.cast(azp, "int32")
        A = c.op("sub", [A, c.reshape(z, [shape_of(z)[0], 1]) if rank_of(z) == 1 and shape_of(z)[0] != 1 else z])
    B = c.cast(b, "int32")
    if bzp is not None:
        B = c.op("sub", [B, c.cast(bzp, "int32")])
    return c.op("matmul", [A, B])


def _shifted_conv(c, x, xzp, w, wzp, bias=None):
    """conv(x - x_zero_point, w - w_zero_point [, bias]) in float64: exact for 8-bit operands. A
    per-output-channel weight zero point broadcasts over the kernel's other axes."""
    xf = c.cast(x, "float64")
    if xzp is not None:
        xf = c.op("sub", [xf, c.cast(xzp, "float64")])
    wf = c.cast(w, "float64")
    if wzp is not None:
        wz = c.cast(wzp, "float64")
        if rank_of(wz) == 1 and shape_of(wz)[0] != 1:
            wz = c.reshape(wz, [shape_of(wz)[0]] + [1] * (rank_of(w) - 1))
        wf = c.op("sub", [wf, wz])
    nsp = rank_of(x) - 2
    kernel = c.attr("kernel_shape") or list(shape_of(w)[2:])
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    pads = auto_pad(c, list(shape_of(x)[2:]), kernel, strides, dil)
    ins = [xf, wf] + ([c.cast(bias, "float64")] if bias is not None else [])
    return c.op("conv", ins, strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil), groups=c.attr("group", 1))


@handler("ConvInteger")
def _conv_integer(c):
    """Exact in float64 for 8-bit operands: conv of the zero-point-shifted inputs, cast to int32."""
    x, w, xzp, wzp = (c.inp(i) for i in range(4))
    return c.cast(_shifted_conv(c, x, xzp, w, wzp), "int32")


@handler("QLinearConv")
def _qlinear_conv(c):
    x, xs, xzp, w, ws, wzp, ys, yzp, b = (c.inp(i) for i in range(9))
    acc = _shifted_conv(c, x, xzp, w, wzp, b)
    scale = c.op("mul", [xs, c.cast(ws, dtype_of(xs))])
    if rank_of(scale) == 1 and shape_of(scale)[0] != 1:         # per output channel
        scale = c.reshape(scale, [1, shape_of(scale)[0]] + [1] * (rank_of(x) - 2))
    scale = c.op("div", [scale, c.cast(ys, dtype_of(xs))])
    d = c.op("mul", [acc, c.cast(scale, "float64")])
    out_dt = dtype_of(yzp) if yzp is not None else "uint8"
    if yzp is not None:
        d = c.op("add", [d, c.cast(yzp, "float64")])
    lo, hi = _QRANGE[out_dt]
    return c.cast(c.op("round", [c.op("clip", [d], min=float(lo), max=float(hi))]), out_dt)
