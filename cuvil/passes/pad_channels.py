"""Pad channels to whole blocks: where a net's maps have channel counts that fill no block of the target's
vector width (MobileNetV3's 40, 72, 120 and 200 at blocks of 16), widen them, with zero filters, to
the next multiple, so the layout pass runs them channel-blocked instead of NCHW (blocked depthwise convs
took half the time of the NCHW kernel on MobileNetV3's 72 and 120 channels; a blocked map needs no
relayout between the 1x1 convs around it). What OpenVINO and oneDNN do with a blocked layout's last
block, done here on the graph: shapes stay consistent, and no kernel knows of the padding.

A region is the set of maps of one channel count C joined by the ops that keep their channels apart:
convs that write them (their filters padded with zero filters: the "sources"), depthwise convs,
activations, adds and multiplies of such maps or of per-channel gates made in the region, means over the
pixels. It ends at convs that read them (zero weights for the padded channels). A region that reaches
anything else (a graph output, a reshape, a concat, a reduction over channels, a division) is left as it
is. The padded channels hold finite values (a source writes zeros there: live_channels, whatever its
input holds, so no inf times a zero filter makes a NaN), so the zero weights that read them add exact
zeros: every real channel's value is the unpadded net's.

Runs after fusion and before the layout pass, for fp32 graphs (precision "fp32") whose layout is blocked."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node, Value
from ..ir.ops import infer_types

# the most work padding may add: a map's channels rounded up to whole blocks, at most this many times as
# many as it has. By benchmarks.ab (Intel AVX-512, 1 / 2 threads): at 4/3, MobileNetV2's 24 -> 32 took
# 1.01 / 1.05x its time (the 24-channel maps' convs a third more work, for no depthwise conv gained); at
# 1.25 (40 -> 48, 72 -> 80, 120 -> 128, 200 -> 208 taken, 24 not) MobileNetV3-ish 0.96 / 0.90x,
# EfficientNet-B0 0.98 / 1.00x, ShuffleNetV2-ish 0.97 / 1.00x
MAX_PADDING = 1.25

# ops through which padded channels stay finite, and separate from the real ones
_SAFE_UNARY = {"relu", "relu6", "clip", "hardswish", "hardsigmoid", "sigmoid", "silu", "gelu", "gelu_tanh", "tanh",
               "neg", "abs", "leaky_relu", "elu"}
_SAFE_BINARY = {"add", "sub", "mul", "max", "min"}


def padded(c: int, block: int) -> int:
    return -(-c // block) * block


def worth_padding(c: int, block: int) -> bool:
    return c % block != 0 and padded(c, block) <= MAX_PADDING * c


def _map_of(v, c) -> bool:
    """v is a static float32 [N, c, H, W] map (a gate: H = W = 1); the batch may be dynamic."""
    return (v.type.rank == 4 and v.dtype == "float32" and v.shape[1] == c
            and all(isinstance(d, int) for d in v.shape[1:]))


def _const_conv(n) -> bool:
    return (n.op == "conv" and n.inputs[1].is_const and n.inputs[0].type.rank == 4
            and (len(n.inputs) < 3 or n.inputs[2] is None or n.inputs[2].is_const))


def _depthwise(n) -> bool:
    g = n.attrs.get("groups", 1)
    return g > 1 and g == n.inputs[0].shape[1] == n.outputs[0].shape[1]


def _scalar(v) -> bool:
    return v.is_const and v.data.size == 1


class _Region:
    """The maps of one channel count to widen, and what each node around them does with its padding."""

    def __init__(self, c):
        self.c = c
        self.values = {}          # id -> Value: the maps widened
        self.sources, self.readers, self.depthwise = {}, {}, {}     # id(node) -> node
        self.consts = []          # (node, k): per-channel constant operands, padded with zeros
        self.failed = False

    def add(self, v, users, outputs):
        if self.failed or id(v) in self.values:
            return
        if not _map_of(v, self.c) or id(v) in outputs or v.producer is None:
            self.failed = True
            return
        self.values[id(v)] = v
        self._producer(v)
        for n in users.get(id(v), []):
            self._reader(n, v)

    def _producer(self, v):
        p = v.producer
        if _const_conv(p) and _depthwise(p):
            self.depthwise[id(p)] = p
            self._pending.append(p.inputs[0])
            if len(p.inputs) > 3 and p.inputs[3] is not None:    # its fused residual, as a source's
                self._pending.append(p.inputs[3])
        elif _const_conv(p) and p.attrs.get("groups", 1) == 1:
            self.sources[id(p)] = p
            if len(p.inputs) > 3 and p.inputs[3] is not None:    # a fused residual has the output's shape
                self._pending.append(p.inputs[3])
        elif p.op in _SAFE_UNARY or p.op == "reduce_mean" and self._spatial_mean(p):
            self._pending.append(p.inputs[0])
        elif p.op in _SAFE_BINARY:
            self._operands(p)
        else:
            self.failed = True

    def _reader(self, n, v):
        i = [k for k, x in enumerate(n.inputs) if x is v]
        if n.op == "conv" and _const_conv(n) and i == [0] and _depthwise(n):
            self._pending.append(n.outputs[0])
        elif n.op == "conv" and _const_conv(n) and i == [0] and n.attrs.get("groups", 1) == 1:
            self.readers[id(n)] = n
        elif n.op == "conv" and _const_conv(n) and i == [3]:       # the residual of a conv that writes C too
            self._pending.append(n.outputs[0])
        elif n.op in _SAFE_UNARY or n.op == "reduce_mean" and self._spatial_mean(n):
            self._pending.append(n.outputs[0])
        elif n.op in _SAFE_BINARY:
            self._pending.append(n.outputs[0])
        else:
            self.failed = True

    def _operands(self, n):
        """A binary node's operands: maps and gates of C are widened; per-channel constants padded with
        zeros; single elements left as they are."""
        for k, x in enumerate(n.inputs):
            if _scalar(x):
                continue
            if x.is_const and x.type.rank == 4 and x.shape[1] == self.c and x.shape[2:] == (1, 1):
                self.consts.append((n, k))
            else:
                self._pending.append(x)

    @staticmethod
    def _spatial_mean(n):
        return n.inputs[0].type.rank == 4 and {a % 4 for a in n.attrs["axes"]} == {2, 3} and n.attrs.get("keepdims")

    def grow(self, seed, users, outputs):
        self._pending = [seed]
        while self._pending and not self.failed:
            self.add(self._pending.pop(), users, outputs)
        return not self.failed


def _pad(data, axis, to):
    widths = [(0, 0)] * data.ndim
    widths[axis] = (0, to - data.shape[axis])
    return np.pad(data, widths)


def _widen(graph, region, block):
    c, cp = region.c, padded(region.c, block)
    new_consts = {}

    def padded_const(v, axis):
        key = (id(v), axis)
        if key not in new_consts:
            new_consts[key] = graph.const(_pad(v.data, axis, cp), name=f"{v.name}_padded")
        return new_consts[key]

    for n in list(region.sources.values()) + list(region.depthwise.values()):
        n.inputs[1] = padded_const(n.inputs[1], 0)
        if len(n.inputs) > 2 and n.inputs[2] is not None:
            n.inputs[2] = padded_const(n.inputs[2], 0)
        if id(n) in region.depthwise:
            n.attrs["groups"] = cp
        else:
            n.attrs["live_channels"] = c         # its padded channels written as zeros
    for n in region.readers.values():
        n.inputs[1] = padded_const(n.inputs[1], 1)
    for n, k in region.consts:           # only these uses: a constant may be shared with nodes outside
        n.inputs[k] = padded_const(n.inputs[k], 1)
    # the new types, in graph order (each node's inputs are final before it)
    widened = set(region.values)
    for n in graph.nodes:
        if not any(id(o) in widened for o in n.outputs) and id(n) not in region.readers:
            continue
        types = infer_types(n.op, [None if i is None else i.type for i in n.inputs], n.attrs, n.inputs)
        for o, t in zip(n.outputs, types):
            o.type = t


def run(graph, block: int):
    """Widens every region whose channel count is worth padding to blocks of `block` floats."""
    users, outputs = graph.users(), {id(v) for v in graph.outputs}
    done = set()
    for n in list(graph.nodes):
        y = n.outputs[0] if n.outputs else None
        if n.op != "conv" or y is None or id(y) in done or y.type.rank != 4 or not isinstance(y.shape[1], int) \
                or not worth_padding(y.shape[1], block):
            continue
        region = _Region(y.shape[1])
        ok = region.grow(y, users, outputs)
        done.update(region.values)
        if ok and (region.sources or region.depthwise):
            _widen(graph, region, block)
    return graph
