"""Quantized PyTorch graphs -> IR: fake quantization of quantization-aware-trained models
(torch.ao.quantization.prepare_qat: fake_quantize_per_tensor_affine / _per_channel_affine and the fused
observer + fake-quant op that FusedMovingAvgObsFakeQuantize exports as), and the quantize /
dequantize pairs of PT2E-converted graphs (torchao's convert_pt2e: quantized_decomposed ops). A compiled model is inference: its observers must be off
(model.apply(torch.ao.quantization.disable_observer)), the scales and zero points then are the
constants training left, and the op is exactly (clamp(round(x / scale) + zp, qmin, qmax) - zp) * scale
as torch computes it (x times the float32 reciprocal of scale, rounded half to even).

Weights fake-quantized this way fold to float weights on an int8 grid; compiled with
precision="int8", passes/quantize.py keeps that grid exactly (ir/quant.int8_grid) and runs them on
the integer kernels."""
from __future__ import annotations

import numpy as np

from ..ir.quant import byte_grid
from .aten import Unsupported, aten, handles


def _constant(v, what):
    if not getattr(v, "is_const", False):
        raise Unsupported(f"{what} must be a constant of the trained model")
    return np.asarray(v.data)


def _params(ctx, rank, scale, zero_point, axis):
    """(scale, zero point, a maker of float32 constants shaped to broadcast them along axis)."""
    s = np.asarray(scale, np.float32).reshape(-1)
    zp = np.zeros(1, np.float32) if zero_point is None else np.asarray(zero_point).astype(np.float32).reshape(-1)
    shape = [1] * rank
    n = max(s.size, zp.size)
    if axis is not None and n > 1:
        shape[axis % rank] = n
        s, zp = np.broadcast_to(s, (n,)), np.broadcast_to(zp, (n,))
    else:
        s, zp, shape = s[:1], zp[:1], []
    return s, zp, lambda a: ctx.g.const(np.ascontiguousarray(a).reshape(shape).astype(np.float32))


def _quantize(ctx, x, scale, zero_point, qmin, qmax, axis=None):
    """clamp(round(x * (1 / scale)) + zp, qmin, qmax), in float (the caller casts)."""
    s, zp, c = _params(ctx, x.type.rank, scale, zero_point, axis)
    inv = (np.float32(1) / s).astype(np.float32)
    q = ctx.add("add", [ctx.add("round", [ctx.add("mul", [ctx.tensor(x, "float32"), c(inv)])]), c(zp)])
    return ctx.add("clip", [q], {"min": float(qmin), "max": float(qmax)})


def _dequantize(ctx, q, scale, zero_point, axis=None, qrange=None):
    """(q - zero_point) * scale; qrange: q's (min, max), whose image the output's grid is (Ctx.grids),
    where the scale is one number."""
    s, zp, c = _params(ctx, q.type.rank, scale, zero_point, axis)
    y = ctx.add("mul", [ctx.add("sub", [ctx.tensor(q, "float32"), c(zp)]), c(s)])
    if qrange is not None and s.size == zp.size == 1 and (grid := byte_grid(s[0], zp[0], *qrange)):
        ctx.grids[id(y)] = grid
    return y


def _fake_quant(ctx, x, scale, zero_point, qmin, qmax, axis=None):
    """The fake-quantized x; scale / zero_point scalars, or vectors along `axis`."""
    return _dequantize(ctx, _quantize(ctx, x, scale, zero_point, qmin, qmax, axis), scale, zero_point, axis,
                       (qmin, qmax))


@handles(aten.fake_quantize_per_tensor_affine.default, aten.fake_quantize_per_tensor_affine.tensor_qparams)
def _per_tensor(ctx, x, scale, zero_point, quant_min, quant_max):
    s = scale if isinstance(scale, float) else _constant(scale, "the scale")
    zp = zero_point if isinstance(zero_point, int) else _constant(zero_point, "the zero point")
    return _fake_quant(ctx, x, s, zp, quant_min, quant_max)


