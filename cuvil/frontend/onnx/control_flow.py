"""Control-flow op handlers: If and Loop (Scan is in scan.py).

Each is inlined when its condition / trip count is known at compile time (at most MAX_UNROLL
iterations): the subgraph runs in place through inline_subgraph, and loop scan outputs are stacked.
An If whose condition is known only at run time becomes the IR's cond region (ir/ops/control.py):
each branch converted into a graph of its own, the outer values it reads made its inputs. A Loop
whose trip count or condition is known only at run time becomes the IR's while_loop, carrying the
iteration number and the condition beside the loop's own values (which must keep their shapes).
Its scan outputs are rows of buffers carried too, sized by a bound known at compile time (a constant
trip count, or the length the model declares for that output); the rows run are cut out after the
loop by bind_dim, which fails the run if the loop ran past the bound. Without a bound the trip count
is asked for as a compile-time value (cuvil.InferenceSession specializes on it)."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Graph
from ..data_sized import bind, fresh_symbol
from .model import MAX_UNROLL
from .registry import handler
from .helpers import ABSENT, Absent, Seq, Unsupported
from .regions import flag, outer_values, rewire, stack, while_region, write_row, zero_rows
from .subgraphs import inline_subgraph


# ---- If ---------------------------------------------------------------------------------------
@handler("If")
def _if(c):
    cond = c.inp(0)
    if isinstance(cond, np.ndarray):
        g = c.attr("then_branch") if bool(np.asarray(cond).ravel()[0]) else c.attr("else_branch")
        return inline_subgraph(c, g, {})
    branches = [_branch(c, c.attr(k)) for k in ("then_branch", "else_branch")]
    if branches[0][2] != branches[1][2]:        # sequences of other lengths, an optional empty in one branch
        c.known(0, "cond (the branches return sequences or optionals of different structure)")
    refs = list({id(v): v for _, outer, _ in branches for v in outer}.values())
    graphs = [rewire(g, refs) for g, _, _ in branches]
    if [str(o.type) for o in graphs[0].outputs] != [str(o.type) for o in graphs[1].outputs]:
        raise Unsupported("an If whose branches' outputs differ in shape or dtype, with a run-time condition")
    pred = c.reshape(cond, []) if cond.type.rank else cond
    out = c.op("cond", [pred, *refs], then_graph=graphs[0], else_graph=graphs[1]) if graphs[0].outputs else []
    return _regroup(list(out) if isinstance(out, list) else [out], branches[0][2])


def _branch(c, body):
    """One branch converted into a Graph of its own; returns it, the outer run-time values it reads
    and its outputs' structure (sequences and optionals are flattened into their tensors)."""
    outer_graph, sub = c.g, Graph(symbols=c.g.symbols)
    c.g = sub
    try:
        outs = inline_subgraph(c, body, {})
    finally:
        c.g = outer_graph
    if any(o is None for o in outs):
        raise Unsupported("an If branch output that is missing")
    shape = [len(o) if isinstance(o, Seq) else "absent" if o is ABSENT else None for o in outs]
    flat = [e for o in outs for e in (o.items if isinstance(o, Seq) else [] if o is ABSENT else [o])]
    sub.outputs = [sub.const(o) if isinstance(o, np.ndarray) else o for o in flat]
    return sub, outer_values(sub), shape


def _regroup(flat, shape):
    """The cond's tensors back into the branches' structure (see _branch)."""
    out, at = [], 0
    for s in shape:
        if s == "absent":
            out.append(ABSENT)
        elif s is None:
            out.append(flat[at])
            at += 1
        else:
            out.append(Seq(flat[at:at + s]))
            at += s
    return out


# ---- Loop -------------------------------------------------------------------------------------
MAX_LOOP_ROWS = 1 << 20       # the most rows a run-time Loop's scan output buffers are given


