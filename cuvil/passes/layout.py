"""Layout: convs and max pools whose channels come in blocks of the target's vector width run
channel-blocked ("nchw<B>c": B = 16 on AVX-512, 8 on AVX2, 4 on SSE2 / NEON; codegen/c/kernels/blocked.h), with a relayout only where a blocked value meets anything that reads
NCHW (and at the graph's outputs). Pointwise ops whose operands all have the output's shape (or one
element) run on blocked data unchanged, and a transpose between NCHW and NHWC reads or writes its NCHW
side blocked (ConvNeXt's channels-last MLPs). Shapes stay logical: the attribute says how C stores the value.

Runs after fusion, so that a conv's fused residual is known to be read in the conv's own layout. A
blocked op alone between NCHW neighbours would pay a relayout in and out for its gain, so only ops
with a blocked neighbour (producer or consumer) are taken: a net's chain of convs turns blocked whole,
a lone conv stays as it was. A stem conv (a few input channels, NCHW) can write blocked output from
NCHW input, so the blocked region starts at its output; a conv into channels that fill no block reads
blocked input into NCHW output (into_nchw), so one can end there."""
from __future__ import annotations

import numpy as np

from ..ir import dims as D
from ..ir.graph import Node, Value
from ..ir.quant import INT8_MAX_K
from ..ir.ops import REGISTRY, infer_types
from ..ir.ops.movement import FROM_NHWC, TO_NHWC, layout_block
from .pad_channels import padded


def _static_4d(v):
    """A 4-d float32 value whose channels and spatial dims are static (the batch may be dynamic)."""
    return v.type.rank == 4 and v.dtype == "float32" and all(isinstance(d, int) for d in v.shape[1:])


def narrow_groups(cg: int, og: int, block: int) -> bool:
    """Groups of as many channels in as out, fewer than a block and dividing it (ResNeXt's 4 and 8): the
    blocked grouped kernel's (kernels/grouped_blocked.c) lane permutes take them."""
    return cg == og and cg < block and block % cg == 0 and cg > 1


def blockable(node, block: int) -> bool:
    """Whether the blocked kernels take this node: a 2-d conv of constant filters, depthwise (groups = in
    = out channels), each group's channels in and out multiples of the block or narrow_groups, or a 2-d
    max or average pool whose channels are; static shapes but for the batch."""
    if node.op == "conv":
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        g = node.attrs.get("groups", 1)
        if not (_static_4d(x) and _static_4d(y) and w.is_const and x.shape[1] % block == 0 and y.shape[1] % block == 0):
            return False
        cg, og = x.shape[1] // g, y.shape[1] // g
        return g == x.shape[1] == y.shape[1] or (cg % block == 0 and og % block == 0) or narrow_groups(cg, og, block)
    if node.op in ("max_pool", "avg_pool"):
        x, y = node.inputs[0], node.outputs[0]
        return _static_4d(x) and _static_4d(y) and x.shape[1] % block == 0
    return False


# the largest K (in channels x taps) a conv of NCHW input into blocked output takes
# (kernels/blocked.h: CUVIL_NCHW_BLOCKED_MAX_K)
NCHW_IN_MAX_K = 1024


def blockable_from_nchw(node, block: int) -> bool:
    """Whether a conv can read NCHW and write blocked: a net's stem, whose few input channels fill no
    block (kernels/blocked.h: cuvil_conv_nchw_blocked)."""
    if node.op != "conv":
        return False
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    return (_static_4d(x) and _static_4d(y) and w.is_const and node.attrs.get("groups", 1) == 1
            and x.shape[1] % block != 0 and y.shape[1] % block == 0
            and int(np.prod(w.shape[1:])) <= NCHW_IN_MAX_K)


# the most work a conv into NCHW output may spend on padding: its output channels are computed in whole
# blocks, at most this many times as many as it has (24 -> 32 channels; 8 -> 16 would double the work)
INTO_NCHW_MAX_PADDING = 4 / 3


