"""Helpers shared by the converter and the op-family handlers.

The Unsupported / NeedsConstant signals a handler raises, the lazy import of the onnx package,
sequences and the empty optional (Seq, ABSENT), compile-time-known values (numpy arrays; object arrays
hold symbolic dims), the shape, dtype and rank
of a value, axis normalisation, ONNX padding (pads / auto_pad) and a transpose that folds known arrays."""
from __future__ import annotations

import numpy as np

from ...errors import CuvilError, ShapeError
from ...ir import dims as D
from ...ir.graph import Value
from ...ir.quant import byte_grid


class Unsupported(Exception):
    """Raised by a handler: this node (in this configuration) cannot be mapped."""


class NeedsConstant(Unsupported):
    """A shape-determining input is only known at run time."""


class Seq:
    """An ONNX sequence whose length is known at compile time: its elements (Value | np.ndarray), and
    the element dtype when known (an empty sequence's)."""

    def __init__(self, items, dtype=None):
        self.items = list(items)
        self.dtype = dtype if dtype is not None or not self.items else dtype_of(self.items[0])

    def __len__(self):
        return len(self.items)


class Absent:
    """The empty ONNX optional (None in the converter's env means a value that is missing)."""


ABSENT = Absent()


def require_onnx():
    try:
        import onnx
    except ImportError:
        raise CuvilError("compiling ONNX models needs the onnx package: pip install onnx") from None
    return onnx


# ---- compile-time-known values --------------------------------------------------------------------
def contig(a):
    a = np.asarray(a)
    return np.ascontiguousarray(a) if a.ndim else a.copy()   # ascontiguousarray makes 0-d arrays 1-d


def is_sym(a):
    return isinstance(a, np.ndarray) and a.dtype == object


def _known_dtype(a):
    return "int64" if is_sym(a) else str(a.dtype)


def to_dim(x):
    if isinstance(x, (int, np.integer)):
        return int(x)
    return D.as_dim(x)


def sym_array(vals, shape=None):
    out = np.empty(len(vals), dtype=object)
    for i, v in enumerate(vals):
        out[i] = to_dim(v)
    out = out.reshape(shape if shape is not None else (len(vals),))
    return maybe_int(out)


def maybe_int(a):
    """An object array whose entries are all ints becomes int64."""
    if is_sym(a) and all(isinstance(x, (int, np.integer)) for x in a.ravel()):
        return a.astype(np.int64)
    return a


def ints(a):
    return [int(x) for x in np.asarray(a).ravel()]


# ---- shape/type helpers ---------------------------------------------------------------------------
def shape_of(x):
    return tuple(x.shape)


def dtype_of(x):
    return x.dtype if isinstance(x, Value) else _known_dtype(x)


def rank_of(x):
    return len(shape_of(x))


def norm_axis(a, r):
    if not -r <= a < max(r, 1):
        raise ShapeError(f"axis {a} out of range for rank {r}")
    return a % r if r else 0


def _onnx_pads(pads, nsp):
    if not pads:
        return [(0, 0)] * nsp
    if len(pads) != 2 * nsp:
        raise ShapeError(f"pads {pads} do not fit {nsp} spatial dims")
    return [(int(pads[i]), int(pads[i + nsp])) for i in range(nsp)]


def auto_pad(c, in_sp, kernel, strides, dilations):
    ap = c.attr("auto_pad", "NOTSET")
    if ap in ("NOTSET", ""):
        return _onnx_pads(c.attr("pads"), len(kernel))
    if ap == "VALID":
        return [(0, 0)] * len(kernel)
    out = []
    for n, k, s, d in zip(in_sp, kernel, strides, dilations):
        if not isinstance(n, int):
            raise Unsupported("auto_pad SAME over a symbolic dim")
        o = -(-n // s)
        total = max((o - 1) * s + (k - 1) * d + 1 - n, 0)
        small = total // 2
        out.append((small, total - small) if ap == "SAME_UPPER" else (total - small, small))
    return out


def transpose(c, x, perm):
    if isinstance(x, np.ndarray):
        return contig(np.transpose(x, perm))
    if tuple(perm) == tuple(range(len(perm))):
        return x
    return c.op("transpose", [x], perm=tuple(perm))


_BYTE_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def dequantized_range(c, name):
    """[lo, hi] of the values a per-tensor 8-bit DequantizeLinear writing `name` gives ((q - zp) * scale
    over q's range), or None: a QDQ model's conv or matmul input, which precision="int8" then maps onto bytes over
    exactly that grid, so its integer conv reads the model's own quantized values (passes/quantize.py)."""
    p = c.producer(name)
    if p is None or p.op_type != "DequantizeLinear" or len(p.input) < 2:
        return None
    q, scale = c.env.get(p.input[0]), c.env.get(p.input[1])
    zp = c.env.get(p.input[2]) if len(p.input) > 2 and p.input[2] else np.zeros(1, np.uint8)
    if q is None or dtype_of(q) not in _BYTE_RANGES or not isinstance(scale, np.ndarray) or scale.size != 1 \
            or not isinstance(zp, np.ndarray) or zp.size != 1:
        return None
    return byte_grid(scale.reshape(()), zp.reshape(()), *_BYTE_RANGES[dtype_of(q)])
