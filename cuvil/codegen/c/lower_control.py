"""cond and while_loop (ir/ops/control.py) as C `if` and `for (;;)` inside cuvil_run.

A region is lowered like a whole graph, by the same lowerings, with its own memory plan placed in
its node's scratch memory: every pointer stays relative to the one arena `A`, so loops the region
outlines onto the thread pool see its buffers as they see the model's. A cond's branches read the
operands where they are and write the node's outputs directly (the branches share the scratch: one
runs). A while_loop keeps its carried values in slots of the scratch: cond and body read them, the
body writes the next values to slots of their own (it may still read the old ones), copied back
after each step; the loop-invariant inputs are read where they are."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...passes import memplan
from . import cexpr
from .emit import Emitter, bind_io, emit_body, lowering

ALIGN = 64


@dataclass
class RegionPlan:
    """The layout of a region node's scratch: value slots, then one arena for its subgraphs."""
    slots: list          # byte offsets in the scratch, one per slot value
    arena_offset: int
    plans: dict          # attribute -> the subgraph's memory plan
    total: int


def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _plan(node, bounds) -> RegionPlan:
    from . import C_BACKEND          # (the package registers this module: import it when used)
    from ...passes.pipeline import plan_memory
    plans = {k: plan_memory(sub, C_BACKEND) for k, sub in _regions(node)}
    slot_values = _slot_values(node)
    slots, off = [], 0
    for v in slot_values:
        slots.append(off)
        off += align(max(memplan.value_bytes(v, bounds), 1))
    arena_off = align(off)
    return RegionPlan(slots, arena_off, plans, arena_off + max((p.arena_bytes for p in plans.values()), default=0))


def _regions(node):
    from ...ir.ops import REGIONS
    return [(k, node.attrs[k]) for k in REGIONS[node.op]]


def _slot_values(node):
    """Values that live in the node's scratch: a while_loop's carried values, its body's next values
    and its condition flag; a cond needs none."""
    if node.op != "while_loop":
        return []
    n = node.attrs["carried"]
    body, cond = node.attrs["body_graph"], node.attrs["cond_graph"]
    return list(node.inputs[:n]) + list(body.outputs) + [cond.outputs[0]]


def _scratch(node, bounds):
    return _plan(node, dict(bounds)).total


def _sub_emitter(em, graph, plan, base):
    return Emitter(graph, plan, em.weights, target=em.target, tasks=em.tasks, weights_cached=em.weights_cached,
                   shift=base)


def region_body(em, graph, plan, base, inputs, outputs):
    """C lines running `graph` with its plan at arena offset `base`, inputs and outputs at the pointer
    expressions given."""
    sub = _sub_emitter(em, graph, plan, base)
    copies = bind_io(sub, inputs, outputs)
    lines = []
    emit_body(sub, graph, lines, copies)
    return lines


def scratch_base(em) -> int:
    """Where the node's scratch starts (a region that needs none asked for 0 bytes and got no place)."""
    off, _ = em.plan.scratch.get(em.node_index, (0, 0))
    return em.shift + off


def _bytes(v):
    return cexpr.nbytes(v.type.shape, np.dtype(v.dtype).itemsize)


@lowering("cond", scratch=_scratch)
def _cond(em, node):
    rp = _plan(node, em.graph.symbols)
    base = scratch_base(em)
    arena = base + rp.arena_offset
    ins = [em.ptr(v) for v in node.inputs[1:]]
    outs = [em.ptr(o) for o in node.outputs]
    then_lines = region_body(em, node.attrs["then_graph"], rp.plans["then_graph"], arena, ins, outs)
    else_lines = region_body(em, node.attrs["else_graph"], rp.plans["else_graph"], arena, ins, outs)
    return [f"if (*{em.ptr(node.inputs[0])}) {{", *then_lines, "} else {", *else_lines, "}"]


@lowering("while_loop", scratch=_scratch)
def _while(em, node):
    rp = _plan(node, em.graph.symbols)
    base = scratch_base(em)
    arena = base + rp.arena_offset
    n = node.attrs["carried"]
    slot_vals = _slot_values(node)
    slot = [f"(({em.ctype(v)} *)(A + {base + off}))" for v, off in zip(slot_vals, rp.slots)]
    carried, nxt, flag = slot[:n], slot[n:2 * n], slot[2 * n]
    extra = [em.ptr(v) for v in node.inputs[n:]]
    cond_lines = region_body(em, node.attrs["cond_graph"], rp.plans["cond_graph"], arena, carried + extra, [flag])
    body_lines = region_body(em, node.attrs["body_graph"], rp.plans["body_graph"], arena, carried + extra, nxt)
    lines = [f"memcpy({c}, {em.ptr(v)}, (size_t)({_bytes(v)}));" for c, v in zip(carried, node.inputs[:n])]
    lines += ["for (;;) {", *cond_lines, f"  if (!*{flag}) break;", *body_lines]
    lines += [f"  memcpy({c}, {x}, (size_t)({_bytes(v)}));" for c, x, v in zip(carried, nxt, node.inputs[:n])]
    lines.append("}")
    lines += [f"memcpy({em.ptr(o)}, {c}, (size_t)({_bytes(o)}));" for o, c in zip(node.outputs, carried)]
    return lines
