"""Reducing jaxpr primitives -> IR: reductions over axes, argmax / argmin, cumulative sums and products,
sort (one key) and top_k, the last two through the IR's stable topk."""
from __future__ import annotations

from .jax_registry import HANDLERS, Unsupported, handles

# reduce_and / reduce_or of bools are their min / max
REDUCE = {"reduce_sum": "reduce_sum", "reduce_max": "reduce_max", "reduce_min": "reduce_min",
          "reduce_prod": "reduce_prod", "reduce_and": "reduce_min", "reduce_or": "reduce_max"}


def _reduce(op):
    def h(ctx, x, *, axes, **_):
        if not axes:
            return x
        if x.dtype == "bool":            # the C reductions take numbers: 0 / 1 bytes, then back
            y = ctx.add(op, [ctx.cast(x, "uint8")], {"axes": list(axes), "keepdims": False})
            return ctx.cast(y, "bool")
        return ctx.add(op, [x], {"axes": list(axes), "keepdims": False})
    return h


for _name, _op in REDUCE.items():
    HANDLERS[_name] = _reduce(_op)


@handles("argmax", "argmin")
def _argmax(ctx, x, *, axes, **_):
    op = "argmax" if ctx.eqn.primitive.name == "argmax" else "argmin"
    return ctx.cast(ctx.add(op, [x], {"axis": axes[0], "keepdims": False}), ctx.out().dtype)


@handles("cumsum", "cumprod")
def _cumulative(ctx, x, *, axis, reverse=False, **_):
    return ctx.add(ctx.eqn.primitive.name, [x], {"axis": axis, "reverse": bool(reverse)})


@handles("sort")
def _sort(ctx, keys, *others, dimension, num_keys=1, **_):
    """Ascending along dimension, stable, NaNs last (topk's order); the other operands follow the keys."""
    if num_keys != 1:
        raise Unsupported(f"sorting by {num_keys} keys")
    if keys.dtype == "bool":
        raise Unsupported("sorting bools")
    values, order = ctx.add("topk", [keys], {"k": keys.shape[dimension], "axis": dimension, "largest": False,
                                             "sorted": True})
    return (values, *(ctx.add("gather_elements", [x, order], {"axis": dimension}) for x in others))


@handles("top_k")
def _top_k(ctx, x, *, k, axis=-1, **_):
    values, order = ctx.add("topk", [x], {"k": k, "axis": axis % x.type.rank, "largest": True, "sorted": True})
    return values, ctx.cast(order, ctx.out(1).dtype)