def _scan_bound(c, n_scan):
    """How many rows a run-time Loop's scan outputs may need, known at compile time: a constant trip
    count, else the first dim the model declares for every scan output (graph outputs and value_info
    of the main graph); None when neither says."""
    M = c.inp(0)
    if isinstance(M, np.ndarray) and int(np.asarray(M).ravel()[0]) <= MAX_LOOP_ROWS:
        return max(int(np.asarray(M).ravel()[0]), 0)
    g = c.model.graph
    declared = {vi.name: vi.type.tensor_type.shape for vi in list(g.output) + list(g.value_info)
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
    bounds = []
    for name in c.node.output[len(c.node.output) - n_scan:]:
        dims = declared[name].dim if name in declared else []
        if not dims or not dims[0].HasField("dim_value") or dims[0].dim_value < 0:
            return None
        bounds.append(dims[0].dim_value)
    return min(bounds) if min(bounds) <= MAX_LOOP_ROWS else None


def _loop_region(c, body, bound):
    """Loop(M, cond, v...) with a run-time M or cond -> while_loop over (i, cond, v..., scan rows...):
    the body returns (i + 1, cond_out, v_out...) and writes its scan outputs at row i of buffers of
    `bound` rows; after the loop each buffer is cut to the i rows run."""
    n = len(c.node.input) - 2
    M = c.inp(0)
    names = [i.name for i in body.input]
    start = [c.val(np.array(0, np.int64)), c.val(np.array(True)) if c.inp(1) is None else c.val(flag(c, c.inp(1), "bool"))]
    start += [c.val(c.inp(2 + k)) for k in range(n)]
    outer = c.g

    def step(own, carry):
        outs = inline_subgraph(c, body, dict(zip(names, own)))
        if any(o is None for o in outs):
            raise Unsupported("a Loop body output that is not a tensor (a sequence or optional)")
        rows = []
        for y in outs[1 + n:]:
            buf = carry(zero_rows(outer, bound, y))
            rows.append(write_row(c, buf, own[0], y))
        return outs[:1 + n] + rows

    limit = c.val(flag(c, M, "int64")) if M is not None else None
    out = while_region(c, start, limit, step)
    trips, results = out[0], out[2:2 + n]
    for buf in out[2 + n:]:
        results.append(bind(lambda op, ins, attrs: c.op(op, ins, **attrs), c.g, buf, trips, 0, fresh_symbol(c.g, "loop_trips")))
    return results


@handler("Loop")
def _loop(c):
    body = c.attr("body")
    runtime = any(c.inp(k) is not None and not isinstance(c.inp(k), np.ndarray) for k in (0, 1))
    n_carried = len(c.node.input) - 2
    n_scan = len(body.output) - 1 - n_carried
    if runtime and not any(isinstance(c.inp(2 + k), (Seq, Absent)) for k in range(n_carried)):
        # (scan rows are cut by bind_dim, which only the top-level graph may hold)
        bound = 0 if not n_scan else _scan_bound(c, n_scan) if c.g is c.main else None
        if bound is not None:
            return _loop_region(c, body, bound)
    # scan outputs without a bound on their length, or sequences / optionals carried: M and cond are
    # asked for as compile-time values (cuvil.InferenceSession specializes on them; compile() says which)
    M = c.known(0, "M") if c.inp(0) is not None else None
    cond = c.known(1, "cond") if c.inp(1) is not None else None
    trips = int(np.asarray(M).ravel()[0]) if M is not None else MAX_UNROLL
    if M is None and cond is None:
        raise Unsupported("an infinite loop")
    carried = [c.inp(2 + k) for k in range(n_carried)]
    go = True if cond is None else bool(np.asarray(cond).ravel()[0])
    scans = []
    names = [i.name for i in body.input]
    for i in range(min(trips, MAX_UNROLL + 1)):
        if not go:
            break
        if i >= MAX_UNROLL:
            raise Unsupported(f"more than {MAX_UNROLL} iterations")
        env = {names[0]: np.array(i, np.int64), names[1]: np.array(go)}
        env.update(zip(names[2:], carried))
        outs = inline_subgraph(c, body, env)
        if any(o is None for o in outs):
            raise Unsupported("loop body")
        co = outs[0]
        if not isinstance(co, np.ndarray):
            raise Unsupported("a data-dependent loop condition")
        go = bool(np.asarray(co).ravel()[0])
        carried = outs[1:1 + n_carried]
        scans.append(outs[1 + n_carried:])
    if n_scan and not scans:
        raise Unsupported("a loop with zero iterations and scan outputs")
    return list(carried) + [stack(c, [s[k] for s in scans], 0) for k in range(n_scan)]
