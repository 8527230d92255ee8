"""Shape-value op handlers and the folders of symbolic shape arithmetic.

Shape, Size, Constant, ConstantOfShape, Reshape, Flatten, Squeeze / Unsqueeze, Transpose, Expand,
Concat, Split and Range. The symbolic folders evaluate Add / Sub / Mul / Div, Cast, Identity, Equal,
Max / Min and Where over compile-time shape vectors that may hold symbolic dims, so that
Shape -> Gather -> Concat -> Reshape chains give static or symbolic attributes."""
from __future__ import annotations

import math

import numpy as np
import sympy

from ...errors import ShapeError
from ...ir import dims as D
from ...ir.ops._shape import broadcast
from .helpers import (Unsupported, contig, ints, is_sym, maybe_int, norm_axis, rank_of, shape_of, sym_array, to_dim,
                      transpose)
from .model import ONNX_DTYPES, tensor_to_numpy
from .registry import handler, symfold


# ---- shape values ---------------------------------------------------------------------------------
@handler("Shape")
@symfold("Shape")
def _shape(c, ins=None):
    x = c.inp(0)
    sh = list(shape_of(x))
    r = len(sh)
    start, end = c.attr("start", 0), c.attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return sym_array(sh[start:end])


@handler("Size")
@symfold("Size")
def _size(c, ins=None):
    return sym_array([D.numel(shape_of(c.inp(0)))], shape=())


@handler("Constant")
def _constant(c):
    for a in c.node.attribute:
        if a.name == "value":
            return tensor_to_numpy(a.t, f"{c.loc} value")
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
        if a.name == "value_int":
            return np.array(a.i, np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), np.int64)
        if a.name in ("value_string", "value_strings"):
            raise Unsupported("string constants")
        if a.name == "sparse_value":
            raise Unsupported("sparse constants")
    raise ShapeError("Constant node without a value")


@handler("ConstantOfShape")
@symfold("ConstantOfShape")
def _cos(c, ins=None):
    shape = c.known(0, "shape")
    t = c.attr("value")
    v = tensor_to_numpy(t, "value") if t is not None else np.zeros(1, np.float32)
    shape = [to_dim(d) for d in np.asarray(shape).ravel()]
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ShapeError(f"negative dim in {shape}")
    if all(isinstance(d, int) for d in shape) and math.prod(shape) <= 4096:
        return np.full(shape, v.ravel()[0], dtype=v.dtype)
    return c.op("full", [], shape=tuple(shape), value=v.ravel()[0].item(), dtype=str(v.dtype))


def _shape_input(c, i):
    s = c.known(i, "shape")
    return [to_dim(d) for d in np.asarray(s).ravel()]


@handler("Reshape")
@symfold("Reshape")
def _reshape(c, ins=None):
    x = c.inp(0)
    if c.opset < 5:
        target = c.attr("shape")
    else:
        target = _shape_input(c, 1)
    allowzero = c.attr("allowzero", 0)
    sh = shape_of(x)
    out = []
    for i, d in enumerate(target):
        if isinstance(d, int) and d == 0 and not allowzero:
            out.append(sh[i])
        else:
            out.append(d)
    neg = [i for i, d in enumerate(out) if isinstance(d, int) and d == -1]
    if len(neg) > 1:
        raise ShapeError(f"reshape target {target} has more than one -1")
    if neg:
        rest = D.numel([d for i, d in enumerate(out) if i != neg[0]])
        total = D.numel(sh)
        if isinstance(rest, int) and isinstance(total, int):
            if rest == 0 or total % rest:
                raise ShapeError(f"cannot reshape {sh} into {target}")
            out[neg[0]] = total // rest
        else:
            out[neg[0]] = D.as_dim(sympy.simplify(sympy.sympify(total) / sympy.sympify(rest)))
    if isinstance(x, np.ndarray):
        if all(isinstance(d, int) for d in out):
            return x.reshape(out)
        raise Unsupported("symbolic reshape of a known value")
    if any(isinstance(d, int) and d < 0 for d in out):
        raise ShapeError(f"invalid reshape target {target}")
    return c.op("reshape", [x], shape=tuple(out))


