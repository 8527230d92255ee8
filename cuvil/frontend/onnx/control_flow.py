"""Control-flow op handlers: If, Loop and Scan.

Each is inlined when its condition / trip count is known at compile time (at most MAX_UNROLL
iterations): the subgraph runs in place through inline_subgraph, and loop scan outputs are stacked.
An If whose condition is known only at run time becomes the IR's cond region (ir/ops/control.py):
each branch converted into a graph of its own, the outer values it reads made its inputs. A Loop
whose trip count or condition is known only at run time becomes the IR's while_loop, carrying the
iteration number and the condition beside the loop's own values (which must keep their shapes; scan
outputs, whose length would then be known only at run time, are not supported there)."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Value
from .helpers import Unsupported, is_sym, norm_axis, rank_of, shape_of
from .model import MAX_UNROLL
from .registry import handler
from .subgraphs import inline_subgraph


# ---- control flow: inlined when the condition / trip count is known at compile time ---------------
@handler("If")
def _if(c):
    cond = c.inp(0)
    if isinstance(cond, np.ndarray):
        g = c.attr("then_branch") if bool(np.asarray(cond).ravel()[0]) else c.attr("else_branch")
        return inline_subgraph(c, g, {})
    branches = [_branch(c, c.attr(k)) for k in ("then_branch", "else_branch")]
    refs = list({id(v): v for _, outer in branches for v in outer}.values())
    graphs = [_with_inputs(g, outer, refs) for g, outer in branches]
    if [str(o.type) for o in graphs[0].outputs] != [str(o.type) for o in graphs[1].outputs]:
        raise Unsupported("an If whose branches' outputs differ in shape or dtype, with a run-time condition")
    flag = c.reshape(cond, []) if cond.type.rank else cond
    out = c.op("cond", [flag, *refs], then_graph=graphs[0], else_graph=graphs[1])
    return list(out) if isinstance(out, list) else [out]


def _branch(c, body):
    """One branch converted into a Graph of its own; returns it and the outer run-time values it reads."""
    outer_graph, sub = c.g, Graph(symbols=c.g.symbols)
    c.g = sub
    try:
        outs = inline_subgraph(c, body, {})
    finally:
        c.g = outer_graph
    if any(o is None for o in outs):
        raise Unsupported("an If branch output that is not a tensor (a sequence or optional)")
    sub.outputs = [sub.const(o) if isinstance(o, np.ndarray) else o for o in outs]
    return sub, _outer_values(sub)


def _outer_values(sub, own=()):
    """The run-time values of the enclosing graph that sub reads (in its nodes or as outputs), each
    once: what neither its nodes produce nor its own inputs `own` are."""
    inside = {id(o) for n in sub.nodes for o in n.outputs} | {id(v) for v in own}
    reads = [v for n in sub.nodes for v in n.inputs] + sub.outputs
    return list({id(v): v for v in reads if isinstance(v, Value) and not v.is_const and id(v) not in inside}.values())


def _with_inputs(g, outer, refs):
    """g with one input per outer value in refs (the same list for both branches), its reads of them
    rewired to those inputs."""
    mine = {id(v): Value(v.type) for v in refs}
    g.inputs = [mine[id(v)] for v in refs]
    for n in g.nodes:
        n.inputs = [mine.get(id(v), v) if v is not None else None for v in n.inputs]
    g.outputs = [mine.get(id(o), o) for o in g.outputs]
    return g


def _stack(c, xs, axis):
    if all(isinstance(x, np.ndarray) and not is_sym(x) for x in xs):
        return np.stack(xs, axis=axis)
    parts = []
    for x in xs:
        sh = list(shape_of(x))
        sh.insert(norm_axis(axis, len(sh) + 1), 1)
        parts.append(c.reshape(x, sh))
    return parts[0] if len(parts) == 1 else c.op("concat", parts, axis=axis)


def _take_slice(c, x, axis, t):
    if isinstance(x, np.ndarray):
        return np.take(x, t, axis=axis)
    y = c.op("slice", [x], axis=axis, start=t, step=1, length=1)
    sh = list(shape_of(x))
    del sh[axis]
    return c.reshape(y, sh)


def _flag(c, v, dtype):
    """A one-element value as a scalar of dtype."""
    v = c.reshape(v, []) if rank_of(v) else v
    return c.cast(v, dtype)


def _loop_region(c, body):
    """Loop(M, cond, v...) with a run-time M or cond -> while_loop over (i, cond, v...): the body a
    graph of its own returning (i + 1, cond_out, v_out...), the condition i < M and cond."""
    n = len(c.node.input) - 2
    M = c.inp(0)
    carried = [c.val(c.inp(2 + k)) for k in range(n)]
    start = [c.val(np.array(0, np.int64)), c.val(np.array(True)) if c.inp(1) is None else c.val(_flag(c, c.inp(1), "bool"))]
    names = [i.name for i in body.input]
    sub, outer_graph = Graph(symbols=c.g.symbols), c.g
    own = [Value(v.type) for v in start + carried]
    c.g = sub
    try:
        outs = inline_subgraph(c, body, dict(zip(names, own)))
        if any(o is None for o in outs):
            raise Unsupported("a Loop body output that is not a tensor (a sequence or optional)")
        step = sub.add("add", [own[0], sub.const(np.array(1, np.int64))], {})
        sub.outputs = [step, c.val(_flag(c, outs[0], "bool"))] + [c.val(o) for o in outs[1:]]
    finally:
        c.g = outer_graph
    for v, o in zip(carried, sub.outputs[2:]):
        if str(v.type) != str(o.type):
            raise Unsupported(f"a Loop whose carried value changes from {v.type} to {o.type} (run-time trip count)")
    refs = _outer_values(sub, own)
    limit = c.val(_flag(c, M, "int64")) if M is not None else None
    extra = refs + ([limit] if limit is not None and not limit.is_const and all(limit is not r for r in refs) else [])
    mine = {id(v): Value(v.type) for v in extra}
    sub.inputs = own + [mine[id(v)] for v in extra]
    for nd in sub.nodes:
        nd.inputs = [mine.get(id(v), v) if v is not None else None for v in nd.inputs]
    sub.outputs = [mine.get(id(o), o) for o in sub.outputs]
    cond_g = Graph(symbols=c.g.symbols)
    cond_g.inputs = [Value(v.type) for v in own + extra]
    go = cond_g.inputs[1]
    if limit is not None:
        bound = cond_g.inputs[len(own) + extra.index(limit)] if not limit.is_const else cond_g.const(limit.data)
        go = cond_g.add("and", [go, cond_g.add("lt", [cond_g.inputs[0], bound], {})], {})
    cond_g.outputs = [go]
    out = c.op("while_loop", start + carried + extra, cond_graph=cond_g, body_graph=sub, carried=2 + n)
    return list(out)[2:]


@handler("Loop")
def _loop(c):
    body = c.attr("body")
    runtime = any(c.inp(k) is not None and not isinstance(c.inp(k), np.ndarray) for k in (0, 1))
    scans = len(body.output) - 1 - (len(c.node.input) - 2)
    if runtime and not scans:
        return _loop_region(c, body)
    # scan outputs: their length must be known, so M and cond are asked for as compile-time values
    # (cuvil.InferenceSession specializes on them; compile() says which inputs to fix)
    M = c.known(0, "M") if c.inp(0) is not None else None
    cond = c.known(1, "cond") if c.inp(1) is not None else None
    trips = int(np.asarray(M).ravel()[0]) if M is not None else MAX_UNROLL
    if M is None and cond is None:
        raise Unsupported("an infinite loop")
    n_carried = len(c.node.input) - 2
    carried = [c.inp(2 + k) for k in range(n_carried)]
    go = True if cond is None else bool(np.asarray(cond).ravel()[0])
    scans = []
    names = [i.name for i in body.input]
    for i in range(min(trips, MAX_UNROLL + 1)):
        if not go:
            break
        if i >= MAX_UNROLL:
            raise Unsupported(f"more than {MAX_UNROLL} iterations")
        bind = {names[0]: np.array(i, np.int64), names[1]: np.array(go)}
        bind.update(zip(names[2:], carried))
        outs = inline_subgraph(c, body, bind)
        if any(o is None for o in outs):
            raise Unsupported("loop body")
        co = outs[0]
        if not isinstance(co, np.ndarray):
            raise Unsupported("a data-dependent loop condition")
        go = bool(np.asarray(co).ravel()[0])
        carried = outs[1:1 + n_carried]
        scans.append(outs[1 + n_carried:])
    n_scan = len(body.output) - 1 - n_carried
    if n_scan and not scans:
        raise Unsupported("a loop with zero iterations and scan outputs")
    return list(carried) + [_stack(c, [s[k] for s in scans], 0) for k in range(n_scan)]


@handler("Scan")
def _scan(c):
    if c.opset < 9:
        raise Unsupported("Scan-8 (batched)")
    body = c.attr("body")
    m = c.attr("num_scan_inputs")
    ins = [c.inp(i) for i in range(len(c.node.input))]
    n = len(ins) - m
    states, xs = ins[:n], ins[n:]
    in_axes = [norm_axis(a, rank_of(x)) for a, x in zip(c.attr("scan_input_axes") or [0] * m, xs)]
    in_dirs = c.attr("scan_input_directions") or [0] * m
    T = shape_of(xs[0])[in_axes[0]]
    if not isinstance(T, int):
        raise Unsupported("a symbolic scan length")
    if T > MAX_UNROLL:
        raise Unsupported(f"more than {MAX_UNROLL} scan steps")
    names = [i.name for i in body.input]
    ys = []
    for t in range(T):
        bind = dict(zip(names[:n], states))
        for k, x in enumerate(xs):
            bind[names[n + k]] = _take_slice(c, x, in_axes[k], T - 1 - t if in_dirs[k] else t)
        outs = inline_subgraph(c, body, bind)
        if any(o is None for o in outs):
            raise Unsupported("scan body")
        states = outs[:n]
        ys.append(outs[n:])
    n_out = len(body.output) - n
    out_axes = c.attr("scan_output_axes") or [0] * n_out
    out_dirs = c.attr("scan_output_directions") or [0] * n_out
    res = list(states)
    for k in range(n_out):
        seq = [y[k] for y in ys]
        if out_dirs[k]:
            seq = seq[::-1]
        res.append(_stack(c, seq, out_axes[k]))
    return res
