"""F.linear_cross_entropy's chunked custom ops (torch.nn's torch_nn:: namespace) -> IR: the linear layer
and the cross entropy as torch defines it (class weights, ignore_index, label smoothing, mean / sum /
none). The chunking is a training-memory device; a compiled forward computes the loss whole."""
from __future__ import annotations

from .aten import Unsupported, handles, outputs_read


def _per_sample(ctx, x, w, target, bias, weight, ignore_index, smoothing):
    """(loss per sample [N], the weight each counts with in a mean [N])."""
    if w.type.rank != 2 or x.type.rank != 2 or target.type.rank != 1:
        raise Unsupported("linear_cross_entropy over more than one batch or class dim")
    dt = x.dtype
    logits = ctx.add("matmul", [x, ctx.add("transpose", [w], {"perm": [1, 0]})])
    if bias is not None:
        logits = ctx.add("add", [logits, bias])
    lsm = ctx.add("log_softmax", [logits], {"axis": 1})
    n, classes = x.shape[0], w.shape[0]
    keep = ctx.add("ne", [target, ctx.tensor(ignore_index, target.dtype)])
    tgt = ctx.add("where", [keep, ctx.tensor(target, "int64"), ctx.tensor(0, "int64")])   # ignored: reads class 0
    picked = ctx.add("reshape", [ctx.add("gather_elements", [lsm, ctx.add("reshape", [tgt], {"shape": [n, 1]})],
                                         {"axis": 1})], {"shape": [n]})
    w_t = ctx.add("gather", [weight, tgt], {"axis": 0}) if weight is not None else ctx.tensor(1.0, dt)
    counted = ctx.add("where", [keep, w_t, ctx.tensor(0.0, dt)])
    loss = ctx.add("neg", [ctx.add("mul", [picked, counted])])
    if smoothing:
        scaled = lsm if weight is None else ctx.add("mul", [lsm, ctx.add("reshape", [weight], {"shape": [1, classes]})])
        smooth = ctx.add("neg", [ctx.add("reduce_sum", [scaled], {"axes": [1], "keepdims": False})])
        smooth = ctx.add("where", [keep, smooth, ctx.tensor(0.0, dt)])
        loss = ctx.add("add", [ctx.add("mul", [loss, ctx.tensor(1.0 - smoothing, dt)]),
                               ctx.add("mul", [smooth, ctx.tensor(smoothing / classes, dt)])])
    return loss, counted


@handles("torch_nn::_linear_cross_entropy_batch_chunked")
def _chunked(ctx, x, w, target, bias, weight, reduction, ignore_index, smoothing, *rest):
    if outputs_read(ctx) - {0}:
        raise Unsupported("linear_cross_entropy's precomputed gradients")
    loss, counted = _per_sample(ctx, x, w, target, bias, weight, ignore_index, smoothing)
    total = ctx.add("reduce_sum", [loss], {"axes": [0], "keepdims": False})
    if reduction == "mean":
        total = ctx.add("div", [total, ctx.add("reduce_sum", [counted], {"axes": [0], "keepdims": False})])
    elif reduction != "sum":
        raise Unsupported(f"linear_cross_entropy reduction {reduction!r}")
    return (total, None, None, None)


@handles("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def _chunked_none(ctx, x, w, target, bias, weight, ignore_index, *rest):
    return _per_sample(ctx, x, w, target, bias, weight, ignore_index, 0.0)[0]
