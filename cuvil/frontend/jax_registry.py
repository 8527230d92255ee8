"""The JAX frontend's handler table: jaxpr primitive name -> handler. It imports nothing of the
frontend: the op-family modules (jax_pointwise, jax_movement, jax_reduce, jax_nn) register into it and
jax.py reads it, so neither imports the other.

A handler is called as handler(ctx, *inputs, **eqn.params) with the equation's operands as IR Values
(literals and closed-over arrays are constant Values) and returns the outputs: a Value, or a tuple of
them for a primitive with several. It reads what it needs of its equation through ctx (jax.py's Ctx):
ctx.out(i) is output i's TensorType, ctx.add / reshape / transpose / cast / scalar build IR, and
ctx.known(v) is a constant's numpy value (None when it is computed at run time)."""
from __future__ import annotations

HANDLERS: dict = {}


class Unsupported(Exception):
    """This use of a known primitive is outside what the IR expresses (the message says which part)."""


def handles(*names):
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn
    return deco
