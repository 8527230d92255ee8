"""Static memory plan: every intermediate gets an offset in one arena, from liveness,
best fit, 64-byte aligned. Dynamic dims are planned at their upper bound.

Views (reshape of a value that is not a graph output) share their source's buffer."""
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
    sizes: dict = field(default_factory=dict)            # value name -> bytes

    def __str__(self):
        lines = [f"arena: {self.arena_bytes} bytes ({self.arena_bytes / 2**20:.2f} MiB)"]
        for name, off in sorted(self.offsets.items(), key=lambda kv: kv[1]):
            lines.append(f"  %{name}: offset {off}, {self.sizes[name]} bytes")
        for idx, (off, n) in sorted(self.scratch.items()):
            lines.append(f"  scratch of node {idx}: offset {off}, {n} bytes")
        for a, b in self.alias.items():
            lines.append(f"  %{a}: view of %{b}")
        return "\n".join(lines)


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def value_bytes(v, bounds):
    n = 1
    for d in v.type.shape:
        n *= D.upper_bound(d, bounds)
    return int(n) * np.dtype(v.dtype).itemsize


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
    requests = [(first[k], last[k], _align(max(value_bytes(vals[k], bounds), 1)), ("value", vals[k].name))
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
