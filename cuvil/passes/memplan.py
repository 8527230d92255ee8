"""Static memory plan: every intermediate gets an offset in one arena, from liveness,
best fit, 64-byte aligned. Dynamic dims are planned at their upper bound.

Views (reshape of a value that is not a graph output) share their source's buffer; a reshape that is a
graph output has its source written into the output instead (reshaped_outputs). A concat whose
inputs are each a contiguous run of its output (one image, or whatever comes before the axis has one
element: NCHW and whole channel blocks alike) has its producers write there (in_place_concat): its
inputs are views of the output at their byte offsets, and the concat itself copies nothing
(SqueezeNet's fire modules, ShuffleNet's branches, Inception's)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import dims as D

ALIGN = 64
# ops whose output is their first input's buffer: a reshape view, the in-place KV cache update
VIEW_OPS = ("reshape", "kv_update")


@dataclass
class MemoryPlan:
    arena_bytes: int
    offsets: dict = field(default_factory=dict)          # value name -> arena offset
    scratch: dict = field(default_factory=dict)          # node index -> (offset, bytes)
    alias: dict = field(default_factory=dict)            # value name -> name of the value it views
    alias_offset: dict = field(default_factory=dict)     # value name -> its bytes' place in that value (0 if absent)
    sizes: dict = field(default_factory=dict)            # value name -> bytes
    concats_in_place: set = field(default_factory=set)   # output names of concats that copy nothing

    def __str__(self):
        lines = [f"arena: {self.arena_bytes} bytes ({self.arena_bytes / 2**20:.2f} MiB)"]
        for name, off in sorted(self.offsets.items(), key=lambda kv: kv[1]):
            lines.append(f"  %{name}: offset {off}, {self.sizes[name]} bytes")
        for idx, (off, n) in sorted(self.scratch.items()):
            lines.append(f"  scratch of node {idx}: offset {off}, {n} bytes")
        for a, b in self.alias.items():
            at = self.alias_offset.get(a)
            lines.append(f"  %{a}: view of %{b}" + (f" at byte {at}" if at else ""))
        return "\n".join(lines)


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def value_bytes(v, bounds, products=()):
    """Bytes of v at the symbols' bounds (and the graph's symbol_products, where given)."""
    return int(D.numel_upper_bound(v.type.shape, bounds, products)) * np.dtype(v.dtype).itemsize


def _static(v):
    return all(isinstance(d, int) for d in v.type.shape)


def in_place_concats(graph):
    """[(concat node, its inputs' byte offsets in its output)] for the concats whose inputs can be
    written in place: static shapes, one element before the axis (so each input is one run of the
    output), every input an intermediate made by a node that is no view or concat (not an input,
    constant or output), read once by this concat and by no view or other concat, at offsets that keep
    the arena's alignment."""
    outputs = {id(o) for o in graph.outputs}
    producer = {id(o): n.op for n in graph.nodes for o in n.outputs}
    users = graph.users()
    barred = VIEW_OPS + ("concat",)

    def placeable(x, y, n):
        return (x is not None and id(x) not in outputs and producer.get(id(x)) not in (None,) + barred
                and x.dtype == y.dtype and _static(x)
                and not any(u.op in barred and u is not n for u in users.get(id(x), [])))
    found = []
    for n in graph.nodes:
        y = n.outputs[0]
        if n.op != "concat" or id(y) in outputs or not _static(y) or len({id(x) for x in n.inputs}) != len(n.inputs):
            continue
        ax = n.attrs["axis"]
        if int(np.prod(y.type.shape[:ax], dtype=np.int64)) != 1:
            continue
        row = int(np.prod(y.type.shape[ax + 1:], dtype=np.int64)) * np.dtype(y.dtype).itemsize
        offsets = [0]
        for x in n.inputs:
            offsets.append(offsets[-1] + int(x.type.shape[ax]) * row)
        if all(placeable(x, y, n) for x in n.inputs) and all(at % ALIGN == 0 for at in offsets[:-1]):
            found.append((n, offsets[:-1]))
    return found


def reshaped_outputs(graph):
    """[(x, y)] for y = reshape(x) a graph output (once) and x an intermediate that only this reshape reads,
    made by a node that is no view and no concat (whose inputs may already be views of x) and stored plainly:
    x's producer writes into y's buffer, and the reshape copies nothing (a group norm's [N, G, C/G * H * W]
    result had been copied out whole)."""
    users, found = graph.users(), []
    outs = [id(o) for o in graph.outputs]
    inputs = {id(i) for i in graph.inputs}
    for n in graph.nodes:
        if n.op != "reshape" or outs.count(id(n.outputs[0])) != 1:
            continue
        x, y = n.inputs[0], n.outputs[0]
        p = x.producer
        if (p is None or x.is_const or id(x) in inputs or id(x) in outs or p.op in VIEW_OPS or p.op == "concat"
                or len(users.get(id(x), [])) != 1 or x.layout != "nchw" or x.dtype != y.dtype):
            continue
        found.append((x, y))
    return found


def plan(graph, scratch_bytes=lambda node, bounds: 0) -> MemoryPlan:
    bounds = graph.symbols
    outputs = {id(o) for o in graph.outputs}
    inputs = {id(i) for i in graph.inputs}
    result = MemoryPlan(0)
    root = {}                                   # id(value) -> owning value

    def owner(v):
        return root.get(id(v), v)

    for n in graph.nodes:
        if n.op in VIEW_OPS and id(n.outputs[0]) not in outputs:
            src = owner(n.inputs[0])
            root[id(n.outputs[0])] = src
            result.alias[n.outputs[0].name] = src.name
    for x, y in reshaped_outputs(graph):          # written where the reshape would have copied it to
        root[id(x)] = y
        result.alias[x.name] = y.name
    for n, offsets in in_place_concats(graph):
        y = n.outputs[0]
        result.concats_in_place.add(y.name)
        for x, at in zip(n.inputs, offsets):
            root[id(x)] = y
            result.alias[x.name] = y.name
            result.alias_offset[x.name] = at
    # live interval per owning value
    first, last, vals = {}, {}, {}
    for i, n in enumerate(graph.nodes):
        for o in n.outputs:
            ow = owner(o)
            if ow.is_const or id(ow) in inputs or id(ow) in outputs:
                continue
            vals[id(ow)] = ow
            first.setdefault(id(ow), i)
            last[id(ow)] = max(last.get(id(ow), i), i)
        for v in n.inputs:
            if v is not None and id(owner(v)) in first:
                last[id(owner(v))] = i
    for o in graph.outputs:                       # a view returned as output keeps its source alive
        if id(owner(o)) in first:
            last[id(owner(o))] = len(graph.nodes)
    requests = [(first[k], last[k], _align(max(value_bytes(vals[k], bounds, graph.symbol_products), 1)),
                 ("value", vals[k].name))
                for k in vals]
    for i, n in enumerate(graph.nodes):
        s = scratch_bytes(n, bounds)
        if s:
            requests.append((i, i, _align(s), ("scratch", i)))
    placed = []                                   # (start, end, offset, size)
    arena = 0
    for start, end, size, key in sorted(requests, key=lambda r: (-r[2], r[0])):
        busy = sorted((o, o + s) for a, b, o, s in placed if not (b < start or a > end))
        best, cursor = None, 0
        for lo, hi in busy + [(None, None)]:
            gap_end = lo if lo is not None else None
            if gap_end is None or gap_end - cursor >= size:
                waste = (gap_end - cursor - size) if gap_end is not None else float("inf")
                if best is None or waste < best[1]:
                    best = (cursor, waste)
                if gap_end is None:
                    break
            cursor = max(cursor, hi)
        off = best[0]
        placed.append((start, end, off, size))
        arena = max(arena, off + size)
        if key[0] == "value":
            result.offsets[key[1]] = off
            result.sizes[key[1]] = size
        else:
            result.scratch[key[1]] = (off, size)
    result.arena_bytes = _align(arena)
    return result
