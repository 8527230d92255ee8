"""JAX control flow -> the IR's regions (ir/ops/control.py): `while` (lax.while_loop, fori_loop with a
run-time bound) becomes while_loop, `cond` (lax.cond, lax.switch) becomes cond, nested for more than
two branches; `scan` (lax.scan, fori_loop with static bounds) is unrolled, up to MAX_SCAN steps. Each branch, condition and body is converted into a graph of its own (jax.py's
Ctx.region); the constants a jaxpr closes over are passed in beside the carried values."""
from __future__ import annotations

from ..ir.graph import Graph, Value
from .jax_registry import Unsupported, handles

MAX_SCAN = 256          # steps a scan is unrolled to (as the ONNX frontend unrolls Loop / Scan)


@handles("while")
def _while(ctx, *ops, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    """operands: cond's consts, body's consts, the carried values -> while_loop(carried, consts)."""
    consts, carried = list(ops[:cond_nconsts + body_nconsts]), list(ops[cond_nconsts + body_nconsts:])
    n = len(carried)
    ins = carried + consts
    cond_g = ctx.region(cond_jaxpr, ins, lambda v: v[n:n + cond_nconsts] + v[:n])
    body_g = ctx.region(body_jaxpr, ins, lambda v: v[n + cond_nconsts:] + v[:n])
    if cond_g.outputs[0].type.rank:
        raise Unsupported("a loop condition that is not a scalar")
    out = ctx.add("while_loop", ins, {"cond_graph": cond_g, "body_graph": body_g, "carried": n})
    return tuple(out) if isinstance(out, list) else (out,)


def _choose(ctx, branches, ins, first):
    """cond(index <= first, branches[first], the rest) over ins = (index, *operands): lax.switch's
    clamped choice as nested conds."""
    then_g = ctx.region(branches[first], ins, lambda v: v[1:])
    if len(branches) - first == 2:
        else_g = ctx.region(branches[first + 1], ins, lambda v: v[1:])
    else:                                           # a region whose body is the next cond
        else_g, outer = Graph(), ctx.g
        else_g.inputs = [Value(v.type) for v in ins]
        ctx.g = else_g
        try:
            out = _choose(ctx, branches, else_g.inputs, first + 1)
        finally:
            ctx.g = outer
        else_g.outputs = out if isinstance(out, list) else [out]
    pred = ctx.add("le", [ins[0], ctx.scalar(first, ins[0].dtype)])
    return ctx.add("cond", [pred] + list(ins), {"then_graph": then_g, "else_graph": else_g})


@handles("cond")
def _cond(ctx, index, *ops, branches, **params):
    if index.type.rank:
        raise Unsupported("a branch index that is not a scalar")
    if len(branches) < 2:
        raise Unsupported("a switch with one branch")
    out = _choose(ctx, list(branches), [ctx.cast(index, "int32")] + list(ops), 0)
    return tuple(out) if isinstance(out, list) else (out,)


@handles("scan")
def _scan(ctx, *ops, jaxpr, num_consts, num_carry, length, reverse=False, **params):
    """consts, carry, xs -> (final carry, ys stacked along axis 0): the body inlined once per step."""
    if length > MAX_SCAN:
        raise Unsupported(f"a scan of {length} steps (cuvil unrolls up to {MAX_SCAN})")
    consts, carry, xs = list(ops[:num_consts]), list(ops[num_consts:num_consts + num_carry]), ops[num_consts + num_carry:]
    ys = [None] * length
    for t in (range(length - 1, -1, -1) if reverse else range(length)):
        x_t = [ctx.reshape(ctx.add("slice", [x], {"axis": 0, "start": t, "step": 1, "length": 1}), x.shape[1:])
               for x in xs]
        outs = ctx.inline(jaxpr, consts + carry + x_t)
        if any(not hasattr(o, "type") for o in outs):       # MISSING: the cause was recorded where it arose
            raise Unsupported("its body holds what is reported above")
        carry, ys[t] = outs[:num_carry], outs[num_carry:]
    stacked = []
    for k in range(len(ys[0]) if length else 0):
        rows = [ctx.reshape(y[k], (1,) + tuple(y[k].shape)) for y in ys]
        stacked.append(rows[0] if length == 1 else ctx.add("concat", rows, {"axis": 0}))
    if not length:
        raise Unsupported("a scan of zero steps")
    return tuple(carry) + tuple(stacked)