@handler("Flatten")
def _flatten(c):
    x = c.inp(0)
    sh = shape_of(x)
    axis = c.attr("axis", 1)
    axis = axis + len(sh) if axis < 0 else axis
    if not 0 <= axis <= len(sh):
        raise ShapeError(f"flatten axis {axis} out of range")
    return c.reshape(x, [D.numel(sh[:axis]), D.numel(sh[axis:])])


def _axes_arg(c, since, i=1):
    if c.opset >= since:
        a = c.known(i, "axes")
        return None if a is None else ints(a)
    return c.attr("axes")


@handler("Squeeze")
@symfold("Squeeze")
def _squeeze(c, ins=None):
    x = c.inp(0)
    sh = shape_of(x)
    axes = _axes_arg(c, 13)
    if axes is None:
        axes = [i for i, d in enumerate(sh) if isinstance(d, int) and d == 1]
    axes = {norm_axis(a, len(sh)) for a in axes}
    for a in axes:
        if not (isinstance(sh[a], int) and sh[a] == 1) and isinstance(sh[a], int):
            raise ShapeError(f"cannot squeeze dim {a} of size {sh[a]}")
    new = [d for i, d in enumerate(sh) if i not in axes]
    return x.reshape(new) if isinstance(x, np.ndarray) else c.reshape(x, new)


@handler("Unsqueeze")
@symfold("Unsqueeze")
def _unsqueeze(c, ins=None):
    x = c.inp(0)
    sh = list(shape_of(x))
    axes = _axes_arg(c, 13)
    r = len(sh) + len(axes)
    axes = sorted(norm_axis(a, r) for a in axes)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated axes {axes}")
    for a in axes:
        sh.insert(a, 1)
    return x.reshape(sh) if isinstance(x, np.ndarray) else c.reshape(x, sh)


@handler("Transpose")
@symfold("Transpose")
def _transpose_h(c, ins=None):
    x = c.inp(0)
    perm = c.attr("perm") or list(range(rank_of(x)))[::-1]
    return transpose(c, x, perm)


@handler("Expand")
@symfold("Expand")
def _expand(c, ins=None):
    x = c.inp(0)
    shape = _shape_input(c, 1)
    out = broadcast(tuple(shape_of(x)), tuple(shape))
    if isinstance(x, np.ndarray):
        if is_sym(x) or math.prod(int(d) for d in out) <= 4096:
            return contig(np.broadcast_to(x, tuple(int(d) for d in out)))
    if tuple(out) == tuple(shape_of(x)):
        return x
    return c.op("expand", [x], shape=tuple(out))


@handler("Concat")
@symfold("Concat")
def _concat(c, ins=None):
    xs = [c.inp(i) for i in range(len(c.node.input))]
    xs = [x for x in xs if x is not None]
    r = rank_of(xs[0])
    axis = norm_axis(c.attr("axis", 0 if c.opset < 4 else None), r)
    if all(isinstance(x, np.ndarray) for x in xs):
        if any(is_sym(x) for x in xs):
            return maybe_int(np.concatenate([x.astype(object) for x in xs], axis=axis))
        return np.concatenate(xs, axis=axis)
    xs = [x for x in xs if not (isinstance(shape_of(x)[axis], int) and shape_of(x)[axis] == 0)] or xs[:1]
    if len(xs) == 1:
        return xs[0]
    return c.op("concat", xs, axis=axis)