def into_nchw(node, block: int) -> bool:
    """Whether a conv can read blocked input and write NCHW: output channels that fill no block, input
    channels that do, groups 1. In fp32 any such conv whose padding to whole blocks stays under
    INTO_NCHW_MAX_PADDING (kernels/blocked.h cuvil_conv_blocked_nchw_out: MobileNetV2's and EfficientNet's
    projections to 24 channels, which passes/pad_channels.py leaves as they are, had taken a relayout of
    their input to NCHW, then an NCHW conv);
    one marked for integer products (int8_act, passes/quantize.py) when 1x1 (kernels/blocked_dot.c
    nchw_out); none in bf16 products, whose kernels write blocks only. The blocked region ends at its output."""
    if node.op != "conv":
        return False
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    a = node.attrs
    if not (_static_4d(x) and _static_4d(y) and w.is_const and a.get("groups", 1) == 1
            and x.shape[1] % block == 0 and y.shape[1] % block != 0):
        return False
    if a.get("int8_act"):
        return (x.shape[1] <= INT8_MAX_K and tuple(w.shape[2:]) == (1, 1) and tuple(a["strides"]) == (1, 1)
                and tuple(a["dilations"]) == (1, 1) and all(tuple(p) == (0, 0) for p in a["pads"]))
    return not a.get("bf16_act") and padded(y.shape[1], block) <= INTO_NCHW_MAX_PADDING * y.shape[1]


def _nhwc_transpose(node, perm, block) -> bool:
    """A transpose between NCHW and NHWC (perm TO_NHWC or FROM_NHWC) of a static 4-d float map whose
    channels fill blocks: it reads or writes its NCHW side blocked at the cost of an NCHW one
    (lower_movement), so the blocked region reaches ConvNeXt's channels-last MLPs with no relayout."""
    if node.op != "transpose" or tuple(node.attrs["perm"]) != perm:
        return False
    v = node.inputs[0] if perm == TO_NHWC else node.outputs[0]
    return _static_4d(v) and v.shape[1] % block == 0


def _blocked_inputs(node):
    """Input positions read in the node's own layout: x, and a conv's fused residual."""
    return [0, 3] if node.op == "conv" else [0]


def per_channel(v, y) -> bool:
    """v broadcasts against the 4-d y as one value per channel ([N or 1, C, 1, 1] once padded to rank 4, N
    y's batch, static or not): the same bytes in NCHW and in any blocked layout, so read in place by a
    blocked node. (A dynamic batch's squeeze-and-excitation gates had ended the blocked region.)"""
    shape = (1,) * (4 - v.type.rank) + tuple(v.shape)
    return (v.type.rank <= 4 and all(isinstance(d, int) for d in shape[1:]) and shape[1] == y.shape[1]
            and shape[2] == shape[3] == 1 and (shape[0] == 1 or D.dims_equal(shape[0], y.shape[0])))


def _whole_blocks(node, block):
    """For a concat of maps along channels, or a slice of channels (step 1), in whole blocks: the map
    positions; else None. Each image's channels [c0, c1) are elements [c0 * H * W, c1 * H * W) of it in
    NCHW and in the blocked layout alike, so the NCHW loops copy blocked maps as they are (SqueezeNet's
    fire modules, ShuffleNet's split)."""
    if node.op == "concat" and node.attrs["axis"] == 1 and _static_4d(node.outputs[0]) and all(
            _static_4d(v) and v.shape[1] % block == 0 for v in node.inputs):
        return list(range(len(node.inputs)))
    if node.op == "slice" and node.attrs["axis"] == 1 and node.attrs["step"] == 1 and _static_4d(node.inputs[0]) \
            and node.attrs["start"] % block == 0 and node.attrs["length"] % block == 0:
        return [0]
    return None


def _elementwise_over(node, block):
    """For a node that can run on blocked operands as it is, the positions of its full-shape (blocked)
    operands; else None: a pointwise node whose operands are shaped like the output, one value per channel,
    or a single element (a ReLU6 or an add between two convs keeps them blocked, and so does a
    squeeze-and-excitation's scaling of a map by its per-channel gate: lower_pointwise indexes such
    operands by channel), a channel concat or slice in whole blocks (_whole_blocks), or a group norm whose
    groups fit the blocks (_group_norm_blocks)."""
    if node.op in ("concat", "slice"):
        return _whole_blocks(node, block)
    if node.op == "group_norm":
        return [0] if _group_norm_blocks(node, block) else None
    kind = REGISTRY[node.op].kind
    y = node.outputs[0]
    if kind not in ("unary", "binary", "where", "fused") or len(node.outputs) != 1 or not _static_4d(y) \
            or y.shape[1] % block or (kind == "fused" and any(node.attrs.get("views") or ())):
        return None
    full = []
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        if tuple(v.shape) == tuple(y.shape):
            full.append(i)
        elif not per_channel(v, y) and not (all(isinstance(d, int) for d in v.shape) and int(np.prod(v.shape)) == 1):
            return None
    return full or None


def _group_norm_blocks(node, block) -> bool:
    """A group norm whose groups are whole blocks or divide one (kernels/norm.c cuvil_group_norm_blocked)."""
    x = node.inputs[0]
    if not (_static_4d(x) and x.shape[1] % block == 0):
        return False
    cg = x.shape[1] // node.attrs["groups"]
    return cg % block == 0 or block % cg == 0


