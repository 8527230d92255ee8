"""C expressions written once: the product of some dims (an element count), a byte count, a shape split
around an axis into (outer, n, inner) counts, and a float as a C literal."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D


def float_literal(v, suffix="") -> str:
    """A float (an attribute from a model: an epsilon, a scale, a fill value) as a C literal, infinities and
    NaN included (repr would write `inf` and `nan`, which C does not parse); suffix: "f" for a float
    constant, whose value is then the float32 nearest v (one past its range an infinity, as C would
    round it, without the compiler's overflow warning)."""
    if suffix:
        with np.errstate(over="ignore"):
            v = np.float32(v)
    v = float(v)
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return repr(v) + suffix


def prod(dims, cast="int64_t") -> str:
    """C product of dims, each cast (`(int64_t)(d) * (int64_t)(e)`; no cast when cast is None); "1" for none."""
    return " * ".join(f"({cast})({D.to_c(d)})" if cast else D.to_c(d) for d in dims) or "1"


def nbytes(dims, itemsize, cast=None) -> str:
    """C product of dims (each cast when cast is given) and the element size in bytes."""
    return " * ".join([f"({cast})({D.to_c(d)})" if cast else D.to_c(d) for d in dims] + [str(itemsize)])


def outer_n_inner(shape, axis):
    """(the product of the dims before axis, the axis's dim, the product of those after) as C."""
    return prod(shape[:axis]), D.to_c(shape[axis]), prod(shape[axis + 1:])


def buffer_bytes(v) -> str:
    """C byte count of a value's buffer: `(size_t)(<element count>) * sizeof(<C type>)`."""
    from .ctypes_map import CTYPE
    return f"(size_t)({prod(v.type.shape)}) * sizeof({CTYPE[v.dtype]})"
