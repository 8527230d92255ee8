"""Pointwise ops: unary, binary (numpy broadcasting), where, cast, and their numpy references."""
from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ..types import TensorType
from .registry import OpDef, declare
from ._shape import broadcast
from .special import SPECIAL_BINARY, SPECIAL_UNARY, polygamma_ref

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _lgamma_scalar(v):
    if math.isnan(v) or v == math.inf:
        return v
    if v == -math.inf or (v <= 0 and v == math.floor(v)):     # poles: C's lgamma gives +inf
        return math.inf
    return math.lgamma(v)


_lgamma = np.vectorize(_lgamma_scalar, otypes=[np.float64])


def _gelu(x):
    return (0.5 * x * (1.0 + _erf(x.astype(np.float64) / math.sqrt(2.0)))).astype(x.dtype)


def _gelu_tanh(x):
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))).astype(x.dtype)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


def _round_half_even(x):
    return np.round(x)


FLOAT_ONLY = "float"
ANY = "any"

# name -> (numpy reference, input dtypes it accepts, extra attrs with defaults)
UNARY = {
    "neg": (np.negative, ANY, {}),
    "abs": (np.abs, ANY, {}),
    "exp": (np.exp, FLOAT_ONLY, {}),
    "log": (np.log, FLOAT_ONLY, {}),
    "log1p": (np.log1p, FLOAT_ONLY, {}),
    "expm1": (np.expm1, FLOAT_ONLY, {}),
    "sqrt": (np.sqrt, FLOAT_ONLY, {}),
    "rsqrt": (lambda x: (1 / np.sqrt(x)).astype(x.dtype), FLOAT_ONLY, {}),
    "reciprocal": (lambda x: (1 / x).astype(x.dtype), FLOAT_ONLY, {}),
    "sin": (np.sin, FLOAT_ONLY, {}), "cos": (np.cos, FLOAT_ONLY, {}), "tan": (np.tan, FLOAT_ONLY, {}),
    "asin": (np.arcsin, FLOAT_ONLY, {}), "acos": (np.arccos, FLOAT_ONLY, {}), "atan": (np.arctan, FLOAT_ONLY, {}),
    "sinh": (np.sinh, FLOAT_ONLY, {}), "cosh": (np.cosh, FLOAT_ONLY, {}), "tanh": (np.tanh, FLOAT_ONLY, {}),
    "asinh": (np.arcsinh, FLOAT_ONLY, {}), "acosh": (np.arccosh, FLOAT_ONLY, {}),
    "atanh": (np.arctanh, FLOAT_ONLY, {}),
    "erf": (lambda x: _erf(x).astype(x.dtype), FLOAT_ONLY, {}),
    "erfc": (lambda x: _erfc(x).astype(x.dtype), FLOAT_ONLY, {}),
    "lgamma": (lambda x: _lgamma(x).astype(x.dtype), FLOAT_ONLY, {}),
    "exp2": (np.exp2, FLOAT_ONLY, {}),
    "log2": (np.log2, FLOAT_ONLY, {}), "log10": (np.log10, FLOAT_ONLY, {}),
    "trunc": (np.trunc, FLOAT_ONLY, {}),
    "sigmoid": (_sigmoid, FLOAT_ONLY, {}),
    "relu": (lambda x: np.maximum(x, 0).astype(x.dtype), ANY, {}),
    "relu6": (lambda x: np.clip(x, 0, 6).astype(x.dtype), FLOAT_ONLY, {}),     # MobileNets: an epilogue activation
    "gelu": (_gelu, FLOAT_ONLY, {}),
    "gelu_tanh": (_gelu_tanh, FLOAT_ONLY, {}),
    "silu": (lambda x: (x * _sigmoid(x)).astype(x.dtype), FLOAT_ONLY, {}),
    "hardswish": (lambda x: (x * np.clip(x + 3, 0, 6) / 6).astype(x.dtype), FLOAT_ONLY, {}),    # MobileNetV3
    "softplus": (lambda x: np.logaddexp(0, x).astype(x.dtype), FLOAT_ONLY, {}),
    "floor": (np.floor, FLOAT_ONLY, {}), "ceil": (np.ceil, FLOAT_ONLY, {}),
    "round": (_round_half_even, FLOAT_ONLY, {}),
    "sign": (np.sign, ANY, {}),
    "not": (np.logical_not, "bool", {}),
    "isnan": (np.isnan, FLOAT_ONLY, {}),
    "isinf": (np.isinf, FLOAT_ONLY, {}),
    "leaky_relu": (None, FLOAT_ONLY, {"alpha": 0.01}),
    "elu": (None, FLOAT_ONLY, {"alpha": 1.0}),
    "hardsigmoid": (None, FLOAT_ONLY, {"alpha": 0.2, "beta": 0.5}),
    "clip": (None, ANY, {"min": -math.inf, "max": math.inf}),
    **{name: (ref, FLOAT_ONLY, {}) for name, ref in SPECIAL_UNARY.items()},
    "polygamma": (None, FLOAT_ONLY, {"n": 0}),
}