REDUCTIONS = ("reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod")


def reads_in_place(node) -> bool:
    """A reduction of a 4-d map over both spatial dims (a global pool) or over its channels: it reads a
    blocked map where it lies (lower_reduce), its output indexed as in NCHW."""
    if node.op not in REDUCTIONS or node.inputs[0].type.rank != 4 or not _static_4d(node.inputs[0]):
        return False
    axes = {a % 4 for a in node.attrs["axes"]}
    return 1 in axes or {2, 3} <= axes


def _choose(graph, block):
    """The nodes to block: blockable ones joined to another blockable one by a value, directly or through
    pointwise nodes that can run blocked."""
    can = {id(n) for n in graph.nodes if blockable(n, block)}
    stems = {id(n) for n in graph.nodes if blockable_from_nchw(n, block) or _nhwc_transpose(n, FROM_NHWC, block)}

    def blockable_sources(v, seen):
        p = v.producer
        if p is None or id(p) in seen:
            return set()
        seen.add(id(p))
        if id(p) in can or id(p) in stems:
            return {id(p)}
        full = _elementwise_over(p, block)
        return set().union(*(blockable_sources(p.inputs[i], seen) for i in full)) if full else set()

    chosen = set()
    for n in graph.nodes:
        # a transpose into NHWC reads blocked maps as cheaply as NCHW ones: it draws its sources in (a
        # ConvNeXt stage's last residual add) without being blocked itself
        into_nhwc = _nhwc_transpose(n, TO_NHWC, block)
        if id(n) not in can and not into_nhwc:
            continue
        for i in _blocked_inputs(n):
            v = n.inputs[i] if i < len(n.inputs) else None
            found = blockable_sources(v, set()) if v is not None else set()
            if found:
                chosen |= found | (set() if into_nhwc else {id(n)})
    return chosen, chosen & stems


def run(graph, layout: str):
    """Blocks graph's conv chains in `layout` (an "nchw<B>c" of ir/ops/movement.py)."""
    block = layout_block(layout)
    chosen, from_nchw = _choose(graph, block)
    if not chosen:
        return graph
    converted = {}                     # (id(value), layout) -> the value in that layout

    def relayout(v, to, nodes):
        if v.shape[2] == v.shape[3] == 1:      # [N, C, 1, 1]: the same bytes in every layout
            return v
        key = (id(v), to)
        if key not in converted:
            attrs = {"to": to, "from": layout if to == "nchw" else "nchw"}
            out = Value(infer_types("relayout", [v.type], attrs)[0])
            out.layout = to
            nodes.append(Node("relayout", [v], attrs, [out], v.producer.loc if v.producer else None))
            converted[key] = out
        return converted[key]

    blocked_values = set()
    nodes = []
    for n in graph.nodes:
        blocked = id(n) in chosen
        positions = _blocked_inputs(n) if blocked else []
        if id(n) in from_nchw and n.op == "transpose":     # from NHWC: writes its output blocked
            positions = []
        elif id(n) in from_nchw:               # x stays NCHW; the output (and a residual) blocked
            positions = positions[1:]
            n.attrs["in_layout"] = "nchw"
        full = None if blocked else _elementwise_over(n, block)
        if full and all(id(n.inputs[i]) in blocked_values for i in full):   # runs blocked as it is
            blocked_values.add(id(n.outputs[0]))
            n.outputs[0].layout = layout
            nodes.append(n)
            continue
        if reads_in_place(n) and id(n.inputs[0]) in blocked_values:
            positions = [0]
        if not blocked and into_nchw(n, block) and id(n.inputs[0]) in blocked_values:
            positions = [0]                    # x read blocked; the output (and a residual) NCHW
            n.attrs["in_layout"] = layout
        if _nhwc_transpose(n, TO_NHWC, block) and id(n.inputs[0]) in blocked_values:
            positions = [0]
            n.attrs["in_layout"] = layout
        for i, v in enumerate(n.inputs):
            if v is None:
                continue
            is_blocked = id(v) in blocked_values
            if i in positions and not is_blocked:
                n.inputs[i] = relayout(v, layout, nodes)
            elif i not in positions and is_blocked:
                n.inputs[i] = relayout(v, "nchw", nodes)
        if blocked:
            n.attrs["layout"] = layout
            n.outputs[0].layout = layout
            blocked_values.add(id(n.outputs[0]))
        nodes.append(n)
    graph.nodes = nodes
    graph.outputs = [relayout(v, "nchw", graph.nodes) if id(v) in blocked_values else v for v in graph.outputs]
    return graph
