"""ATen fake quantization -> IR (quantization-aware-trained models, torch.ao.quantization.prepare_qat):
fake_quantize_per_tensor_affine / _per_channel_affine and the fused observer + fake-quant op that
FusedMovingAvgObsFakeQuantize exports as. A compiled model is inference: its observers must be off
(model.apply(torch.ao.quantization.disable_observer)), the scales and zero points then are the
constants training left, and the op is exactly (clamp(round(x / scale) + zp, qmin, qmax) - zp) * scale
as torch computes it (x times the float32 reciprocal of scale, rounded half to even).

Weights fake-quantized this way fold to float weights on an int8 grid; compiled with
precision="int8", passes/quantize.py keeps that grid exactly (ir/quant.int8_grid) and runs them on
the integer kernels."""
from __future__ import annotations

import numpy as np

from .aten import Unsupported, aten, handles


def _constant(v, what):
    if not getattr(v, "is_const", False):
        raise Unsupported(f"{what} must be a constant of the trained model")
    return np.asarray(v.data)


def _fake_quant(ctx, x, scale, zero_point, qmin, qmax, axis=None):
    """The fake-quantized x; scale / zero_point scalars, or vectors along `axis`."""
    s = np.asarray(scale, np.float32).reshape(-1)
    zp = np.asarray(zero_point).astype(np.float32).reshape(-1)
    shape = [1] * x.type.rank
    if axis is not None and s.size > 1:
        shape[axis % x.type.rank] = s.size
    else:
        s, zp, shape = s[:1], zp[:1], []
    inv = (np.float32(1) / s).astype(np.float32)
    c = lambda a: ctx.g.const(a.reshape(shape).astype(np.float32))      # noqa: E731
    q = ctx.add("add", [ctx.add("round", [ctx.add("mul", [x, c(inv)])]), c(zp)])
    q = ctx.add("clip", [q], {"min": float(qmin), "max": float(qmax)})
    return ctx.add("mul", [ctx.add("sub", [q, c(zp)]), c(s)])


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
