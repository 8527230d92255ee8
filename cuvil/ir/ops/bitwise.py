"""Integer bit ops: and, or, xor, not and shifts (ONNX's bitwise family), and bitcast, which
reinterprets each element's bits as another dtype of the same size."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ..types import TensorType
from .registry import REQUIRED, OpDef, declare
from ._shape import broadcast


def _int_only(name, t):
    if t.dtype.startswith(("float", "bfloat")) or t.dtype == "bool":   # C's ~1 is 254, not a bool: use not/and/or/xor
        raise ShapeError(f"{name} expects integer tensors, got {t.dtype}")


def _bitwise(name, fn):
    def infer(types, attrs, inputs):
        a, b = types
        _int_only(name, a)
        if a.dtype != b.dtype:
            raise ShapeError(f"{name}: operand dtypes differ ({a.dtype} vs {b.dtype})")
        return [TensorType(broadcast(a.shape, b.shape), a.dtype)]
    declare(OpDef(name, {}, infer, lambda xs, a: np.asarray(fn(xs[0], xs[1])).astype(xs[0].dtype), kind="binary"))


def _shift_left(a, b):
    bits = a.dtype.itemsize * 8
    out = np.left_shift(a, np.clip(b, 0, bits - 1).astype(a.dtype))
    return np.where((b < 0) | (b >= bits), 0, out)


def _shift_right(a, b):
    bits = a.dtype.itemsize * 8
    out = np.right_shift(a, np.clip(b, 0, bits - 1).astype(a.dtype))
    return np.where((b < 0) | (b >= bits), np.where(a < 0, -1, 0), out)   # a negative count acts as a huge one


_bitwise("bitwise_and", np.bitwise_and)
_bitwise("bitwise_or", np.bitwise_or)
_bitwise("bitwise_xor", np.bitwise_xor)
_bitwise("shift_left", _shift_left)
_bitwise("shift_right", _shift_right)


def _bitnot_infer(types, attrs, inputs):
    _int_only("bitwise_not", types[0])
    return [types[0]]


declare(OpDef("bitwise_not", {}, _bitnot_infer, lambda xs, a: np.invert(xs[0]), kind="unary"))


def _bitcast_infer(types, attrs, inputs):
    x = types[0]
    if np.dtype(x.dtype).itemsize != np.dtype(attrs["to"]).itemsize:
        raise ShapeError(f"bitcast: {x.dtype} and {attrs['to']} differ in size")
    return [TensorType(x.shape, attrs["to"])]


# reinterpret the bytes of each element as another dtype of the same size (ONNX BitCast)
declare(OpDef("bitcast", {"to": REQUIRED}, _bitcast_infer, lambda xs, a: xs[0].view(np.dtype(a["to"])), kind="movement"))