@handles(aten.fake_quantize_per_channel_affine.default)
def _per_channel(ctx, x, scale, zero_point, axis, quant_min, quant_max):
    return _fake_quant(ctx, x, _constant(scale, "the scale"), _constant(zero_point, "the zero point"), quant_min,
                       quant_max, axis)


def _observer_off(observer_on, fake_quant_on):
    if _constant(observer_on, "observer_enabled").any():
        raise Unsupported("its observer is on, so eager would change the scales on every call: compile the model "
                          "after model.apply(torch.ao.quantization.disable_observer)")
    return bool(_constant(fake_quant_on, "fake_quant_enabled").any())


@handles(aten._fused_moving_avg_obs_fq_helper_functional.default)
def _fused_functional(ctx, x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                      averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant=False, symmetric_quant=False):
    """(output, mask, running_min, running_max, scale, zero_point): with the observer off the buffers
    come back unchanged (the artifact writes none of them); mask serves only the backward pass."""
    on = _observer_off(observer_on, fake_quant_on)
    y = x
    if on:
        y = _fake_quant(ctx, x, _constant(scale, "the scale"), _constant(zero_point, "the zero point"), quant_min,
                        quant_max, ch_axis if per_row_fake_quant else None)
    return (y, None, running_min, running_max, scale, zero_point)


@handles(aten.fused_moving_avg_obs_fake_quant.default)
def _fused(ctx, x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const,
           quant_min, quant_max, ch_axis, per_row_fake_quant=False, symmetric_quant=False):
    return _fused_functional(ctx, x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                             averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant)[0]


# ---- PT2E (torchao convert_pt2e): quantized_decomposed quantize / dequantize ------------------------
try:
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers torch.ops.quantized_decomposed
    import torch
    _QD = torch.ops.quantized_decomposed
    _INT_DTYPES = {torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16", torch.int32: "int32"}
except (ImportError, AttributeError):       # a torch without them: PT2E graphs stop at an unsupported op
    _QD = None


def _param(v, what):
    return v if isinstance(v, (int, float)) else _constant(v, what)


def _int_dtype(dtype):
    if dtype not in _INT_DTYPES:
        raise Unsupported(f"quantized dtype {dtype}")
    return _INT_DTYPES[dtype]


if _QD is not None:
    @handles(_QD.quantize_per_tensor.default, _QD.quantize_per_tensor.tensor, _QD.quantize_per_tensor.tensor2)
    def _q_per_tensor(ctx, x, scale, zero_point, quant_min, quant_max, dtype):
        q = _quantize(ctx, x, _param(scale, "the scale"), _param(zero_point, "the zero point"),
                      float(_param(quant_min, "quant_min")), float(_param(quant_max, "quant_max")))
        return ctx.add("cast", [q], {"to": _int_dtype(dtype)})

    @handles(_QD.dequantize_per_tensor.default, _QD.dequantize_per_tensor.tensor, _QD.dequantize_per_tensor.tensor2)
    def _dq_per_tensor(ctx, q, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
        return _dequantize(ctx, q, _param(scale, "the scale"), _param(zero_point, "the zero point"),
                           qrange=(int(_param(quant_min, "quant_min")), int(_param(quant_max, "quant_max"))))

    @handles(_QD.quantize_per_channel.default)
    def _q_per_channel(ctx, x, scales, zero_points, axis, quant_min, quant_max, dtype):
        q = _quantize(ctx, x, _constant(scales, "the scales"), _constant(zero_points, "the zero points"), quant_min,
                      quant_max, axis)
        return ctx.add("cast", [q], {"to": _int_dtype(dtype)})

    @handles(_QD.dequantize_per_channel.default)
    def _dq_per_channel(ctx, q, scales, zero_points, axis, quant_min, quant_max, dtype, *, out_dtype=None):
        zp = None if zero_points is None else _constant(zero_points, "the zero points")
        return _dequantize(ctx, q, _constant(scales, "the scales"), zp, axis)
