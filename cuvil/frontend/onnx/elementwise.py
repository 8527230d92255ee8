"""Pointwise op handlers.

Unary and binary arithmetic, comparisons and logic (with the opset < 7 `broadcast` attribute), variadic
Max / Min / Sum / Mean, Where, the activations (LeakyRelu ... Gelu, PRelu), IsInf, Clip, Identity,
Dropout at inference, Cast / CastLike / BitCast, ai.onnx.ml Binarizer, and the bitwise ops declared in
ir/ops/bitwise.py."""
from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from .helpers import Unsupported, dtype_of, norm_axis, rank_of, shape_of
from .model import ONNX_DTYPES
from .registry import handler


# ---- pointwise ------------------------------------------------------------------------------------
UNARY = {"Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
         "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh",
         "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Tanh": "tanh", "Erf": "erf",
         "Sigmoid": "sigmoid", "Relu": "relu", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign",
         "Not": "not", "IsNaN": "isnan", "Softplus": "softplus"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "eq", "Less": "lt", "Greater": "gt",
          "LessOrEqual": "le", "GreaterOrEqual": "ge", "And": "and", "Or": "or", "Xor": "xor"}


def _unary(op):
    return lambda c: c.op(op, [c.inp(0)])


for _k, _v in UNARY.items():
    handler(_k)(_unary(_v))


def _binary(op):
    def h(c):
        a, b = c.inp(0), c.inp(1)
        if dtype_of(a) != dtype_of(b):
            raise ShapeError(f"operand dtypes differ ({dtype_of(a)} vs {dtype_of(b)})")
        if c.opset < 7 and c.attr("broadcast", 0):
            b = _legacy_broadcast(c, a, b)
        return c.op(op, [a, b])
    return h


def _legacy_broadcast(c, a, b):
    axis = c.attr("axis", None)
    ra, rb = rank_of(a), rank_of(b)
    if axis is None or rb == 0:
        return b
    axis = norm_axis(axis, ra)
    return c.reshape(b, tuple(shape_of(b)) + (1,) * (ra - axis - rb))


for _k, _v in BINARY.items():
    handler(_k)(_binary(_v))


@handler("Pow")
def _pow(c):
    a, b = c.inp(0), c.inp(1)
    return c.op("pow", [a, c.cast(b, dtype_of(a))])


@handler("Mod")
def _mod(c):
    a, b = c.inp(0), c.inp(1)
    fm = c.attr("fmod", 0)
    return c.op("fmod" if fm else "mod", [a, b])


def _variadic(op):
    def h(c):
        xs = [c.inp(i) for i in range(len(c.node.input))]
        acc = xs[0]
        if len(xs) == 1:
            return c.op("add", [acc, c.scalar(0, dtype_of(acc))]) if op == "add" else \
                c.op("max", [acc, acc])
        for x in xs[1:]:
            acc = c.op(op, [acc, x])
        return acc
    return h


handler("Max")(_variadic("max"))
handler("Min")(_variadic("min"))
handler("Sum")(_variadic("add"))


@handler("Mean")
def _mean(c):
    xs = [c.inp(i) for i in range(len(c.node.input))]
    acc = xs[0]
    for x in xs[1:]:
        acc = c.op("add", [acc, x])
    return c.op("div", [acc, c.scalar(len(xs), dtype_of(acc))])


@handler("Where")
def _where(c):
    return c.op("where", [c.inp(0), c.inp(1), c.inp(2)])


@handler("LeakyRelu")
def _leaky(c):
    return c.op("leaky_relu", [c.inp(0)], alpha=c.attr("alpha", 0.01))


@handler("Elu")
def _elu(c):
    return c.op("elu", [c.inp(0)], alpha=c.attr("alpha", 1.0))


@handler("HardSigmoid")
def _hsig(c):
    return c.op("hardsigmoid", [c.inp(0)], alpha=c.attr("alpha", 0.2), beta=c.attr("beta", 0.5))


@handler("HardSwish")
def _hswish(c):
    x = c.inp(0)
    return c.op("mul", [x, c.op("hardsigmoid", [x], alpha=1 / 6, beta=0.5)])


@handler("Selu")
def _selu(c):
    x = c.inp(0)
    a, g = c.attr("alpha", 1.67326319217681884765625), c.attr("gamma", 1.05070102214813232421875)
    dt = dtype_of(x)
    e = c.op("mul", [c.op("elu", [x], alpha=a), c.scalar(g, dt)])
    return e


@handler("Celu")
def _celu(c):
    x = c.inp(0)
    a = c.attr("alpha", 1.0)
    dt = dtype_of(x)
    xs = c.op("div", [x, c.scalar(a, dt)])
    return c.op("mul", [c.op("elu", [xs], alpha=1.0), c.scalar(a, dt)])


@handler("ThresholdedRelu")
def _trelu(c):
    x = c.inp(0)
    dt = dtype_of(x)
    return c.op("where", [c.op("gt", [x, c.scalar(c.attr("alpha", 1.0), dt)]), x, c.scalar(0, dt)])


@handler("Softsign")
def _softsign(c):
    x = c.inp(0)
    return c.op("div", [x, c.op("add", [c.op("abs", [x]), c.scalar(1, dtype_of(x))])])


@handler("Mish")
def _mish(c):
    x = c.inp(0)
    return c.op("mul", [x, c.op("tanh", [c.op("softplus", [x])])])


