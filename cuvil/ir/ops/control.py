"""Control flow: ops whose attributes hold subgraphs (regions), run as C `if`/`while` in the
compiled code. The reference interpreter runs their regions (interpreter.py: region ops have no
`ref` of their own, since running a graph is the interpreter's job, not an op's).

    cond(pred, *operands; then_graph, else_graph): one branch's outputs; pred a bool of one element,
        each branch a Graph whose inputs are the operands (in order) and whose outputs agree in type.
    batch_map(*batched; body_graph): body_graph run on image i of every input (dim 0, batch N) gives image
        i of every output: inputs and outputs [N, ...], the body's the same at [1, ...] (passes/batch_map.py
        makes it; the C code runs the images one after another or side by side on the threads).
    while_loop(*carried, *extra; cond_graph, body_graph, carried=n): cond_graph(carried, extra) -> bool
        of one element; body_graph(carried, extra) -> new carried (same types); outputs the carried
        values once cond is false. `extra` (the loop's invariants) is read, never changed."""
from __future__ import annotations

from ...errors import GraphError
from .. import dims as D
from ..types import TensorType
from .registry import REQUIRED, OpDef, declare


def _types_match(a: TensorType, b: TensorType) -> bool:
    return a.dtype == b.dtype and len(a.shape) == len(b.shape) and all(D.dims_equal(x, y) for x, y in zip(a.shape, b.shape))


def _check_region(name, graph, types, what):
    if len(graph.inputs) != len(types):
        raise GraphError(f"{name}: {what} takes {len(graph.inputs)} inputs, given {len(types)}")
    for i, (v, t) in enumerate(zip(graph.inputs, types)):
        if not _types_match(v.type, t):
            raise GraphError(f"{name}: {what} input {i} is {v.type}, given {t}")


def _is_flag(t: TensorType) -> bool:
    return t.dtype == "bool" and all(d == 1 for d in t.shape)


def _cond_infer(types, attrs, inputs):
    if not _is_flag(types[0]):
        raise GraphError(f"cond: the predicate must be a bool of one element, got {types[0]}")
    then_g, else_g = attrs["then_graph"], attrs["else_graph"]
    for what, g in (("then_graph", then_g), ("else_graph", else_g)):
        _check_region("cond", g, types[1:], what)
    if len(then_g.outputs) != len(else_g.outputs) or not all(
            _types_match(a.type, b.type) for a, b in zip(then_g.outputs, else_g.outputs)):
        raise GraphError("cond: the branches' outputs differ in number or type: "
                         f"{[o.type for o in then_g.outputs]} vs {[o.type for o in else_g.outputs]}")
    return [o.type for o in then_g.outputs]


def _while_infer(types, attrs, inputs):
    n = attrs["carried"]
    if not isinstance(n, int) or not 0 < n <= len(types):
        raise GraphError(f"while_loop: carried={n!r} must count 1 .. {len(types)} leading inputs")
    cond_g, body_g = attrs["cond_graph"], attrs["body_graph"]
    _check_region("while_loop", cond_g, types, "cond_graph")
    _check_region("while_loop", body_g, types, "body_graph")
    if len(cond_g.outputs) != 1 or not _is_flag(cond_g.outputs[0].type):
        raise GraphError("while_loop: cond_graph must return one bool of one element")
    if len(body_g.outputs) != n or not all(_types_match(o.type, t) for o, t in zip(body_g.outputs, types[:n])):
        raise GraphError(f"while_loop: body_graph must return the {n} carried values with their types: "
                         f"{[o.type for o in body_g.outputs]} vs {list(types[:n])}")
    return list(types[:n])


def _batch_map_infer(types, attrs, inputs):
    body = attrs["body_graph"]
    if not types or any(not t.shape or t.shape[0] != types[0].shape[0] for t in types):
        raise GraphError(f"batch_map: every input needs the same batch in dim 0, got {list(types)}")
    n = types[0].shape[0]
    _check_region("batch_map", body, [TensorType((1, *t.shape[1:]), t.dtype) for t in types], "body_graph")
    if any(not o.type.shape or o.type.shape[0] != 1 for o in body.outputs):
        raise GraphError(f"batch_map: body_graph's outputs must be one image each, got {[o.type for o in body.outputs]}")
    return [TensorType((n, *o.type.shape[1:]), o.type.dtype) for o in body.outputs]


def _no_ref(xs, attrs):
    raise GraphError("region ops run through the interpreter (ir/interpreter.py), not a reference function")


declare(OpDef("cond", {"then_graph": REQUIRED, "else_graph": REQUIRED}, _cond_infer, _no_ref, kind="region"))
declare(OpDef("while_loop", {"cond_graph": REQUIRED, "body_graph": REQUIRED, "carried": REQUIRED}, _while_infer,
              _no_ref, kind="region"))

declare(OpDef("batch_map", {"body_graph": REQUIRED}, _batch_map_infer, _no_ref, kind="region"))

# region op -> its subgraph attributes, in the order they run
REGIONS = {"cond": ("then_graph", "else_graph"), "while_loop": ("cond_graph", "body_graph"),
           "batch_map": ("body_graph",)}
