"""IR regions built from ONNX subgraphs, shared by the control-flow families (If / Loop in
control_flow.py, Scan in scan.py): a subgraph converted into a Graph of its own, the outer values it
reads made its inputs, and the while_loop that If-less loops become when their length is known only at
run time. Also the small value helpers those handlers share (stacking, one slice, a flag)."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Value
from .helpers import Unsupported, is_sym, norm_axis, rank_of, shape_of


def outer_values(sub, own=()):
    """The run-time values of the enclosing graph that sub reads (in its nodes or as outputs), each
    once: what neither its nodes produce nor its own inputs `own` are."""
    inside = {id(o) for n in sub.nodes for o in n.outputs} | {id(v) for v in own}
    reads = [v for n in sub.nodes for v in n.inputs] + sub.outputs
    return list({id(v): v for v in reads if isinstance(v, Value) and not v.is_const and id(v) not in inside}.values())


def rewire(g, refs, inputs=()):
    """g with inputs `inputs` + one per outer value in refs, its reads of those values rewired to them."""
    mine = {id(v): Value(v.type) for v in refs}
    g.inputs = list(inputs) + [mine[id(v)] for v in refs]
    for n in g.nodes:
        n.inputs = [mine.get(id(v), v) if v is not None else None for v in n.inputs]
    g.outputs = [mine.get(id(o), o) for o in g.outputs]
    return g


def flag(c, v, dtype):
    """A one-element value as a scalar of dtype."""
    v = c.reshape(v, []) if rank_of(v) else v
    return c.cast(v, dtype)


def stack(c, xs, axis):
    if all(isinstance(x, np.ndarray) and not is_sym(x) for x in xs):
        return np.stack(xs, axis=axis)
    parts = []
    for x in xs:
        sh = list(shape_of(x))
        sh.insert(norm_axis(axis, len(sh) + 1), 1)
        parts.append(c.reshape(x, sh))
    return parts[0] if len(parts) == 1 else c.op("concat", parts, axis=axis)


def take_slice(c, x, axis, t):
    """x's entry t along axis (a python int, or a 0-d int64 value known at run time), axis removed."""
    if isinstance(x, np.ndarray) and isinstance(t, int):
        return np.take(x, t, axis=axis)
    if not isinstance(t, int):
        return c.op("gather", [x, t], axis=axis)
    y = c.op("slice", [x], axis=axis, start=t, step=1, length=1)
    sh = list(shape_of(x))
    del sh[axis]
    return c.reshape(y, sh)


def zero_rows(graph, rows, y):
    """A zero buffer [rows, *y's shape] of y's dtype in graph (the scan outputs' rows a loop fills)."""
    return graph.add("full", [], {"shape": [rows] + list(shape_of(y)), "value": 0, "dtype": str(y.dtype)})


def write_row(c, buf, row, y):
    """buf [n, ...] with y [...] written at row `row` (a 0-d int64 known at run time): a select over
    the rows, so a row outside [0, n) writes nothing."""
    rows = c.op("iota", [], length=buf.type.shape[0], dtype="int64")
    hit = c.reshape(c.op("eq", [rows, row]), [buf.type.shape[0]] + [1] * (buf.type.rank - 1))
    return c.op("where", [hit, c.reshape(y, [1] + list(shape_of(y))), buf])


def while_region(c, start, limit, step):
    """A while_loop over start = [i, go, *carried] (i a 0-d int64, go a bool scalar) that runs while go
    and i < limit (a 0-d int64 value, or None for no limit). step(own, carry) builds one iteration in the
    body graph (c.g is that graph while it runs): own are the body's values of start, and carry(v0)
    adds a carried value starting at the outer value v0 and returns its body value; it returns
    [go_out, *next values of own[2:] and of what it carried]. Returns the loop's final values."""
    sub, outer_graph = Graph(symbols=c.g.symbols), c.g
    start, own = list(start), [Value(v.type) for v in start]

    def carry(v0):
        start.append(v0)
        own.append(Value(v0.type))
        return own[-1]

    c.g = sub
    try:
        outs = step(own, carry)
        nxt = sub.add("add", [own[0], sub.const(np.array(1, np.int64))], {})
        sub.outputs = [nxt, c.val(flag(c, outs[0], "bool"))] + [c.val(o) for o in outs[1:]]
    finally:
        c.g = outer_graph
    for v, o in zip(start[2:], sub.outputs[2:]):
        if str(v.type) != str(o.type):
            raise Unsupported(f"a loop whose carried value changes from {v.type} to {o.type} (run-time length)")
    refs = outer_values(sub, own)
    extra = refs + ([limit] if limit is not None and not limit.is_const and all(limit is not r for r in refs) else [])
    rewire(sub, extra, own)
    cond_g = Graph(symbols=c.g.symbols)
    cond_g.inputs = [Value(v.type) for v in own + extra]
    go = cond_g.inputs[1]
    if limit is not None:
        bound = cond_g.inputs[len(own) + extra.index(limit)] if not limit.is_const else cond_g.const(limit.data)
        go = cond_g.add("and", [go, cond_g.add("lt", [cond_g.inputs[0], bound], {})], {})
    cond_g.outputs = [go]
    return list(c.op("while_loop", start + extra, cond_graph=cond_g, body_graph=sub, carried=len(start)))