@handler("Swish")
def _swish(c):
    x = c.inp(0)
    a = c.attr("alpha", 1.0)
    if a == 1.0:
        return c.op("silu", [x])
    return c.op("mul", [x, c.op("sigmoid", [c.op("mul", [x, c.scalar(a, dtype_of(x))])])])


@handler("Gelu")
def _gelu(c):
    return c.op("gelu_tanh" if c.attr("approximate", "none") == "tanh" else "gelu", [c.inp(0)])


@handler("Shrink")
def _shrink(c):
    x = c.inp(0)
    dt = dtype_of(x)
    lam, bias = c.attr("lambd", 0.5), c.attr("bias", 0.0)
    lo = c.op("where", [c.op("lt", [x, c.scalar(-lam, dt)]), c.op("add", [x, c.scalar(bias, dt)]), c.scalar(0, dt)])
    return c.op("where", [c.op("gt", [x, c.scalar(lam, dt)]), c.op("sub", [x, c.scalar(bias, dt)]), lo])


@handler("PRelu")
def _prelu(c):
    x, s = c.inp(0), c.inp(1)
    dt = dtype_of(x)
    if c.opset < 7:
        s = _unidir(c, s, rank_of(x))
    return c.op("where", [c.op("lt", [x, c.scalar(0, dt)]), c.op("mul", [x, s]), x])


def _unidir(c, s, r):
    return s


@handler("IsInf")
def _isinf(c):
    x = c.inp(0)
    dt = dtype_of(x)
    pos, neg = c.attr("detect_positive", 1), c.attr("detect_negative", 1)
    inf = c.op("isinf", [x])
    if pos and neg:
        return inf
    if not pos and not neg:
        return c.op("and", [inf, c.scalar(False, "bool")])
    side = c.op("gt" if pos else "lt", [x, c.scalar(0, dt)])
    return c.op("and", [inf, side])


@handler("Clip")
def _clip(c):
    x = c.inp(0)
    dt = dtype_of(x)
    if c.opset < 11:
        lo, hi = c.attr("min", -math.inf), c.attr("max", math.inf)
        return c.op("clip", [x], min=lo, max=hi)
    lo, hi = c.inp(1), c.inp(2)
    if (lo is None or isinstance(lo, np.ndarray)) and (hi is None or isinstance(hi, np.ndarray)):
        lv = -math.inf if lo is None else lo.item()
        hv = math.inf if hi is None else hi.item()
        if not dt.startswith(("float", "bfloat")):
            lv, hv = (int(lv) if lo is not None else -2**63), (int(hv) if hi is not None else 2**63 - 1)
        return c.op("clip", [x], min=lv, max=hv)
    y = x
    if lo is not None:
        y = c.op("max", [y, lo])
    if hi is not None:
        y = c.op("min", [y, hi])
    return y


@handler("Identity")
def _identity(c):
    return c.inp(0)


@handler("Dropout")
def _dropout(c):
    x = c.inp(0)
    if c.opset >= 12:
        t = c.inp(2)
        if t is not None:
            tk = c.known(2, "training_mode")
            ratio = c.known(1, "ratio") if c.inp(1) is not None else np.array(0.5)
            if bool(np.asarray(tk)) and float(np.asarray(ratio)) != 0.0:
                raise Unsupported("training_mode=True with a nonzero ratio (random)")
    elif c.opset < 7 and c.attr("is_test", 0) == 0:
        pass
    outs = [x]
    if len(c.node.output) > 1 and c.node.output[1]:
        outs.append(np.ones(1, bool) if False else c.op("full", [], shape=shape_of(x), value=1, dtype="bool"))
    return outs


@handler("Cast")
def _cast(c):
    to = c.attr("to")
    if to not in ONNX_DTYPES:
        raise Unsupported(f"cast to dtype {to}")
    x = c.inp(0)
    if dtype_of(x) == ONNX_DTYPES[to]:
        return x
    return c.op("cast", [x], to=ONNX_DTYPES[to], saturate=bool(c.attr("saturate", 1)))


@handler("CastLike")
def _castlike(c):
    x, t = c.inp(0), c.inp(1)
    return x if dtype_of(x) == dtype_of(t) else c.op("cast", [x], to=dtype_of(t), saturate=bool(c.attr("saturate", 1)))


@handler("BitCast")
def _bitcast(c):
    to = c.attr("to")
    if to not in ONNX_DTYPES:
        raise Unsupported(f"bitcast to dtype {to}")
    x = c.inp(0)
    if np.dtype(dtype_of(x)).itemsize != np.dtype(ONNX_DTYPES[to]).itemsize:
        raise Unsupported("bitcast between dtypes of different sizes")
    return c.op("bitcast", [x], to=ONNX_DTYPES[to])


@handler("ai.onnx.ml:Binarizer")
def _binarizer(c):
    x = c.inp(0)
    dt = dtype_of(x)
    return c.cast(c.op("gt", [x, c.scalar(c.attr("threshold", 0.0), dt)]), dt)


# ---- bitwise ops (declared in ir/ops/bitwise.py) ----------------------------------------------------
def _bitop(op):
    return lambda c: c.op(op, [c.inp(0), c.inp(1)])


handler("BitwiseAnd")(_bitop("bitwise_and"))
handler("BitwiseOr")(_bitop("bitwise_or"))
handler("BitwiseXor")(_bitop("bitwise_xor"))


@handler("BitwiseNot")
def _bitnot(c):
    return c.op("bitwise_not", [c.inp(0)])


@handler("BitShift")
def _bitshift(c):
    d = c.attr("direction")
    return c.op("shift_left" if d == "LEFT" else "shift_right", [c.inp(0), c.inp(1)])
