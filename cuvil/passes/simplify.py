"""Algebraic simplification: batch norm folded into the conv before it (or into a per-channel
scale and shift), a per-column scale into the linear layer before it, pow by 2, 0.5 and -1 as the
ops those are, zero padding folded into the conv after it, clip(0, 6) named relu6 (an activation
epilogues take), reshape chains collapsed, identity ops removed."""
from __future__ import annotations

import numpy as np

from ..ir import dims as D
from ..ir.graph import Node, TensorType, Value
from .cleanup import replace_uses


def _single_user(graph, users=None):
    """Whether a value has one reader and is no graph output (users: graph.users(), where the caller has it)."""
    users = graph.users() if users is None else users
    outs = {id(o) for o in graph.outputs}
    return lambda v: len(users.get(id(v), [])) == 1 and id(v) not in outs


def _bn_affine(n):
    """A constant batch_norm as one scale and one shift per channel (float64)."""
    scale, bias, mean, var = (i.data.astype(np.float64) for i in n.inputs[1:])
    a = scale / np.sqrt(var + n.attrs["eps"])
    return a, bias - mean * a


def _linear_under_reshapes(v, single):
    """The matmul with a constant float weight [..., K, C] that alone computes v [N, C], through reshapes
    that keep the last dim (LeViT's BatchNorm1d over a linear layer's flattened rows), or None."""
    C = v.shape[-1]
    while v.producer is not None and v.producer.op == "reshape" and single(v) and v.producer.inputs[0].shape[-1] == C:
        v = v.producer.inputs[0]
    mm = v.producer
    if mm is None or mm.op != "matmul" or not single(v) or not mm.inputs[1].is_const or mm.inputs[1].type.rank < 2:
        return None
    w = mm.inputs[1].data
    return mm if w.dtype.kind == "f" and w.shape[-1] == C and v.dtype == w.dtype else None


def _fold_bn_into_linear(graph, n, single, users, after):
    """batch_norm over [N, C] rows that a linear layer computed -> its weight's columns scaled and a bias
    added after it (which the matmul's epilogue takes): LeViT's 58 such norms had run as a strided loop
    per channel, 28% of its time. users: graph.users() (the matmul's one reader is found there); after:
    {id(node): nodes} to insert after it (the bias add). Returns the
    value that now holds the norm's output, or False where the norm is not over such a layer."""
    x = n.inputs[0]
    if x.type.rank != 2 or not isinstance(x.shape[1], int):
        return False
    mm = _linear_under_reshapes(x, single)
    if mm is None:
        return False
    a, b = _bn_affine(n)
    w, y = mm.inputs[1].data, mm.outputs[0]
    mm.inputs = [mm.inputs[0], graph.const((w.astype(np.float64) * a).astype(w.dtype))]
    biased = Value(y.type)
    user = users[id(y)][0]                  # its only one (_linear_under_reshapes)
    after.setdefault(id(mm), []).append(Node("add", [y, graph.const(b.astype(w.dtype))], {}, [biased], n.loc))
    if user is n:
        return biased
    user.inputs = [biased if i is y else i for i in user.inputs]
    return x


def weights_without_unit_batch(graph):
    """matmul(x, W) with W a constant [1, ..., 1, K, N] and x of at least W's rank -> matmul(x, W[K, N]):
    the same product, and the weight packed at compile time (a batch dim on W had sent LeViT's linear
    layers, exported as bmm over a [1, K, N] weight, to a GEMM that packed W at every call)."""
    for n in graph.nodes:
        if n.op != "matmul" or len(n.inputs) < 2 or not n.inputs[1].is_const:
            continue
        x, w = n.inputs[:2]
        d = w.data
        if d.ndim > 2 and all(k == 1 for k in d.shape[:-2]) and x.type.rank >= d.ndim:
            n.inputs = [x, graph.const(d.reshape(d.shape[-2:])), *n.inputs[2:]]
    return graph


