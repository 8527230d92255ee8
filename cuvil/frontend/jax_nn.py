"""The jaxpr primitives with a kernel behind them -> IR: dot_general (a matmul between transposes and
reshapes), conv_general_dilated (the IR's NCHW conv, transposed into and out of the given dimension
numbers) and reduce_window_{max,min,sum} (the IR's pools, over the windowed dims)."""
from __future__ import annotations

import math

import numpy as np

from .jax_registry import Unsupported, handles


@handles("dot_general")
def _dot_general(ctx, a, b, *, dimension_numbers, **_):
    """Each operand transposed to [batch, free, contracted] (rhs: [batch, contracted, free]) and reshaped
    to one free and one contracted dim: a batched matmul, whose [batch, m, n] is jax's output order."""
    (lc, rc), (lb, rb) = dimension_numbers
    dt = ctx.out().dtype                  # preferred_element_type: computed in the output's dtype
    a, b = ctx.cast(a, dt), ctx.cast(b, dt)
    lf = [d for d in range(a.type.rank) if d not in lc and d not in lb]
    rf = [d for d in range(b.type.rank) if d not in rc and d not in rb]
    batch = [a.shape[d] for d in lb]
    k = math.prod(a.shape[d] for d in lc)
    m, n = math.prod(a.shape[d] for d in lf), math.prod(b.shape[d] for d in rf)
    a2 = ctx.reshape(ctx.transpose(a, [*lb, *lf, *lc]), [*batch, m, k])
    b2 = ctx.reshape(ctx.transpose(b, [*rb, *rc, *rf]), [*batch, k, n])
    return ctx.reshape(ctx.add("matmul", [a2, b2]), ctx.out().shape)


@handles("conv_general_dilated")
def _conv(ctx, x, w, *, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
          feature_group_count, batch_group_count, **_):
    if any(d != 1 for d in lhs_dilation):
        raise Unsupported("lhs_dilation (a transposed convolution)")
    if batch_group_count != 1:
        raise Unsupported("batch_group_count")
    if any(lo < 0 or hi < 0 for lo, hi in padding):
        raise Unsupported("negative padding")
    rank = x.type.rank
    dn = dimension_numbers
    specs = (dn.lhs_spec, dn.rhs_spec, dn.out_spec) if dn is not None else (range(rank),) * 3
    dt = ctx.out().dtype
    x = ctx.transpose(ctx.cast(x, dt), specs[0])     # -> [N, C, spatial...]
    w = ctx.transpose(ctx.cast(w, dt), specs[1])     # -> [O, I, spatial...]
    y = ctx.add("conv", [x, w], {"strides": list(window_strides), "pads": [(int(lo), int(hi)) for lo, hi in padding],
                                 "dilations": list(rhs_dilation), "groups": feature_group_count})
    return ctx.transpose(y, np.argsort(specs[2]).tolist())


@handles("reduce_window_max", "reduce_window_min", "reduce_window_sum")
def _pool(ctx, x, *, window_dimensions, window_strides, padding, base_dilation, window_dilation, **_):
    """The windowed dims become the pool's spatial dims, the others its [N, C] (the first of them N, the
    rest merged into C). A sum is the average over the padded window times the window's size; a min
    the negated max of the negated input."""
    rank = x.type.rank
    spatial = [d for d in range(rank) if (window_dimensions[d], window_strides[d], tuple(padding[d]),
                                          window_dilation[d]) != (1, 1, (0, 0), 1)]
    if any(d != 1 for d in base_dilation):
        raise Unsupported("base_dilation")
    if not 1 <= len(spatial) <= 3 or x.dtype != "float32":
        raise Unsupported(f"{x.dtype} windows over {len(spatial)} dims (1 to 3 float32 dims are supported)")
    others = [d for d in range(rank) if d not in spatial]
    kernel = [window_dimensions[d] for d in spatial]
    nc = [x.shape[others[0]] if others else 1, math.prod(x.shape[d] for d in others[1:])]
    t = ctx.reshape(ctx.transpose(x, others + spatial), nc + [x.shape[d] for d in spatial])
    attrs = {"kernel": kernel, "strides": [window_strides[d] for d in spatial],
             "pads": [tuple(int(p) for p in padding[d]) for d in spatial],
             "dilations": [window_dilation[d] for d in spatial]}
    kind = ctx.eqn.primitive.name
    if kind == "reduce_window_sum":
        y = ctx.add("avg_pool", [t], dict(attrs, count_include_pad=True))
        y = ctx.add("mul", [y, ctx.scalar(math.prod(kernel), y.dtype)])
    elif kind == "reduce_window_max":
        y = ctx.add("max_pool", [t], attrs)
    else:
        y = ctx.add("neg", [ctx.add("max_pool", [ctx.add("neg", [t])], attrs)])
    out = ctx.out().shape
    y = ctx.reshape(y, [x.shape[d] for d in others] + [out[d] for d in spatial])
    return ctx.transpose(y, np.argsort(others + spatial).tolist())
