"""Pointwise jaxpr primitives -> IR: a table row per unary and binary primitive that has an IR op of
its own, a handler for the rest (integer_pow, select_n, clamp, round, casts, logic on bools vs ints).
jaxpr operands of a binary primitive share one dtype already (jax promotes before it traces); a scalar
literal beside an array broadcasts as numpy does, as the IR's binary ops do."""
from __future__ import annotations

import numpy as np

from .jax_registry import HANDLERS, Unsupported, handles

UNARY = {
    "neg": "neg", "abs": "abs", "sign": "sign", "exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p",
    "expm1": "expm1", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh", "logistic": "sigmoid", "erf": "erf",
    "erfc": "erfc", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "lgamma": "lgamma",
    "floor": "floor", "ceil": "ceil",
    "digamma": "digamma", "erf_inv": "erfinv", "bessel_i0e": "i0e", "bessel_i1e": "i1e",
}
BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "max", "min": "min", "atan2": "atan2",
    "rem": "fmod",          # lax.rem is C's fmod: the result has the dividend's sign
    "nextafter": "nextafter", "igamma": "igamma", "igammac": "igammac", "zeta": "zeta",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
}
# the same primitive is logic on bools and bit arithmetic on integers
LOGICAL = {"and": ("and", "bitwise_and"), "or": ("or", "bitwise_or"), "xor": ("xor", "bitwise_xor")}
# values pass through unchanged at inference (gradient and scheduling markers)
IDENTITY = ("copy", "copy_p", "stop_gradient", "optimization_barrier")


def _unary(op):
    return lambda ctx, x, **_: ctx.add(op, [x])


def _binary(op):
    return lambda ctx, a, b, **_: ctx.add(op, [a, b])


def _logical(ops):
    return lambda ctx, a, b, **_: ctx.add(ops[a.dtype != "bool"], [a, b])


for _name, _op in UNARY.items():
    HANDLERS[_name] = _unary(_op)
for _name, _op in BINARY.items():
    HANDLERS[_name] = _binary(_op)
for _name, _ops in LOGICAL.items():
    HANDLERS[_name] = _logical(_ops)


@handles(*IDENTITY)
def _identity(ctx, *xs, **_):
    return xs if len(xs) > 1 else xs[0]


@handles("not")
def _not(ctx, x, **_):
    return ctx.add("not" if x.dtype == "bool" else "bitwise_not", [x])


@handles("square")
def _square(ctx, x, **_):
    return ctx.add("mul", [x, x])


@handles("pow")
def _pow(ctx, x, y, **_):
    return ctx.add("pow", [x, ctx.cast(y, x.dtype)])      # lax.pow takes an integer exponent for a float base


@handles("integer_pow")
def _integer_pow(ctx, x, *, y, **_):
    """x ** y by repeated squaring, as XLA computes it (exact for integers, no libm pow)."""
    if y == 0:
        return ctx.expand(ctx.scalar(1, x.dtype), x.shape)
    acc, base, n = None, x, abs(y)
    while n:
        if n & 1:
            acc = base if acc is None else ctx.add("mul", [acc, base])
        n >>= 1
        if n:
            base = ctx.add("mul", [base, base])
    return acc if y > 0 else ctx.add("div", [ctx.scalar(1, x.dtype), acc])


@handles("is_finite")
def _is_finite(ctx, x, **_):
    return ctx.add("not", [ctx.add("or", [ctx.add("isnan", [x]), ctx.add("isinf", [x])])])


@handles("round")
def _round(ctx, x, *, rounding_method=0, **_):
    """rounding_method 1 rounds half to even (jnp.round), 0 half away from zero (lax.round's default)."""
    if int(rounding_method) == 1:
        return ctx.add("round", [x])
    half_up = ctx.add("floor", [ctx.add("add", [ctx.add("abs", [x]), ctx.scalar(0.5, x.dtype)])])
    return ctx.add("mul", [ctx.add("sign", [x]), half_up])


@handles("convert_element_type")
def _convert(ctx, x, **_):
    return ctx.cast(x, ctx.out().dtype)


@handles("select_n")
def _select_n(ctx, pred, *cases):
    """cases[pred]: a bool predicate picks cases[1] where true; an integer one is compared with each index."""
    if pred.dtype == "bool":
        return ctx.add("where", [pred, cases[1], cases[0]]) if len(cases) == 2 else cases[0]
    out = cases[0]
    for i, case in enumerate(cases[1:], 1):
        out = ctx.add("where", [ctx.add("eq", [pred, ctx.scalar(i, pred.dtype)]), case, out])
    return out


@handles("clamp")
def _clamp(ctx, lo, x, hi):
    """One clip where both bounds are known scalars (it fuses as an epilogue), else max then min."""
    lo_k, hi_k = ctx.known(lo), ctx.known(hi)
    if lo_k is not None and hi_k is not None and lo_k.ndim == hi_k.ndim == 0:
        return ctx.add("clip", [x], {"min": lo_k.item(), "max": hi_k.item()})
    return ctx.add("min", [ctx.add("max", [x, lo]), hi])


@handles("reduce_precision")
def _reduce_precision(ctx, x, *, exponent_bits, mantissa_bits, **_):
    """The identity when the bits are the dtype's own; rounding to a narrower format is not expressed."""
    info = np.finfo(x.dtype)
    if (exponent_bits, mantissa_bits) != (info.nexp, info.nmant):
        raise Unsupported(f"rounding {x.dtype} to {exponent_bits} exponent / {mantissa_bits} mantissa bits")
    return x
