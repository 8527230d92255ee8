"""Handlers for the ops torch.export leaves in its graph before core-ATen decomposition
(conv2d, batch_norm, linear, layer_norm, dropout, ...). When every op of a model's exported
graph is known, the frontend converts that graph directly and skips `run_decompositions`,
which retraces the whole program: 3.3 s of ResNet-50's cold compile on this machine.
Anything else (an op without a handler here or in aten.py, an in-place op it cannot prove
safe) falls back to the decomposed graph, so this table only has to be right, not complete."""
from __future__ import annotations

import numpy as np
import torch

from . import aten as A
from .aten import HANDLERS, Unsupported, handles

aten = torch.ops.aten


def _spatial(v, n):
    return [v] * n if isinstance(v, int) else (list(v) * n if len(v) == 1 else list(v))


@handles(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)
def _conv_nd(ctx, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    nsp = w.type.rank - 2
    if isinstance(padding, str):
        raise Unsupported(f"padding={padding!r}")
    if x.type.rank != nsp + 2:
        raise Unsupported("unbatched convolution input")
    return A._conv(ctx, x, w, b, _spatial(stride, nsp), _spatial(padding, nsp), _spatial(dilation, nsp),
                   False, None, groups)


@handles(aten.batch_norm.default)
def _batch_norm(ctx, x, w, b, mean, var, training, momentum, eps, cudnn_enabled=True):
    if training or mean is None or var is None:
        raise Unsupported("batch norm from batch statistics")
    return A._bn(ctx, x, w, b, mean, var, momentum, eps)[0]


@handles(aten.linear.default)
def _linear(ctx, x, w, b=None):
    if w.type.rank != 2 or x.type.rank < 2:
        raise Unsupported("linear on a vector")
    y = ctx.add("matmul", [x, ctx.add("transpose", [w], {"perm": [1, 0]})], A.grid_attrs(ctx, x))
    return ctx.add("add", [y, b]) if b is not None else y


@handles(aten.layer_norm.default)
def _layer_norm(ctx, x, shape, w=None, b=None, eps=1e-5, cudnn_enable=True):
    n = int(np.prod([int(d) for d in shape]))
    w = w if w is not None else ctx.g.const(np.ones(shape, np.float32))
    b = b if b is not None else ctx.g.const(np.zeros(shape, np.float32))
    if x.dtype != "float32" or n != int(np.prod([int(d) for d in w.shape])):
        raise Unsupported("layer norm outside float32")
    return A._layer_norm(ctx, x, shape, w, b, eps)[0]


@handles(aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default)
def _dropout(ctx, x, p, train):
    if train and p:
        raise Unsupported("dropout in training mode")
    return x


@handles(aten.softmax.int, aten.log_softmax.int)
def _softmax(ctx, x, dim, dtype=None):
    op = "softmax" if ctx.node.target == aten.softmax.int else "log_softmax"
    return ctx.add(op, [ctx.tensor(x, A._out_dtype(ctx))], {"axis": dim})


@handles(aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.to.other, aten.type_as.default,
         aten.contiguous.default)
def _to(ctx, x, *a, **kw):
    return ctx.tensor(x, A._out_dtype(ctx))


@handles(aten.adaptive_avg_pool1d.default, aten.adaptive_avg_pool2d.default, aten.adaptive_avg_pool3d.default)
def _adaptive_avg_pool(ctx, x, size):
    if any(int(s) != 1 for s in size):
        raise Unsupported("adaptive pooling to more than one cell")
    return ctx.add("reduce_mean", [x], {"axes": list(range(x.type.rank - len(size), x.type.rank)), "keepdims": True})


for _name, _op in (("__and__", "and"), ("__or__", "or"), ("__xor__", "xor")):
    for _ov in A._overloads(_name):
        HANDLERS[_ov] = A._binary(_op)


def is_view(target) -> bool:
    """The op returns an alias of an input (view, transpose, slice, ...)."""
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def inplace_counterpart(target):
    """aten.add.Tensor for aten.add_.Tensor (an op writing its first argument), when it has a
    handler; None for other ops. Writes to any other argument (out= variants) return None too."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.arguments:
        return None
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(writes) != 1 or writes[0] is not schema.arguments[0]:
        return None
    name = target._overloadpacket.__name__
    pkt = getattr(aten, name[:-1], None) if name.endswith("_") and not name.startswith("_") else None
    op = getattr(pkt, target._overloadname, None) if pkt is not None else None
    return op if op in HANDLERS else None