@handler("Split")
def _split(c):
    x = c.inp(0)
    sh = shape_of(x)
    axis = norm_axis(c.attr("axis", 0), len(sh))
    nout = len(c.node.output)
    if c.opset >= 13:
        sp = c.known(1, "split")
        sp = None if sp is None else ints(sp)
    else:
        sp = c.attr("split")
    n = sh[axis]
    if not sp:
        no = c.attr("num_outputs", nout)
        if not isinstance(n, int):
            if c.opset >= 18 and c.attr("num_outputs") is not None:
                raise Unsupported("symbolic split")
            sp = [D.as_dim(n / no)] * no
        else:
            chunk = -(-n // no)
            sp = [min(chunk, n - k * chunk) for k in range(no)]
    outs, start = [], 0
    for ln in sp:
        if isinstance(x, np.ndarray):
            outs.append(np.take(x, range(start, start + ln), axis=axis))
        else:
            outs.append(c.op("slice", [x], axis=axis, start=start, step=1, length=ln))
        start = D.as_dim(start + ln)
    return outs


@handler("Range")
def _range_h(c):
    start, limit, delta = (c.known(i, n) for i, n in enumerate(("start", "limit", "delta")))
    if is_sym(start) or is_sym(limit) or is_sym(delta):
        raise Unsupported("Range over symbolic bounds")
    n = max(int(math.ceil((limit.item() - start.item()) / delta.item())), 0)
    if n * start.itemsize > 1 << 28:
        raise ShapeError(f"Range of {n} elements is absurdly large")
    return (start.item() + delta.item() * np.arange(n)).astype(start.dtype)


# ---- symbolic folding of shape arithmetic ---------------------------------------------------------
def _sym_binary(fn):
    def f(c, ins):
        a, b = ins
        a = a.astype(object) if is_sym(a) or is_sym(b) else a
        b = b.astype(object) if is_sym(a) or is_sym(b) else b
        out = np.vectorize(lambda p, q: to_dim(fn(p, q)), otypes=[object])(a, b)
        return maybe_int(np.asarray(out, dtype=object))
    return f


def _symdiv(p, q):
    if isinstance(p, (int, np.integer)) and isinstance(q, (int, np.integer)):
        return int(p) // int(q) if (p >= 0) == (q > 0) or p % q == 0 else -(-int(p) // int(q))
    return sympy.floor(sympy.sympify(p) / sympy.sympify(q))


symfold("Add")(_sym_binary(lambda p, q: p + q))
symfold("Sub")(_sym_binary(lambda p, q: p - q))
symfold("Mul")(_sym_binary(lambda p, q: p * q))
symfold("Div")(_sym_binary(_symdiv))


@symfold("Cast")
def _sym_cast(c, ins):
    to = ONNX_DTYPES.get(c.attr("to"))
    if to in ("int64", "int32") and is_sym(ins[0]):
        return ins[0]
    if is_sym(ins[0]):
        raise Unsupported("cast of a symbolic shape")
    return None


@symfold("Identity")
def _sym_identity(c, ins):
    return ins[0]


@symfold("Equal")
def _sym_equal(c, ins):
    a, b = ins
    out = np.vectorize(lambda p, q: bool(D.dims_equal(p, q)), otypes=[bool])(a, b)
    return np.asarray(out, dtype=bool)


@symfold("Max", "Min")
def _sym_maxmin(c, ins):
    fn = max if c.node.op_type == "Max" else min
    vals = [x.astype(object) for x in ins]

    def f(p, q):
        if isinstance(p, (int, np.integer)) and isinstance(q, (int, np.integer)):
            return fn(int(p), int(q))
        if isinstance(p, (int, np.integer)) and p <= 1 and fn is max:
            return q
        if isinstance(q, (int, np.integer)) and q <= 1 and fn is max:
            return p
        raise Unsupported("symbolic max/min")
    acc = vals[0]
    for v in vals[1:]:
        acc = np.vectorize(f, otypes=[object])(acc, v)
    return maybe_int(np.asarray(acc, dtype=object))


@symfold("Where")
def _sym_where(c, ins):
    cond, a, b = ins
    if is_sym(cond):
        raise Unsupported("symbolic condition")
    return maybe_int(np.where(cond, a.astype(object), b.astype(object)))
