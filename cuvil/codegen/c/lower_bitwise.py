"""C lowering of the bit-level ops: bitwise and, or, xor, not, the shifts, and bitcast."""
from __future__ import annotations

from . import cexpr
from .ctypes_map import CTYPE
from .emit import lowering
from .loops import broadcast_strides, contiguous_strides, loop_nest

_BIT = {"bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
        "shift_left": "(({1}) < 0 || ({1}) >= (T)(8 * sizeof(T)) ? (T)0 : (T)((T){0} << {1}))",
        "shift_right": "(({1}) < 0 || ({1}) >= (T)(8 * sizeof(T)) ? (T)({0} < 0 ? -1 : 0) : (T)({0} >> {1}))",
        "bitwise_not": "((T)~{0})"}


@lowering(*_BIT)
def lower_bitwise(em, node):
    out = node.outputs[0]
    shape = out.type.shape
    t = CTYPE[out.dtype]
    tmpl = _BIT[node.op].replace("(T)", f"({t})").replace("sizeof(T)", f"sizeof({t})")
    ins = [(em.ptr(v), broadcast_strides(v.type.shape, shape), "0") for v in node.inputs]

    def expr(loads):
        e = tmpl
        for k, a in enumerate(loads):
            e = e.replace("{%d}" % k, f"({a})")
        return e
    return loop_nest(shape, (em.ptr(out), contiguous_strides(shape), "0"), ins, expr, em.parallel)


@lowering("bitcast")
def lower_bitcast(em, node):
    x, y = node.inputs[0], node.outputs[0]
    return [f"if ((const void *){em.ptr(y)} != (const void *){em.ptr(x)}) memcpy({em.ptr(y)}, {em.ptr(x)}, {cexpr.buffer_bytes(x)});"]
