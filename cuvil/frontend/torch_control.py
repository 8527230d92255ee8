"""torch.cond and torch.while_loop, the higher-order ops of an exported graph, -> the IR's cond and
while_loop regions (ir/ops/control.py). Their subgraphs are converted by torch.py's convert_region,
handed in by register() (torch.py imports this module, not the other way round)."""
from __future__ import annotations

import torch

from ..ir.graph import Value
from . import aten


def _as_value(ctx, v):
    if isinstance(v, Value):
        return v
    if isinstance(v, (bool, int, float)):
        return ctx.scalar(v, "bool" if isinstance(v, bool) else "int64" if isinstance(v, int) else "float32")
    raise aten.Unsupported(f"an operand of type {type(v).__name__}")


def _flag(ctx, pred):
    """The predicate as a bool of one element."""
    p = _as_value(ctx, pred)
    if p.dtype != "bool":
        p = ctx.add("ne", [p, ctx.scalar(0, p.dtype)])
    return p


def register(convert_region):
    def cond(ctx, pred, true_gm, false_gm, operands):
        operands = list(operands)
        as_input = [isinstance(v, Value) and not v.is_const for v in operands]
        then_g, taken = convert_region(ctx, true_gm, operands, as_input)
        else_g, _ = convert_region(ctx, false_gm, operands, as_input)
        out = ctx.add("cond", [_flag(ctx, pred), *taken], {"then_graph": then_g, "else_graph": else_g})
        return tuple(out) if isinstance(out, list) else (out,)

    def while_loop(ctx, cond_gm, body_gm, carried, additional=()):
        carried = [_as_value(ctx, v) for v in carried]
        additional = list(additional)
        as_input = [True] * len(carried) + [isinstance(v, Value) and not v.is_const for v in additional]
        operands = carried + additional
        cond_g, taken = convert_region(ctx, cond_gm, operands, as_input)
        body_g, _ = convert_region(ctx, body_gm, operands, as_input)
        out = ctx.add("while_loop", taken, {"cond_graph": cond_g, "body_graph": body_g, "carried": len(carried)})
        return tuple(out) if isinstance(out, list) else (out,)

    aten.HANDLERS[torch.ops.higher_order.cond] = cond
    aten.HANDLERS[torch.ops.higher_order.while_loop] = while_loop
