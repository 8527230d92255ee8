"""Squeeze-and-excitation blocks (MobileNetV3, EfficientNet) without their two passes over the map, for
the channel-blocked convs of fp32 graphs; runs after the layout pass.

The squeeze: the spatial mean of a depthwise conv's output is taken by the conv as it writes the map
(the conv's second output, mean_out; kernels/blocked.h cuvil_depthwise_blocked_mean sums each output row
while it is in L1), not by a reduce_mean that reads the map again (3% of EfficientNet-B0's time).

The excitation: conv(x * g), with g one scale per image and input channel ([N, C, 1, 1]), is conv(x)
with each image's filters scaled by g, row by row. The multiply was a pass of its own over the map (4-5%
of EfficientNet-B0's time at 1 thread); scaled filters cost C x O products an image instead of C x H x W
and no pass, so the fold is taken where the map's pixels outnumber the conv's output channels, rounded up to
the kernel's panel: EfficientNet-B0's gates up to 14 x 14, not its 7 x 7 ones (1152 -> 192 channels).
The gate becomes the 1x1 conv's fifth input (ir/ops/nn.py: conv; kernels/blocked.h
cuvil_conv_blocked_gated)."""
from __future__ import annotations

from ..ir import dims as D
from ..ir.ops.movement import layout_block


def _fp32_products(a) -> bool:
    """A conv's attrs mark no integer or bf16 products and no byte or bf16 maps in or out."""
    return not (a.get("int8_act") or a.get("bf16_act") or a.get("int8_in") or a.get("bf16_in")
                or a.get("int8_out") is not None)


def _pointwise_fp32(conv) -> bool:
    """A 1x1 conv of constant filters, stride 1, no padding, groups 1, in fp32 products, whose input is
    channel-blocked (kinds "blocked" and "blocked_to_nchw")."""
    a, x, w = conv.attrs, conv.inputs[0], conv.inputs[1]
    return (w.is_const and tuple(w.shape[2:]) == (1, 1) and a.get("groups", 1) == 1
            and tuple(a["strides"]) == (1, 1) and all(tuple(p) == (0, 0) for p in a["pads"])
            and _fp32_products(a) and layout_block(x.layout) > 0
            and (len(conv.inputs) < 5 or conv.inputs[4] is None))


def _gate_of(mul, x):
    """For mul = x' * g (either order) with x' shaped like x and g [N or 1, C, 1, 1] (N: x's batch), the
    pair (x', g); else None."""
    if mul.op != "mul" or len(mul.inputs) != 2:
        return None
    for a, g in (mul.inputs, mul.inputs[::-1]):
        if (a.type.rank == 4 and g.type.rank == 4 and a.dtype == g.dtype == "float32"
                and all(D.dims_equal(p, q) for p, q in zip(a.shape, x.shape))
                and g.shape[1] == x.shape[1] and g.shape[2] == g.shape[3] == 1
                and (g.shape[0] == 1 or D.dims_equal(g.shape[0], x.shape[0]))):
            return a, g
    return None


def _worth_folding(conv) -> bool:
    x, y = conv.inputs[0], conv.outputs[0]
    panel = 2 * layout_block(x.layout)
    return x.shape[2] * x.shape[3] > -(-y.shape[1] // panel) * panel


def _blocked_depthwise_fp32(conv) -> bool:
    """A depthwise conv (groups = in = out channels) that the blocked fp32 kernel runs, floats out."""
    a, x, y = conv.attrs, conv.inputs[0], conv.outputs[0]
    return (conv.op == "conv" and len(conv.outputs) == 1 and x.type.rank == 4 and layout_block(y.layout) > 0
            and a.get("groups", 1) == x.shape[1] == y.shape[1] and not a.get("in_layout")
            and _fp32_products(a) and not a.get("live_channels"))


def _spatial_mean(n) -> bool:
    return (n.op == "reduce_mean" and n.inputs[0].type.rank == 4 and n.attrs.get("keepdims")
            and {a % 4 for a in n.attrs["axes"]} == {2, 3})


def _means_into_depthwise(graph):
    """Each spatial mean of a blocked depthwise conv's output becomes that conv's second output."""
    taken = set()
    for n in graph.nodes:
        p = n.inputs[0].producer if n.inputs else None
        if _spatial_mean(n) and p is not None and _blocked_depthwise_fp32(p) and n.outputs[0].dtype == "float32":
            p.attrs["mean_out"] = 1
            p.outputs.append(n.outputs[0])
            n.outputs[0].producer = p
            taken.add(id(n))
    if taken:
        graph.nodes = [n for n in graph.nodes if id(n) not in taken]


def _gates_into_convs(graph):
    """Each gate multiply whose product only a blocked 1x1 conv reads, worth folding, becomes that conv's gate."""
    users, outputs = graph.users(), {id(v) for v in graph.outputs}
    folded = set()
    for conv in graph.nodes:
        if conv.op != "conv" or not _pointwise_fp32(conv):
            continue
        x = conv.inputs[0]
        mul = x.producer
        only_conv = users.get(id(x)) == [conv] and id(x) not in outputs
        pair = _gate_of(mul, x) if mul is not None and only_conv else None
        if pair is None or layout_block(pair[0].layout) != layout_block(x.layout) or not _worth_folding(conv):
            continue
        inputs = list(conv.inputs) + [None] * (4 - len(conv.inputs))
        conv.inputs = [pair[0], *inputs[1:4], pair[1]]
        folded.add(id(mul))
    if folded:
        graph.nodes = [n for n in graph.nodes if id(n) not in folded]


def run(graph):
    _means_into_depthwise(graph)
    _gates_into_convs(graph)
    return graph