def fold_batch_norm(graph):
    """conv -> batch_norm with constant weights and stats becomes one conv with new weights and bias;
    a linear layer -> batch_norm over its rows, the linear layer with scaled columns and a bias."""
    users = graph.users()
    single = _single_user(graph, users)
    mapping, drop, after = {}, set(), {}
    for n in graph.nodes:
        if n.op != "batch_norm" or not all(i.is_const for i in n.inputs[1:]):
            continue
        folded = _fold_bn_into_linear(graph, n, single, users, after)
        if folded is not False:
            mapping[id(n.outputs[0])] = folded
            drop.add(id(n))
            continue
        x = n.inputs[0]
        conv = x.producer
        if conv is None or conv.op != "conv" or not conv.inputs[1].is_const or not single(x):
            continue
        a, shift = _bn_affine(n)
        w = conv.inputs[1].data
        b0 = conv.inputs[2].data.astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] is not None else 0.0
        new_w = (w.astype(np.float64) * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        new_b = (b0 * a + shift).astype(w.dtype)
        conv.inputs = [conv.inputs[0], graph.const(new_w), graph.const(new_b)]
        mapping[id(n.outputs[0])] = conv.outputs[0]
        drop.add(id(n))
    graph.nodes = [m for n in graph.nodes if id(n) not in drop for m in (n, *after.get(id(n), ()))]
    return replace_uses(graph, mapping)


def _column_scale(v, n):
    """v's constant as one finite float per column of an [..., n] value ([n] or [1, ..., 1, n]), else None."""
    d = v.data if v.is_const else None
    if d is None or d.dtype.kind != "f" or d.shape[-1:] != (n,) or any(s != 1 for s in d.shape[:-1]) \
            or not np.isfinite(d).all():
        return None
    return d.reshape(n)


def fold_scale_into_linear(graph):
    """mul(matmul(x, W) [+ b], g) with W, b and g constants and g one scale per output column (ConvNeXt's
    layer scale after its MLP) -> matmul(x, W g) [+ b g]: a pass over the output gone."""
    single = _single_user(graph)
    mapping, drop = {}, set()
    for n in graph.nodes:
        if n.op != "mul" or len(n.inputs) != 2:
            continue
        y, g = n.inputs if n.inputs[1].is_const else n.inputs[::-1]
        N = y.shape[-1] if y.type.rank else None
        if not isinstance(N, int) or y.is_const or not single(y) or n.outputs[0].type.rank != y.type.rank:
            continue
        scale = _column_scale(g, N)
        add, mm = (y.producer, None) if y.producer is not None and y.producer.op == "add" else (None, y.producer)
        b = None
        if add is not None:
            z, bv = add.inputs if add.inputs[1].is_const else add.inputs[::-1]
            b = _column_scale(bv, N)
            mm = z.producer if b is not None and single(z) and z.type.shape == y.type.shape else None
        if scale is None or mm is None or mm.op != "matmul" or not mm.inputs[1].is_const or mm.inputs[1].type.rank < 2 \
                or mm.inputs[1].data.dtype != scale.dtype or y.dtype != scale.dtype:
            continue
        mm.inputs = [mm.inputs[0], graph.const((mm.inputs[1].data * scale).astype(scale.dtype))]
        if add is not None:
            add.inputs = [z, graph.const((b * scale).astype(scale.dtype).reshape(bv.data.shape))]
        mapping[id(n.outputs[0])] = y
        drop.add(id(n))
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    return replace_uses(graph, mapping)


def collapse_reshapes(graph):
    """reshape(reshape(x)) -> reshape(x); reshape to the same shape -> x."""
    mapping = {}
    for n in graph.nodes:
        n.inputs = [mapping.get(id(i), i) if i is not None else None for i in n.inputs]
        if n.op == "reshape":
            src = n.inputs[0]
            if src.producer is not None and src.producer.op == "reshape":
                n.inputs = [src.producer.inputs[0]]
            if len(n.inputs[0].shape) == len(n.outputs[0].shape) and all(
                    D.dims_equal(a, b) for a, b in zip(n.inputs[0].shape, n.outputs[0].shape)):
                mapping[id(n.outputs[0])] = n.inputs[0]
    graph.outputs = [mapping.get(id(o), o) for o in graph.outputs]
    return replace_uses(graph, mapping)


def _one_pixel_windows(n):
    """A pool whose every window is one pixel, each output its input's: VGG's adaptive_avg_pool2d(7) on
    a 7 x 7 map (its loops had taken 2.4 ms to copy 100 KB)."""
    a = n.attrs
    return (all(k == 1 for k in a["kernel"]) and all(s == 1 for s in a["strides"])
            and all(tuple(p) == (0, 0) for p in a["pads"]) and tuple(n.inputs[0].shape) == tuple(n.outputs[0].shape))


def remove_identities(graph):
    mapping = {}
    for n in graph.nodes:
        n.inputs = [mapping.get(id(i), i) if i is not None else None for i in n.inputs]
        if n.op == "cast" and n.inputs[0].dtype == n.attrs["to"]:
            mapping[id(n.outputs[0])] = n.inputs[0]
        elif n.op in ("expand",) and tuple(n.inputs[0].shape) == tuple(n.outputs[0].shape):
            mapping[id(n.outputs[0])] = n.inputs[0]
        elif n.op == "transpose" and list(n.attrs["perm"]) == sorted(n.attrs["perm"]):
            mapping[id(n.outputs[0])] = n.inputs[0]
        elif n.op in ("avg_pool", "max_pool") and _one_pixel_windows(n):
            mapping[id(n.outputs[0])] = n.inputs[0]
    return replace_uses(graph, mapping)


# pow(x, c) for a constant c that a cheaper op computes, as torch's own pow does for these: a libm pow
# per element had made HF's RMSNorm (x.pow(2).mean(-1)) 14x eager's time
# (not -0.5: rsqrt(-0) is -inf where C's pow, and so ONNX's, gives +inf)
POW_BY = {2.0: "square", 0.5: "sqrt", -1.0: "reciprocal"}


def pow_by_constant(graph):
    """pow(x, 2) -> x * x, pow(x, 0.5 / -1) -> sqrt / reciprocal, for a float x whose shape the exponent
    does not widen."""
    def cheaper(n):
        x, c = n.inputs
        if not (c.is_const and c.data.size == 1 and x.dtype in ("float32", "float64") and c.data.dtype == x.dtype
                and n.outputs[0].type.shape == x.type.shape):
            return n
        op = POW_BY.get(float(c.data.reshape(())))
        if op is None:
            return n
        return Node("mul", [x, x], {}, n.outputs, n.loc) if op == "square" else Node(op, [x], {}, n.outputs, n.loc)
    graph.nodes = [cheaper(n) if n.op == "pow" else n for n in graph.nodes]
    return graph


def name_relu6(graph):
    for n in graph.nodes:
        if n.op == "clip" and n.attrs.get("min") == 0 and n.attrs.get("max") == 6 and n.inputs[0].dtype == "float32":
            n.op, n.attrs = "relu6", {}
    return graph


def _gated_by(n, gate_op, gate_attrs, single):
    """For mul(x, gate(x)) (either order) whose gate has no other reader: x; else None."""
    if n.op != "mul" or n.inputs[0].dtype != "float32":
        return None
    for x, g in (n.inputs, n.inputs[::-1]):
        p = g.producer
        if p is not None and p.op == gate_op and p.inputs[0] is x and p.attrs == gate_attrs and single(g):
            return x
    return None


def name_gated_activations(graph):
    """x * sigmoid(x) -> silu(x), x * hardsigmoid(x) (torch's 1/6, 1/2) -> hardswish(x): the activations
    a conv epilogue applies (core ATen decomposes SiLU into the product, ONNX exporters write it so).
    The gate is left for cleanup to drop when nothing else reads it."""
    single = _single_user(graph)
    for n in graph.nodes:
        for name, gate, attrs in (("silu", "sigmoid", {}), ("hardswish", "hardsigmoid", {"alpha": 1 / 6, "beta": 0.5})):
            x = _gated_by(n, gate, attrs, single)
            if x is not None:
                n.op, n.inputs, n.attrs = name, [x], {}
                break
    return graph


def global_avg_pool_as_mean(graph):
    """An unpadded avg_pool whose one window covers the whole map (transformers' EfficientNet pools
    with a 1280 x 1280 kernel, ceil_mode) -> the mean over (H, W): the window's loops were 14% of the
    network, and a mean reads a channel-blocked map where it lies (passes/layout.py)."""
    for n in graph.nodes:
        if n.op != "avg_pool" or n.inputs[0].type.rank != 4:
            continue
        x, y, a = n.inputs[0], n.outputs[0], n.attrs
        spatial = x.shape[2:]
        if (all(isinstance(d, int) for d in spatial) and tuple(y.shape[2:]) == (1, 1)
                and all(p == (0, 0) for p in map(tuple, a["pads"])) and all(d == 1 for d in a["dilations"])
                and all(k >= d for k, d in zip(a["kernel"], spatial))):
            n.op, n.attrs = "reduce_mean", {"axes": (2, 3), "keepdims": True}
    return graph


def fold_pad_into_conv(graph):
    """pad(x) with zeros on the spatial dims only -> the conv that alone reads it, with those pads
    added to its own (TF-style 'same' padding, as transformers' MobileNets and EfficientNet write it)."""
    single = _single_user(graph)
    users = graph.users()
    for n in graph.nodes:
        if n.op != "pad" or n.attrs.get("mode", "constant") != "constant" or n.attrs.get("value", 0) != 0:
            continue
        y = n.outputs[0]
        pads = [tuple(p) for p in n.attrs["pads"]]
        if not single(y) or len(pads) < 3 or any(p != (0, 0) for p in pads[:2]) or any(
                not isinstance(v, int) or v < 0 for p in pads for v in p):
            continue
        conv = users[id(y)][0]
        if conv.op != "conv" or conv.inputs[0] is not y or conv.attrs.get("layout", "nchw") != "nchw" or \
                len(conv.attrs["pads"]) != len(pads) - 2:
            continue
        conv.attrs = dict(conv.attrs, pads=[(a + c, b + d) for (a, b), (c, d) in zip(conv.attrs["pads"], pads[2:])])
        conv.inputs = [n.inputs[0]] + conv.inputs[1:]
    return graph


def group_norms(graph):
    """reshape [N, C, H, W] -> [N, G, C / G * H * W], layer_norm over the last dim without an affine, reshape
    back -> group_norm(x, G): how both frontends write a group norm (before its per-channel affine), as
    one op that the layout pass can keep channel-blocked (BiT's 49 norms had sent each conv between them
    to NCHW, with a relayout each side)."""
    users = graph.users()
    single = _single_user(graph, users)
    mapping = {}
    for n in graph.nodes:
        if n.op != "layer_norm" or n.outputs[0].type.rank != 3 or n.attrs["axis"] != 2 \
                or any(i is not None for i in n.inputs[1:]):
            continue
        v, y = n.inputs[0], n.outputs[0]
        shape_in = v.producer.inputs[0].shape if v.producer is not None and v.producer.op == "reshape" else ()
        back = users.get(id(y), [None])[0]
        if len(shape_in) != 4 or not all(isinstance(d, int) for d in shape_in[1:]) or not single(v) \
                or not single(y) or back.op != "reshape" or tuple(back.outputs[0].shape) != tuple(shape_in):
            continue
        groups = v.shape[1]
        if not isinstance(groups, int) or groups < 1 or shape_in[1] % groups \
                or v.shape[2] != shape_in[1] // groups * shape_in[2] * shape_in[3]:
            continue
        x = v.producer.inputs[0]
        n.op, n.inputs, n.attrs = "group_norm", [x], {"groups": groups, "eps": n.attrs["eps"]}
        n.outputs[0].type = TensorType(tuple(x.shape), x.dtype)
        mapping[id(back.outputs[0])] = n.outputs[0]
    return replace_uses(graph, mapping)


def run(graph):
    graph = name_gated_activations(name_relu6(global_avg_pool_as_mean(fold_pad_into_conv(fold_batch_norm(weights_without_unit_batch(graph))))))
    graph = pow_by_constant(fold_scale_into_linear(graph))
    return collapse_reshapes(remove_identities(group_norms(graph)))