_PARAM_REFS = {
    "leaky_relu": lambda x, a: np.where(x >= 0, x, x * a["alpha"]).astype(x.dtype),
    "elu": lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(np.minimum(x, 0))).astype(x.dtype),
    "hardsigmoid": lambda x, a: np.clip(a["alpha"] * x + a["beta"], 0, 1).astype(x.dtype),
    "clip": lambda x, a: np.clip(x, _cast_bound(a["min"], x.dtype), _cast_bound(a["max"], x.dtype)).astype(x.dtype),
    "polygamma": polygamma_ref,
}

BOOL_RESULT_UNARY = {"not", "isnan", "isinf"}


def _cast_bound(v, dtype):
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return int(max(min(v, info.max), info.min))
    return v


def _is_float(dtype):
    return dtype.startswith(("float", "bfloat"))


def _int_div(a, b):
    """C semantics: truncate toward zero (what ONNX Div and C do on integers)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
        return (q * np.sign(a) * np.sign(b)).astype(a.dtype)


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return _int_div(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (a / b).astype(a.dtype)


def _floordiv(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        if np.issubdtype(a.dtype, np.integer):   # x // 0 is 0, as numpy and as div and mod here
            return np.where(b == 0, 0, a // np.where(b == 0, 1, b)).astype(a.dtype)
        return np.floor(a / b).astype(a.dtype)


def _pow(a, b):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if np.issubdtype(a.dtype, np.integer):
            return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
        return np.power(a, b).astype(a.dtype)


def _mod(a, b):  # python / torch.remainder semantics: result has the sign of b
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mod(a, b).astype(a.dtype)


def _fmod(a, b):  # C semantics: result has the sign of a
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b).astype(a.dtype)


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "floordiv": _floordiv,
    "pow": _pow, "max": np.maximum, "min": np.minimum, "mod": _mod, "fmod": _fmod,
    "atan2": np.arctan2, "copysign": np.copysign, "hypot": np.hypot, "nextafter": np.nextafter,
    "fmax": np.fmax, "fmin": np.fmin,       # fmax / fmin: a NaN operand loses (max / min propagate it)
    **SPECIAL_BINARY,
}
FLOAT_BINARY = {"atan2", "copysign", "hypot", "nextafter", "fmax", "fmin", *SPECIAL_BINARY}
COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}
LOGICAL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _unary(name, fn, accepts, extra):
    def infer(types, attrs, inputs):
        (t,) = types
        if accepts == FLOAT_ONLY and not _is_float(t.dtype):
            raise ShapeError(f"{name} expects a float tensor, got {t.dtype}")
        if accepts == "bool" and t.dtype != "bool":
            raise ShapeError(f"{name} expects a bool tensor, got {t.dtype}")
        if accepts == ANY and t.dtype == "bool":   # numpy has no bool neg/sign; C would store non-0/1 bytes
            raise ShapeError(f"{name} expects a numeric tensor, got bool; cast it first")
        return [TensorType(t.shape, "bool" if name in BOOL_RESULT_UNARY else t.dtype)]

    if fn is None:
        pfn = _PARAM_REFS[name]

        def ref(xs, attrs):
            return pfn(xs[0], attrs)
    else:
        def ref(xs, attrs):
            with np.errstate(all="ignore"):
                r = fn(xs[0])
            return np.asarray(r).astype("bool" if name in BOOL_RESULT_UNARY else xs[0].dtype)
    declare(OpDef(name, extra, infer, ref, kind="unary"))


def _binary(name, fn, result):
    def infer(types, attrs, inputs):
        a, b = types
        if a.dtype != b.dtype:
            raise ShapeError(f"{name}: operand dtypes differ ({a.dtype} vs {b.dtype}); insert a cast")
        if result == "logical" and a.dtype != "bool":
            raise ShapeError(f"{name} expects bool operands, got {a.dtype}")
        # bool arithmetic: C would store 1 + 1 = 2 in a bool (max/min are or/and, and fine)
        if result == "same" and a.dtype == "bool" and name not in ("max", "min"):
            raise ShapeError(f"{name} expects numeric operands, got bool; use and/or/xor or cast first")
        if name in FLOAT_BINARY and not _is_float(a.dtype):
            raise ShapeError(f"{name} expects float operands, got {a.dtype}")
        return [TensorType(broadcast(a.shape, b.shape), a.dtype if result == "same" else "bool")]

    def ref(xs, attrs):
        a, b = xs
        out = fn(a, b)
        return np.asarray(out).astype(a.dtype if result == "same" else "bool")
    declare(OpDef(name, {}, infer, ref, kind="binary"))


for _n, (_f, _acc, _ex) in UNARY.items():
    _unary(_n, _f, _acc, _ex)
for _n, _f in BINARY.items():
    _binary(_n, _f, "same")
for _n, _f in COMPARE.items():
    _binary(_n, _f, "bool")
for _n, _f in LOGICAL.items():
    _binary(_n, _f, "logical")


def _where_infer(types, attrs, inputs):
    c, a, b = types
    if c.dtype != "bool":
        raise ShapeError(f"where: condition must be bool, got {c.dtype}")
    if a.dtype != b.dtype:
        raise ShapeError(f"where: branch dtypes differ ({a.dtype} vs {b.dtype})")
    return [TensorType(broadcast(c.shape, a.shape, b.shape), a.dtype)]


declare(OpDef("where", {}, _where_infer, lambda xs, a: np.where(*xs).astype(xs[1].dtype), kind="where"))


_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_LOWP_FLOAT = _FLOAT8 + ("bfloat16", "float4_e2m1fn")
_LOWP_INT = ("int4", "uint4", "int2", "uint2")


def _cast_ref(xs, attrs):
    """numpy astype, with ONNX's rules: float -> int truncates; float -> float8 saturates to the
    largest finite value unless saturate=False; float -> int4/int2 truncates and wraps."""
    x = xs[0]
    to = np.dtype(attrs["to"])
    if str(x.dtype) in _LOWP_FLOAT:
        x = x.astype(np.float32)
    elif str(x.dtype) in _LOWP_INT:
        x = x.astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        if attrs["to"] in _FLOAT8 and attrs.get("saturate", True) and x.dtype.kind == "f":
            import ml_dtypes
            info = ml_dtypes.finfo(to)
            x = np.clip(x, x.dtype.type(info.min), x.dtype.type(info.max))
        if x.dtype.kind == "f" and (np.issubdtype(to, np.integer) or attrs["to"] in _LOWP_INT):
            x = np.trunc(x)
            if attrs["to"] in _LOWP_INT:
                x = x.astype(np.int64)
        if attrs["to"] in _LOWP_INT and x.dtype.kind in "iub":
            bits = 4 if attrs["to"].endswith("4") else 2
            x = x.astype(np.int64) & ((1 << bits) - 1)
            if not attrs["to"].startswith("u"):
                x = np.where(x >= 1 << (bits - 1), x - (1 << bits), x)
        return x.astype(to)


declare(OpDef("cast", {"to": None, "saturate": True}, lambda t, a, i: [TensorType(t[0].shape, a["to"])], _cast_ref, kind="cast"))
