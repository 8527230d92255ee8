"""Core ATen -> cuvil IR, one small handler per ATen op (or a table row for pointwise ones)."""
from __future__ import annotations

import math
import operator

import numpy as np
import torch

from ..ir import dims as D
from ..ir.graph import Value
from .conv_patches import patches_transposed
from .torch_dtypes import dtype_of

aten = torch.ops.aten
HANDLERS: dict = {}


class Unsupported(Exception):
    """This use of a known ATen op is outside what the IR expresses."""


def static_sizes(why):
    """A check of sizes a handler needs at compile time: raises Unsupported(why) unless all are ints."""
    def check(*dims):
        if not all(isinstance(d, int) for d in dims):
            raise Unsupported(why)
    return check


def handles(*targets, table=None):
    """Targets: ATen overloads, or "namespace::op" names of custom ops that exist only once their
    library is imported (transformers'). table: where to register (HANDLERS unless given)."""
    def deco(fn):
        for t in targets:
            (HANDLERS if table is None else table)[t] = fn
        return fn
    return deco


def handler_for(target):
    """The handler of an exported graph's call target (an overload, or a custom op by its name)."""
    found = HANDLERS.get(target)
    if found is None and hasattr(target, "_schema"):
        found = HANDLERS.get(target._schema.name)
    return found


def _static_axis(x, dim, what) -> tuple:
    """(dim as an axis of x, its static size); Unsupported naming `what` where the size is symbolic."""
    axis = dim % x.type.rank
    n = x.shape[axis]
    if not isinstance(n, int):
        raise Unsupported(f"{what} along a symbolic dim")
    return axis, n


def outputs_read(ctx) -> set:
    """The indices of the current node's tuple outputs that some node reads."""
    return {u.args[1] for u in ctx.node.users if u.target is operator.getitem and u.users}


def _out_dtype(ctx):
    return dtype_of(ctx.node.meta["val"].dtype)


def _promote(*xs):
    """Dtype of a computation over tensors and python scalars (torch's rules, simplified)."""
    ts = [x.dtype for x in xs if isinstance(x, Value)]
    if any(t.startswith("float") for t in ts):
        return max((t for t in ts if t.startswith("float")), key=lambda t: np.dtype(t).itemsize)
    if any(isinstance(x, float) for x in xs):
        return "float32"
    if ts and all(t == "bool" for t in ts) and all(isinstance(x, (Value, bool)) for x in xs):
        return "bool"
    ints = [t for t in ts if t != "bool"]
    return max(ints, key=lambda t: np.dtype(t).itemsize) if ints else "int64"


# ---- pointwise ------------------------------------------------------------------------------
UNARY = {
    aten.abs.default: "abs", aten.neg.default: "neg", aten.exp.default: "exp", aten.log.default: "log",
    aten.log1p.default: "log1p", aten.expm1.default: "expm1", aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt", aten.reciprocal.default: "reciprocal", aten.sin.default: "sin",
    aten.cos.default: "cos", aten.tan.default: "tan", aten.asin.default: "asin", aten.acos.default: "acos",
    aten.atan.default: "atan", aten.sinh.default: "sinh", aten.cosh.default: "cosh", aten.tanh.default: "tanh",
    aten.asinh.default: "asinh", aten.acosh.default: "acosh", aten.atanh.default: "atanh", aten.erf.default: "erf",
    aten.sigmoid.default: "sigmoid", aten.relu.default: "relu", aten.floor.default: "floor",
    aten.ceil.default: "ceil", aten.round.default: "round", aten.sign.default: "sign",
    aten.isnan.default: "isnan", aten.isinf.default: "isinf", aten.silu.default: "silu",
    aten.erfc.default: "erfc", aten.lgamma.default: "lgamma", aten.exp2.default: "exp2", aten.trunc.default: "trunc",
    aten.log2.default: "log2", aten.log10.default: "log10",
    # special functions (ir/ops/special.py)
    aten.erfinv.default: "erfinv", aten.digamma.default: "digamma", aten.i0.default: "i0",
    aten.special_i0e.default: "i0e", aten.special_i1.default: "i1", aten.special_i1e.default: "i1e",
    aten.special_ndtri.default: "ndtri", aten.special_log_ndtr.default: "log_ndtr", aten.special_erfcx.default: "erfcx",
    aten.special_modified_bessel_i0.default: "i0", aten.special_modified_bessel_i1.default: "i1",
    aten.special_modified_bessel_k0.default: "k0", aten.special_modified_bessel_k1.default: "k1",
    aten.special_scaled_modified_bessel_k0.default: "k0e", aten.special_scaled_modified_bessel_k1.default: "k1e",
    aten.special_bessel_j0.default: "j0", aten.special_bessel_j1.default: "j1",
    aten.special_bessel_y0.default: "y0", aten.special_bessel_y1.default: "y1",
    aten.special_spherical_bessel_j0.default: "spherical_j0", aten.special_airy_ai.default: "airy_ai",
}


def _unary(op):
    def h(ctx, x):
        out = _out_dtype(ctx)
        if out.startswith("float"):
            x = ctx.tensor(x, out)
        return ctx.add(op, [x])
    return h


for _t, _op in UNARY.items():
    HANDLERS[_t] = _unary(_op)

BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "max", "minimum": "min",
    "fmod": "fmod", "remainder": "mod", "atan2": "atan2", "pow": "pow", "copysign": "copysign", "hypot": "hypot",
    "nextafter": "nextafter", "fmax": "fmax", "fmin": "fmin",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "logical_and": "and", "logical_or": "or", "logical_xor": "xor",
    "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor",
    "special_zeta": "zeta", "igamma": "igamma", "igammac": "igammac",
    **{f"special_{k}_polynomial_{p}": f"{k}_{p}_polynomial" for k, ps in (
        ("chebyshev", "tuvw"), ("hermite", ("h", "he")), ("laguerre", "l"), ("legendre", "p")) for p in ps},
    **{f"special_shifted_chebyshev_polynomial_{p}": f"shifted_chebyshev_{p}_polynomial" for p in "tuvw"},
}
COMPARES = {"eq", "ne", "lt", "le", "gt", "ge"}
LOGICALS = {"and", "or", "xor"}


def _binary(op):
    def h(ctx, a, b, alpha=1, rounding_mode=None):
        out = _out_dtype(ctx)
        if op in COMPARES:
            dt = _promote(a, b)
        elif op in LOGICALS:
            if out != "bool":
                raise Unsupported("bitwise ops on integers")
            dt = "bool"
            a, b = (ctx.add("ne", [ctx.tensor(x, _promote(x)), ctx.tensor(0, _promote(x))])
                    if isinstance(x, Value) and x.dtype != "bool" else x for x in (a, b))
        else:
            dt = out
        if op == "div" and rounding_mode is not None:
            if rounding_mode == "floor":
                return ctx.add("floordiv", [ctx.tensor(a, dt), ctx.tensor(b, dt)])
            q = ctx.add("div", [ctx.tensor(a, dt), ctx.tensor(b, dt)])
            return q if not dt.startswith("float") else ctx.add("cast", [ctx.add("cast", [q], {"to": "int64"})],
                                                                  {"to": dt})
        if op == "div" and not out.startswith("float"):
            raise Unsupported("integer true division")
        if dt == "bool" and op in BOOL_ARITHMETIC:       # torch computes these on bools as logic
            return ctx.add(BOOL_ARITHMETIC[op], [ctx.tensor(a, dt), ctx.tensor(b, dt)])
        if alpha != 1:
            b = ctx.add("mul", [ctx.tensor(b, dt), ctx.tensor(alpha, dt)])
        return ctx.add(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])
    return h


BOOL_ARITHMETIC = {"mul": "and", "add": "or", "max": "or", "min": "and"}


def _overloads(name):
    pkt = getattr(aten, name)
    return [getattr(pkt, o) for o in pkt.overloads() if o in
            ("Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar", "Tensor_mode", "Scalar_mode", "self",
             "self_scalar", "other_scalar", "x_scalar", "n_scalar")]


for _name, _op in BINARY.items():
    for _ov in _overloads(_name):
        HANDLERS[_ov] = _binary(_op)


@handles(aten.polygamma.default)
def _polygamma(ctx, n, x):
    """The n-th derivative of digamma (n a constant)."""
    if not isinstance(n, int) or n < 0:
        raise Unsupported(f"polygamma of order {n!r}")
    return ctx.add("polygamma", [ctx.tensor(x, _out_dtype(ctx))], {"n": n})


@handles(aten.pow.Scalar)
def _pow_scalar(ctx, a, b):
    dt = _out_dtype(ctx)
    return ctx.add("pow", [ctx.tensor(a, dt), ctx.tensor(b, dt)])


@handles(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(ctx, a, b, alpha=1):
    dt = _out_dtype(ctx)
    a = ctx.tensor(a, dt)
    if alpha != 1:
        a = ctx.add("mul", [a, ctx.tensor(alpha, dt)])
    return ctx.add("sub", [ctx.tensor(b, dt), a])


@handles(aten.logical_not.default, aten.bitwise_not.default)
def _not(ctx, x):
    if x.dtype != "bool":
        if _out_dtype(ctx) != "bool":
            raise Unsupported("bitwise not on integers")
        x = ctx.add("ne", [x, ctx.tensor(0, x.dtype)])
    return ctx.add("not", [x])


@handles(aten.where.self)
def _where(ctx, c, a, b):
    dt = _out_dtype(ctx)
    return ctx.add("where", [ctx.tensor(c, "bool"), ctx.tensor(a, dt), ctx.tensor(b, dt)])


@handles(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, x, mask, value):
    if isinstance(value, Value):
        value = ctx.tensor(value, x.dtype)
    return ctx.add("where", [mask, ctx.tensor(value, x.dtype), x])


@handles(aten.gelu.default)
def _gelu(ctx, x, approximate="none"):
    return ctx.add("gelu_tanh" if approximate == "tanh" else "gelu", [x])


@handles(aten.hardtanh.default, aten.clamp.default)
def _clamp(ctx, x, lo=None, hi=None):
    if isinstance(lo, Value) or isinstance(hi, Value):
        raise Unsupported("tensor bounds")
    return ctx.add("clip", [x], {"min": -math.inf if lo is None else lo, "max": math.inf if hi is None else hi})


@handles(aten.clamp.Tensor)
def _clamp_t(ctx, x, lo=None, hi=None):
    if lo is not None:
        x = ctx.add("max", [x, ctx.tensor(lo, x.dtype)])
    if hi is not None:
        x = ctx.add("min", [x, ctx.tensor(hi, x.dtype)])
    return x


@handles(aten.leaky_relu.default)
def _leaky(ctx, x, slope=0.01):
    return ctx.add("leaky_relu", [x], {"alpha": slope})


@handles(aten.elu.default)
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1)); SELU is its scaled form."""
    if scale == 1.0 and input_scale == 1.0:
        return ctx.add("elu", [x], {"alpha": alpha})
    c = lambda v: ctx.tensor(float(v), x.dtype)      # noqa: E731
    neg = ctx.add("mul", [ctx.add("expm1", [ctx.add("mul", [x, c(input_scale)])]), c(alpha * scale)])
    return ctx.add("where", [ctx.add("gt", [x, c(0.0)]), ctx.add("mul", [x, c(scale)]), neg])


@handles(aten.signbit.default)
def _signbit(ctx, x):
    """The sign bit: true for -0.0 and negative NaNs too (copysign carries it)."""
    if x.dtype == "bool":
        return ctx.add("ne", [x, x])
    if not x.dtype.startswith(("float", "bfloat")):
        return ctx.add("lt", [x, ctx.tensor(0, x.dtype)])
    one = ctx.add("copysign", [ctx.tensor(1.0, x.dtype), x])
    return ctx.add("lt", [one, ctx.tensor(0.0, x.dtype)])


@handles(aten.angle.default)
def _angle(ctx, x):
    """A real number's angle: pi below zero, 0 from zero up, NaN kept."""
    dt = _out_dtype(ctx)
    x = ctx.tensor(x, dt)
    y = ctx.add("where", [ctx.add("lt", [x, ctx.tensor(0.0, dt)]), ctx.tensor(math.pi, dt), ctx.tensor(0.0, dt)])
    return ctx.add("where", [ctx.add("isnan", [x]), x, y])


@handles(aten.frexp.Tensor)
def _frexp(ctx, x):
    """(mantissa in [0.5, 1) by magnitude, int32 exponent) with x = mantissa * 2 ** exponent; from
    floor(log2 |x|) + 1, corrected by one either way where log2 rounded across a power of two. Zero,
    infinities and NaN: (x, 0)."""
    c = lambda v, dt=x.dtype: ctx.tensor(v, dt)      # noqa: E731
    a = ctx.add("abs", [x])
    finite = ctx.add("and", [ctx.add("not", [ctx.add("or", [ctx.add("isinf", [x]), ctx.add("isnan", [x])])]),
                             ctx.add("ne", [x, c(0.0)])])
    safe = ctx.add("where", [finite, a, c(1.0)])
    e = ctx.add("add", [ctx.add("floor", [ctx.add("log2", [safe])]), c(1.0)])
    half = ctx.add("pow", [c(2.0), ctx.add("sub", [e, c(1.0)])])       # 2 ** (e - 1): finite up to e = 128
    m = ctx.add("mul", [ctx.add("div", [safe, half]), c(0.5)])
    up = ctx.add("ge", [m, c(1.0)])
    e = ctx.add("where", [up, ctx.add("add", [e, c(1.0)]), e])
    m = ctx.add("where", [up, ctx.add("mul", [m, c(0.5)]), m])
    down = ctx.add("lt", [m, c(0.5)])
    e = ctx.add("where", [down, ctx.add("sub", [e, c(1.0)]), e])
    m = ctx.add("where", [down, ctx.add("mul", [m, c(2.0)]), m])
    m = ctx.add("where", [finite, ctx.add("copysign", [m, x]), x])
    e = ctx.add("where", [finite, e, c(0.0)])
    return m, ctx.add("cast", [e], {"to": "int32"})


@handles(aten.ldexp.Tensor)
def _ldexp(ctx, x, e):
    """x * 2 ** e, in x's floating type (torch's result type)."""
    dt = _out_dtype(ctx)
    return ctx.add("mul", [ctx.tensor(x, dt), ctx.add("pow", [ctx.tensor(2.0, dt), ctx.tensor(e, dt)])])


@handles(aten.softplus.default)
def _softplus(ctx, x, beta=1, threshold=20):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's rule)."""
    bx = x if beta == 1 else ctx.add("mul", [x, ctx.tensor(beta, x.dtype)])
    y = ctx.add("softplus", [bx])
    if beta != 1:
        y = ctx.add("div", [y, ctx.tensor(beta, x.dtype)])
    return ctx.add("where", [ctx.add("gt", [bx, ctx.tensor(threshold, x.dtype)]), x, y])


@handles(aten.hardsigmoid.default)
def _hardsigmoid(ctx, x):
    return ctx.add("hardsigmoid", [x], {"alpha": 1 / 6, "beta": 0.5})


@handles(aten.hardswish.default)
def _hardswish(ctx, x):
    return ctx.add("hardswish", [x])


@handles(aten._to_copy.default)
def _to_copy(ctx, x, dtype=None, **kw):
    return ctx.add("cast", [x], {"to": _out_dtype(ctx)}) if isinstance(x, Value) else x


@handles(aten.copy.default)
def _copy(ctx, dst, src, non_blocking=False):
    """The functional copy_: src cast to dst's dtype and broadcast to its shape."""
    src = ctx.tensor(src, dst.dtype)
    return src if tuple(src.shape) == tuple(dst.shape) else ctx.add("expand", [src], {"shape": list(dst.shape)})


@handles(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
         aten.contiguous.default)
def _identity(ctx, x, **kw):
    return x


@handles(aten._local_scalar_dense.default)
def _item(ctx, x):
    """x.item(): the one element, as a 0-d tensor (returned as a python number where it is an output)."""
    return ctx.add("reshape", [x], {"shape": []})


@handles(aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
         aten._assert_async.msg, aten._assert_async.default)
def _assert(ctx, *a, **kw):
    """Export's checks: of shapes (settled at compile time) and, _assert_async, of values (F.one_hot's
    class range: an index outside it gives a row of zeros here, where eager raises)."""
    return None


# ---- shapes and movement ----------------------------------------------------------------
@handles(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def _view(ctx, x, shape):
    shape = [ctx.dim(d) for d in shape]
    if -1 in shape:
        known = D.numel([d for d in shape if d != -1])
        shape[shape.index(-1)] = D.as_dim(D.numel(x.shape) / known) if not isinstance(known, int) or \
            not D.shape_static(x.shape) else D.numel(x.shape) // known
    return ctx.add("reshape", [x], {"shape": shape})


@handles(aten.permute.default, aten.permute_copy.default)
def _permute(ctx, x, perm):
    return ctx.add("transpose", [x], {"perm": [p % max(x.type.rank, 1) for p in perm]})


@handles(aten.t.default)
def _t(ctx, x):
    return ctx.add("transpose", [x], {"perm": list(range(x.type.rank))[::-1]})


@handles(aten.transpose.int)
def _transpose(ctx, x, a, b):
    perm = list(range(x.type.rank))
    a, b = a % x.type.rank, b % x.type.rank
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.add("transpose", [x], {"perm": perm})


@handles(aten.expand.default)
def _expand(ctx, x, shape, implicit=False):
    shape = [ctx.dim(d) for d in shape]
    pad = len(shape) - x.type.rank
    shape = [x.shape[i - pad] if (isinstance(d, int) and d == -1) else d for i, d in enumerate(shape)]
    return ctx.add("expand", [x], {"shape": shape})


def _meta_shape(ctx):
    return [ctx.dim(d) for d in ctx.node.meta["val"].shape]


@handles(aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints)
def _reshape_like(ctx, x, *a):
    return ctx.add("reshape", [x], {"shape": _meta_shape(ctx)})


@handles(aten.select.int)
def _select(ctx, x, dim, index):
    dim %= x.type.rank
    n = x.shape[dim]
    if index < 0:
        index = D.as_dim(n + index)
    s = ctx.add("slice", [x], {"axis": dim, "start": index, "step": 1, "length": 1})
    return ctx.add("reshape", [s], {"shape": _meta_shape(ctx)})


def _norm_bound(v, n):
    if v is None:
        return None
    if isinstance(v, int):
        if v >= 2**62:
            return n
        if v < 0:
            return D.as_dim(n + v) if not isinstance(n, int) else max(n + v, 0)
        return min(v, n) if isinstance(n, int) else v
    return v


@handles(aten.slice.Tensor)
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    dim %= x.type.rank
    n = x.shape[dim]
    start = _norm_bound(start, n) if start is not None else 0
    end = _norm_bound(end, n) if end is not None else n
    length = _meta_shape(ctx)[dim]
    if isinstance(start, int) and isinstance(length, int) and isinstance(n, int) and start >= n:
        start = 0
    return ctx.add("slice", [x], {"axis": dim, "start": start, "step": step, "length": length})


@handles(aten.resize.default)
def _resize(ctx, x, size, memory_format=None):
    """resize_ to no more elements than x holds: its first elements in order (growing would expose
    memory torch leaves uninitialised)."""
    shape = [ctx.dim(d) for d in size]
    n, have = D.numel(shape), D.numel(list(x.shape))
    if not (isinstance(n, int) and isinstance(have, int)) or n > have:
        raise Unsupported("resize_ to more elements than the tensor holds, or to a symbolic size")
    flat = ctx.add("reshape", [x], {"shape": [have]})
    return ctx.add("reshape", [ctx.add("slice", [flat], {"axis": 0, "start": 0, "step": 1, "length": n})],
                   {"shape": shape})


@handles(aten.narrow.default, aten.narrow_copy.default)
def _narrow(ctx, x, dim, start, length):
    return ctx.add("slice", [x], {"axis": dim % x.type.rank, "start": start, "step": 1, "length": length})


@handles(aten.unbind.int, aten.unbind_copy.int)
def _unbind(ctx, x, dim=0):
    axis, n = _static_axis(x, dim, "unbind")
    shape = [d for a, d in enumerate(x.shape) if a != axis]
    return tuple(ctx.add("reshape", [ctx.add("slice", [x], {"axis": axis, "start": k, "step": 1, "length": 1})],
                         {"shape": shape}) for k in range(n))


@handles(aten.split_with_sizes.default, aten.split.Tensor)
def _split(ctx, x, sizes, dim=0):
    dim %= x.type.rank
    outs = [ctx.dim(v.shape[dim]) for v in ctx.node.meta["val"]]
    res, start = [], 0
    for n in outs:
        res.append(ctx.add("slice", [x], {"axis": dim, "start": start, "step": 1, "length": n}))
        start = D.as_dim(start + n)
    return tuple(res)


@handles(aten.cat.default)
def _cat(ctx, xs, dim=0):
    dt = _out_dtype(ctx)
    xs = [ctx.tensor(x, dt) for x in xs if not (x.type.rank == 1 and x.shape[0] == 0)]
    if len(xs) == 1:
        return xs[0]
    return ctx.add("concat", xs, {"axis": dim})


@handles(aten.constant_pad_nd.default)
def _pad(ctx, x, pad, value=0):
    pairs = [(0, 0)] * x.type.rank
    for i in range(len(pad) // 2):
        pairs[x.type.rank - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return ctx.add("pad", [x], {"pads": pairs, "value": value})


@handles(aten.repeat.default)
def _repeat(ctx, x, reps):
    pad = len(reps) - x.type.rank
    shape = [1] * pad + list(x.shape)
    x = ctx.add("reshape", [x], {"shape": shape})
    inter, exp = [], []
    for r, d in zip(reps, shape):
        inter += [1, d]
        exp += [r, d]
    x = ctx.add("reshape", [x], {"shape": inter})
    x = ctx.add("expand", [x], {"shape": exp})
    return ctx.add("reshape", [x], {"shape": _meta_shape(ctx)})


@handles(aten.embedding.default)
def _embedding(ctx, w, idx, *a):
    return ctx.add("gather", [w, idx], {"axis": 0})


@handles(aten.index_select.default)
def _index_select(ctx, x, dim, idx):
    if x.type.rank == 0:             # a 0-d tensor's only element (index 0 or -1)
        return x
    return ctx.add("gather", [x, idx], {"axis": dim})


@handles(aten.gather.default)
def _gather(ctx, x, dim, idx, sparse_grad=False):
    return ctx.add("gather_elements", [x, idx], {"axis": dim})


@handles(aten.index.Tensor)
def _index(ctx, x, indices):
    """x[..., i0, i1, ...] with adjacent index tensors: one gather on the flattened indexed dims. Index
    tensors apart (x[i, :, j]): torch puts their dims first, as the gather does once the indexed dims are
    moved to the front."""
    pos = [k for k, t in enumerate(indices) if t is not None]
    if pos != list(range(pos[0], pos[-1] + 1)):
        perm = pos + [d for d in range(x.type.rank) if d not in pos]
        return _index(ctx, ctx.add("transpose", [x], {"perm": perm}), [indices[k] for k in pos])
    idx = [indices[k] for k in pos]
    if any(t.dtype == "bool" for t in idx):
        raise Unsupported("boolean mask indexing (data-dependent shape)")
    p, dims_ = pos[0], [x.shape[k] for k in pos]
    lin = None
    stride = 1
    for t, n in zip(reversed(idx), reversed(dims_)):
        t = ctx.tensor(t, "int64")
        if len(idx) == 1:            # gather wraps negative indices itself
            lin = t
            break
        nn = ctx.tensor(n, "int64")
        t = ctx.add("where", [ctx.add("lt", [t, ctx.tensor(0, "int64")]), ctx.add("add", [t, nn]), t])
        term = t if stride == 1 else ctx.add("mul", [t, ctx.tensor(stride, "int64")])
        lin = term if lin is None else ctx.add("add", [lin, term])
        stride = D.as_dim(stride * n)
    if len(idx) > 1:
        flat = ctx.add("reshape", [x], {"shape": list(x.shape[:p]) + [stride] + list(x.shape[pos[-1] + 1:])})
    else:
        flat = x
    return ctx.add("gather", [flat, lin], {"axis": p})


# ---- creation --------------------------------------------------------------------------
@handles(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx, *a, **kw):
    a = [ctx.dim(v) if not isinstance(v, float) else v for v in a]
    start, end, step = (0, a[0], 1) if len(a) == 1 else (a[0], a[1], a[2] if len(a) > 2 else 1)
    length = _meta_shape(ctx)[0]
    return ctx.add("iota", [], {"length": length, "start": start, "step": step, "dtype": _out_dtype(ctx)})


def _full_value(ctx, value):
    if isinstance(value, Value):
        raise Unsupported("tensor fill value")
    return ctx.add("full", [], {"shape": _meta_shape(ctx), "value": value, "dtype": _out_dtype(ctx)})


@handles(aten.full.default)
def _full(ctx, size, value, **kw):
    return _full_value(ctx, value)


@handles(aten.full_like.default)
def _full_like(ctx, x, value, **kw):
    return _full_value(ctx, value)


@handles(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
         aten.empty_like.default)
def _zeros(ctx, *a, **kw):
    return _full_value(ctx, 0)


@handles(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(ctx, *a, **kw):
    return _full_value(ctx, 1)


@handles(aten.scalar_tensor.default)
def _scalar_tensor(ctx, v, **kw):
    return ctx.scalar(v, _out_dtype(ctx))


# ---- linear algebra -----------------------------------------------------------------------
def grid_attrs(ctx, x) -> dict:
    """{"int8_range": [lo, hi]} where x is a quantized model's dequantized grid (aten_quant.py), else {}:
    what a conv or matmul reading x takes, so precision="int8" multiplies the model's own bytes."""
    grid = ctx.grids.get(id(x))
    return {"int8_range": grid} if grid else {}


@handles(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(ctx, a, b):
    return ctx.add("matmul", [a, b], grid_attrs(ctx, a))


@handles(aten.addmm.default, aten.baddbmm.default, aten.addmv.default, aten.addbmm.default)
def _addmm(ctx, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (a @ b); addbmm sums its batch of products first."""
    y = ctx.add("matmul", [a, b], grid_attrs(ctx, a))
    if ctx.node.target == aten.addbmm.default:
        y = ctx.add("reduce_sum", [y], {"axes": [0], "keepdims": False})
    if alpha != 1:
        y = ctx.add("mul", [y, ctx.tensor(alpha, y.dtype)])
    if beta == 0:
        return y
    if beta != 1:
        bias = ctx.add("mul", [bias, ctx.tensor(beta, y.dtype)])
    return ctx.add("add", [y, bias])


@handles(aten._trilinear.default)
def _trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """i1 * i2 * i3, each unsqueezed at its expand dims, summed over sumdim (F.bilinear's core)."""
    def grow(v, dims):
        for d in sorted(dims):
            shape = list(v.shape)
            shape.insert(d, 1)
            v = ctx.add("reshape", [v], {"shape": shape})
        return v
    y = ctx.add("mul", [ctx.add("mul", [grow(i1, expand1), grow(i2, expand2)]), grow(i3, expand3)])
    return ctx.add("reduce_sum", [y], {"axes": sorted(sumdim), "keepdims": False}) if sumdim else y


@handles(aten.scaled_dot_product_attention.default)
def _sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """One attention op: the kernel handles the mask, causality and grouped KV heads."""
    if dropout_p:
        raise Unsupported("attention dropout at inference")
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    ins = [q, k, v] + ([ctx.tensor(attn_mask, "bool" if attn_mask.dtype == "bool" else q.dtype)]
                       if attn_mask is not None else [])
    return ctx.add("attention", ins, {"scale": float(scale), "causal": bool(is_causal)})


def _per_dim(v, nsp):
    """A conv parameter given once for every spatial dim, or per dim, as a list per dim."""
    return list(v) * nsp if len(v) == 1 else list(v)


def _spread(ctx, x, axis, s):
    """x with s - 1 zeros between neighbours along axis (a transposed conv's stride)."""
    shape, n = list(x.shape), x.shape[axis]
    y = ctx.add("reshape", [x], {"shape": shape[:axis + 1] + [1] + shape[axis + 1:]})
    pads = [(0, 0)] * (len(shape) + 1)
    pads[axis + 1] = (0, s - 1)
    y = ctx.add("reshape", [ctx.add("pad", [y], {"pads": pads})], {"shape": shape[:axis] + [n * s] + shape[axis + 1:]})
    return ctx.add("slice", [y], {"axis": axis, "start": 0, "step": 1, "length": (n - 1) * s + 1})


def _conv_transposed(ctx, x, w, b, stride, padding, dilation, output_padding, groups):
    """A transposed convolution as the plain one it equals: the input spread by the stride, padded by
    dilation * (k - 1) - padding (plus output_padding at the end; a negative pad crops), convolved at
    stride 1 with the weight's in / out channels swapped within each group and its taps flipped; where
    the kernel equals the stride, a GEMM into patches (conv_patches.py)."""
    nsp = x.type.rank - 2
    s, p, d, op = (_per_dim(v, nsp) for v in (stride, padding, dilation, output_padding))
    ks = list(w.shape[2:])
    if not all(isinstance(v, int) for v in ks + list(x.shape[2:]) + list(w.shape[:2])):
        raise Unsupported("a transposed convolution over symbolic sizes")
    if nsp == 2 and groups == 1 and ks == s and not any(p) and not any(op) and all(v == 1 for v in d) \
            and isinstance(x.shape[0], int):
        return patches_transposed(ctx.add, x, w, b)
    for a in range(nsp):
        if s[a] > 1:
            x = _spread(ctx, x, 2 + a, s[a])
    edge = [d[a] * (ks[a] - 1) - p[a] for a in range(nsp)]
    x = ctx.add("pad", [x], {"pads": [(0, 0), (0, 0)] + [(edge[a], edge[a] + op[a]) for a in range(nsp)]})
    cin, cout_g = w.shape[:2]
    wt = ctx.add("reshape", [w], {"shape": [groups, cin // groups, cout_g] + ks})
    wt = ctx.add("transpose", [wt], {"perm": [0, 2, 1] + list(range(3, 3 + nsp))})
    wt = ctx.add("reshape", [wt], {"shape": [groups * cout_g, cin // groups] + ks})
    for a in range(nsp):
        wt = ctx.add("slice", [wt], {"axis": 2 + a, "start": ks[a] - 1, "step": -1, "length": ks[a]})
    ins = [x, wt] + ([b] if b is not None else [])
    return ctx.add("conv", ins, {"strides": [1] * nsp, "pads": [(0, 0)] * nsp, "dilations": d, "groups": groups})


@handles(aten.convolution.default)
def _conv(ctx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return _conv_transposed(ctx, x, w, b, stride, padding, dilation, output_padding, groups)
    nsp = x.type.rank - 2
    pads = [(p, p) for p in _per_dim(padding, nsp)]
    ins = [x, w] + ([b] if b is not None else [])
    return ctx.add("conv", ins, {"strides": _per_dim(stride, nsp), "pads": pads, "dilations": _per_dim(dilation, nsp),
                                 "groups": groups, **grid_attrs(ctx, x)})


@handles(aten._native_batch_norm_legit_no_training.default)
def _bn(ctx, x, w, b, mean, var, momentum, eps):
    c = x.shape[1]
    w = w if w is not None else ctx.g.const(np.ones(c, np.float32))
    b = b if b is not None else ctx.g.const(np.zeros(c, np.float32))
    return (ctx.add("batch_norm", [x, w, b, mean, var], {"eps": eps}), None, None)


@handles(aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.default,
         aten._native_batch_norm_legit.no_stats)
def _bn_batch_stats(ctx, x, w, b, *rest):
    """Batch norm as training runs it: normalized by this batch's mean and biased variance per channel;
    also returns them (mean, 1/std) and, where running statistics are given, their updates with the
    unbiased variance. training=False with running statistics is the inference batch norm."""
    if ctx.node.target == aten._native_batch_norm_legit.no_stats:
        (training, momentum, eps), rm, rv = rest, None, None
    else:
        rm, rv, training, momentum, eps = rest
    if not training:
        return (_bn(ctx, x, w, b, rm, rv, momentum, eps)[0], None, None, rm, rv)
    axes = [0] + list(range(2, x.type.rank))
    n = D.numel([x.shape[a] for a in axes])
    if not isinstance(n, int):
        raise Unsupported("batch statistics over a symbolic size")
    mean, var = _mean_var(ctx, x, axes, keepdims=True)
    rstd = ctx.add("rsqrt", [ctx.add("add", [var, ctx.tensor(float(eps), x.dtype)])])
    y = ctx.add("mul", [ctx.add("sub", [x, mean]), rstd])
    per_channel = [x.shape[1]] + [1] * (x.type.rank - 2)
    if w is not None:
        y = ctx.add("mul", [y, ctx.add("reshape", [w], {"shape": per_channel})])
    if b is not None:
        y = ctx.add("add", [y, ctx.add("reshape", [b], {"shape": per_channel})])
    c = [x.shape[1]]
    mean_c, rstd_c, var_c = (ctx.add("reshape", [v], {"shape": c}) for v in (mean, rstd, var))
    outs = (y, mean_c, rstd_c)
    if rm is None:
        return outs
    unbiased = ctx.add("mul", [var_c, ctx.tensor(n / max(n - 1, 1), x.dtype)])

    def update(run, batch):
        return ctx.add("add", [ctx.add("mul", [run, ctx.tensor(1.0 - momentum, x.dtype)]),
                               ctx.add("mul", [batch, ctx.tensor(float(momentum), x.dtype)])])
    return (*outs, update(rm, mean_c), update(rv, unbiased))


@handles(aten.native_layer_norm.default)
def _layer_norm(ctx, x, shape, w, b, eps):
    axis = x.type.rank - len(shape)
    y = ctx.add("layer_norm", [x, w, b], {"axis": axis, "eps": eps})
    return (y, *_mean_rstd(ctx, x, list(range(axis, x.type.rank)), eps, keepdims=True))


@handles(aten.native_group_norm.default)
def _group_norm(ctx, x, w, b, n, c, hw, groups, eps):
    """A layer norm over each group's channels and pixels, then the per-channel affine."""
    sh = list(x.shape)
    if not isinstance(sh[1], int):
        raise Unsupported("group norm over a symbolic channel count")
    grouped = ctx.add("reshape", [x], {"shape": [sh[0], groups, D.numel([sh[1] // groups] + sh[2:])]})
    y = ctx.add("reshape", [ctx.add("layer_norm", [grouped], {"axis": 2, "eps": eps})], {"shape": sh})
    per_channel = [sh[1]] + [1] * (len(sh) - 2)
    if w is not None:
        y = ctx.add("mul", [y, ctx.add("reshape", [w], {"shape": per_channel})])
    if b is not None:
        y = ctx.add("add", [y, ctx.add("reshape", [b], {"shape": per_channel})])
    return (y, *_mean_rstd(ctx, grouped, [2], eps, keepdims=False))


def _mean_var(ctx, x, axes, keepdims):
    """The mean (kept dims) and the biased variance over axes."""
    mu = ctx.add("reduce_mean", [x], {"axes": axes, "keepdims": True})
    d = ctx.add("sub", [x, mu])
    return mu, ctx.add("reduce_mean", [ctx.add("mul", [d, d])], {"axes": axes, "keepdims": keepdims})


def _mean_rstd(ctx, x, axes, eps, keepdims):
    """The statistics a norm returns beside its output (training graphs read them; cleanup drops them
    where nothing does): the mean and 1 / sqrt(biased variance + eps) over axes."""
    mu, var = _mean_var(ctx, x, axes, keepdims)
    rstd = ctx.add("rsqrt", [ctx.add("add", [var, ctx.tensor(float(eps), x.dtype)])])
    return (mu if keepdims else ctx.add("reshape", [mu], {"shape": var.shape})), rstd


@handles(aten._softmax.default, aten._log_softmax.default)
def _softmax(ctx, x, dim, half_to_float=False):
    op = "softmax" if ctx.node.target == aten._softmax.default else "log_softmax"
    return ctx.add(op, [x], {"axis": dim})


@handles(aten.max_pool2d.default, aten.max_pool3d.default)
def max_pool(ctx, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    nsp = x.type.rank - 2
    rep = (lambda v: [v] * nsp if isinstance(v, int) else (list(v) * nsp if len(v) == 1 else list(v)))
    attrs = {"kernel": rep(kernel), "strides": rep(stride) if stride else rep(kernel),
             "pads": [(p, p) for p in rep(padding)], "dilations": rep(dilation), "ceil_mode": ceil_mode}
    return ctx.add("max_pool", [x], attrs)       # with indices: aten_resample.py


@handles(aten.avg_pool2d.default, aten.avg_pool1d.default, aten.avg_pool3d.default)
def _avg_pool(ctx, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    nsp = x.type.rank - 2
    rep = (lambda v: [v] * nsp if isinstance(v, int) else (list(v) * nsp if len(v) == 1 else list(v)))
    k, st, pads = rep(kernel), rep(stride) if stride else rep(kernel), rep(padding)
    y = ctx.add("avg_pool", [x], {"kernel": k, "strides": st, "pads": [(p, p) for p in pads], "ceil_mode": ceil_mode,
                                  "count_include_pad": count_include_pad or bool(divisor_override)})
    if divisor_override:     # the window's sum: the mean (with pads) times the window's size in the padded input
        sizes = 1
        for axis, (n, kk, s_, p) in enumerate(zip(x.shape[2:], k, st, pads)):
            out_n = y.shape[2 + axis]
            if not isinstance(n, int) or not isinstance(out_n, int):
                raise Unsupported("divisor_override over a symbolic size")
            start = np.arange(out_n) * s_ - p
            size = np.minimum(start + kk, n + p) - start
            sizes = np.multiply.outer(sizes, size) if axis else size
        y = ctx.add("mul", [y, ctx.g.const((sizes / divisor_override).astype(x.dtype))])
    return y


# ---- reductions --------------------------------------------------------------------------
def _axes(x, dim):
    """The reduced axes, non-negative; a 0-d tensor reduced over its dim 0 or -1 has none."""
    rank = x.type.rank
    if dim is None or dim == [] or rank == 0:
        return list(range(rank))
    return [d % rank for d in ([dim] if isinstance(dim, int) else dim)]


def _reduce(op):
    def h(ctx, x, dim=None, keepdim=False, dtype=None, **kw):
        out = _out_dtype(ctx)
        if op in ("reduce_max", "reduce_min") and x.dtype == "bool":
            x = ctx.add("cast", [x], {"to": "uint8"})
            return ctx.add("cast", [ctx.add(op, [x], {"axes": _axes(x, dim), "keepdims": keepdim})], {"to": "bool"})
        x = ctx.tensor(x, out)
        return ctx.add(op, [x], {"axes": _axes(x, dim), "keepdims": keepdim})
    return h


for _t, _op in ((aten.mean.dim, "reduce_mean"), (aten.mean.default, "reduce_mean"), (aten.sum.dim_IntList, "reduce_sum"),
                (aten.sum.default, "reduce_sum"), (aten.amax.default, "reduce_max"), (aten.amin.default, "reduce_min"),
                (aten.any.dim, "reduce_max"), (aten.any.dims, "reduce_max"), (aten.any.default, "reduce_max"),
                (aten.all.dim, "reduce_min"), (aten.all.default, "reduce_min"), (aten.prod.dim_int, "reduce_prod"),
                (aten.prod.default, "reduce_prod"),
                # x.max() / x.min() over all elements (left as they are inside torch.cond / while_loop bodies)
                (aten.max.default, "reduce_max"), (aten.min.default, "reduce_min")):
    HANDLERS[_t] = _reduce(_op)


@handles(aten.linalg_vector_norm.default)
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, dtype=None):
    """sum(|x|^ord)^(1/ord) over dim; ord inf/-inf the largest/smallest |x|, 0 the count of nonzeros."""
    x = ctx.tensor(x, _out_dtype(ctx))
    red = {"axes": _axes(x, dim), "keepdims": keepdim}
    a = ctx.add("abs", [x])
    if ord in (math.inf, -math.inf):
        return ctx.add("reduce_max" if ord > 0 else "reduce_min", [a], red)
    if ord == 0:
        return ctx.add("reduce_sum", [ctx.add("cast", [ctx.add("ne", [x, ctx.tensor(0.0, x.dtype)])], {"to": x.dtype})], red)
    if ord == 1:
        return ctx.add("reduce_sum", [a], red)
    if ord == 2:
        return ctx.add("sqrt", [ctx.add("reduce_sum", [ctx.add("mul", [x, x])], red)])
    powered = ctx.add("pow", [a, ctx.tensor(float(ord), x.dtype)])
    return ctx.add("pow", [ctx.add("reduce_sum", [powered], red), ctx.tensor(1.0 / ord, x.dtype)])


@handles(aten.dist.default)
def _dist(ctx, x, y, p=2):
    """The p-norm of x - y over every element."""
    return _vector_norm(ctx, ctx.add("sub", [x, y]), p)


@handles(aten.topk.default)
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) along dim, sorted, ties by the lower index first."""
    if not isinstance(k, int):
        raise Unsupported("top-k with a symbolic k")
    v, i = ctx.add("topk", [x], {"k": k, "axis": dim % max(x.type.rank, 1), "largest": bool(largest), "sorted": True})
    return (v, i)


def _kth_smallest(ctx, x, k, dim, keepdim):
    """(value, index) of the k-th smallest (from 1) along dim: a sorted top-k, ties by the lower index."""
    axis = dim % max(x.type.rank, 1)
    if x.type.rank == 0:
        return x, ctx.tensor(0, "int64")
    v, i = ctx.add("topk", [x], {"k": k, "axis": axis, "largest": False, "sorted": True})
    pick = {"axis": axis, "start": k - 1, "step": 1, "length": 1}
    v, i = ctx.add("slice", [v], pick), ctx.add("slice", [i], pick)
    if not keepdim:
        shape = [d for a, d in enumerate(v.shape) if a != axis]
        v, i = ctx.add("reshape", [v], {"shape": shape}), ctx.add("reshape", [i], {"shape": shape})
    return v, i


@handles(aten.kthvalue.default)
def _kthvalue(ctx, x, k, dim=-1, keepdim=False):
    return _kth_smallest(ctx, x, k, dim, keepdim)


@handles(aten.median.default, aten.median.dim)
def _median(ctx, x, dim=None, keepdim=False):
    """The lower median (torch's: the ((n - 1) // 2 + 1)-th smallest); over every element for
    median.default, which returns the value alone."""
    whole = ctx.node.target == aten.median.default
    if whole:
        x = ctx.add("reshape", [x], {"shape": [D.numel(x.shape)]})
        dim = 0
    n = x.shape[dim % x.type.rank] if x.type.rank else 1
    if not isinstance(n, int):
        raise Unsupported("a median along a symbolic dim")
    v, i = _kth_smallest(ctx, x, (n - 1) // 2 + 1, dim, keepdim)
    return v if whole else (v, i)


@handles(aten.nanmedian.default, aten.nanmedian.dim)
def _nanmedian(ctx, x, dim=None, keepdim=False):
    """The lower median of the values that are not NaN (NaN where all are): the sort puts NaN last, and
    the pick is at (count - 1) // 2 of each row's count of numbers."""
    whole, scalar = ctx.node.target == aten.nanmedian.default, x.type.rank == 0
    if whole or scalar:
        x = ctx.add("reshape", [x], {"shape": [D.numel(x.shape)]})
        dim = 0
    axis, n = _static_axis(x, dim, "a median")
    if n == 0:
        raise Unsupported("a median along an empty dim")
    v, i = ctx.add("topk", [x], {"k": n, "axis": axis, "largest": False, "sorted": True})
    numbers = ctx.add("reduce_sum", [ctx.add("cast", [ctx.add("not", [ctx.add("isnan", [x])])], {"to": "int64"})],
                      {"axes": [axis], "keepdims": True})
    at = ctx.add("floordiv", [ctx.add("max", [ctx.add("sub", [numbers, ctx.scalar(1, "int64")]), ctx.scalar(0, "int64")]),
                              ctx.scalar(2, "int64")])
    v, i = (ctx.add("gather_elements", [t, at], {"axis": axis}) for t in (v, i))
    if not keepdim or whole or scalar:
        shape = [d for a, d in enumerate(v.shape) if a != axis]
        v, i = ctx.add("reshape", [v], {"shape": shape}), ctx.add("reshape", [i], {"shape": shape})
    return v if whole else (v, i)


MODE_MAX = 4096


@handles(aten.mode.default)
def _mode(ctx, x, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest of equally frequent ones) and the index of its
    last occurrence: each element's count of equals (n x n compares), then the picks by reductions."""
    if x.type.rank == 0:
        return x, ctx.tensor(0, "int64")
    axis, n = _static_axis(x, dim, "mode")
    if x.dtype == "bool" or x.dtype.startswith("bfloat") or n > MODE_MAX:
        raise Unsupported(f"mode of {x.dtype} along {n} values (up to {MODE_MAX}: it compares every pair)")
    xa = ctx.add("reshape", [x], {"shape": [*x.shape[:axis + 1], 1, *x.shape[axis + 1:]]})
    xb = ctx.add("reshape", [x], {"shape": [*x.shape[:axis], 1, *x.shape[axis:]]})
    same = ctx.add("eq", [xa, xb])                                       # [..., n (this), n (other), ...]
    count = ctx.add("reduce_sum", [ctx.add("cast", [same], {"to": "int64"})], {"axes": [axis + 1], "keepdims": False})
    top = ctx.add("reduce_max", [count], {"axes": [axis], "keepdims": True})
    big = ctx.scalar(np.inf if x.dtype.startswith("float") else np.iinfo(x.dtype).max, x.dtype)
    value = ctx.add("reduce_min", [ctx.add("where", [ctx.add("eq", [count, top]), x, big])], {"axes": [axis], "keepdims": True})
    shape = [1] * x.type.rank
    shape[axis] = n
    pos = ctx.g.const(np.arange(n, dtype=np.int64).reshape(shape))
    index = ctx.add("reduce_max", [ctx.add("where", [ctx.add("eq", [x, value]), pos, ctx.scalar(-1, "int64")])],
                    {"axes": [axis], "keepdims": True})
    if not keepdim:
        shape = [d for a, d in enumerate(value.shape) if a != axis]
        value, index = ctx.add("reshape", [value], {"shape": shape}), ctx.add("reshape", [index], {"shape": shape})
    return value, index


def _count_below(ctx, sorted_seq, values, right, out_int32):
    """For each value, how many entries of its row of sorted_seq are < it (<= it with right=True)."""
    cmp = "le" if right else "lt"
    s = ctx.add("reshape", [sorted_seq], {"shape": list(sorted_seq.shape[:-1]) + [1, sorted_seq.shape[-1]]}) \
        if sorted_seq.type.rank > 1 else sorted_seq
    v = ctx.add("reshape", [values], {"shape": list(values.shape) + [1]})
    hit = ctx.add("cast", [ctx.add(cmp, [s, v])], {"to": "int64"})
    n = ctx.add("reduce_sum", [hit], {"axes": [values.type.rank], "keepdims": False})
    return ctx.add("cast", [n], {"to": "int32"}) if out_int32 else n


@handles(aten.bucketize.Tensor)
def _bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    return _count_below(ctx, boundaries, x, right, out_int32)


@handles(aten.searchsorted.Tensor)
def _searchsorted(ctx, sorted_seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        raise Unsupported("searchsorted with a sorter")
    return _count_below(ctx, sorted_seq, values, right or side == "right", out_int32)


@handles(aten._cdist_forward.default)
def _cdist(ctx, x1, x2, p, compute_mode=None):
    """||x1[..., i, :] - x2[..., j, :]||_p for every pair (i, j)."""
    a = ctx.add("reshape", [x1], {"shape": list(x1.shape[:-1]) + [1, x1.shape[-1]]})
    b = ctx.add("reshape", [x2], {"shape": list(x2.shape[:-2]) + [1] + list(x2.shape[-2:])})
    return _vector_norm(ctx, ctx.add("sub", [a, b]), p, dim=[-1])


@handles(aten._pdist_forward.default)
def _pdist(ctx, x, p=2):
    """The p-norm distances of the rows of x [n, m], pair (i, j) for i < j in row-major order."""
    n = x.shape[0]
    if not isinstance(n, int):
        raise Unsupported("pdist over a symbolic number of rows")
    full = _cdist(ctx, x, x, p)
    upper = np.flatnonzero(np.triu(np.ones((n, n), bool), 1)).astype(np.int64)
    return ctx.add("gather", [ctx.add("reshape", [full], {"shape": [n * n]}), ctx.g.const(upper)], {"axis": 0})


@handles(aten.sort.default, aten.sort.stable)
def _sort(ctx, x, *args, **kw):
    """sort(x, dim=-1, descending=False) and sort.stable(x, *, stable, dim, descending): a top-k of the
    whole axis. Ties keep the lower index first, which is torch's stable order (its unstable sort
    promises no order for ties)."""
    if ctx.node.target == aten.sort.default:
        dim, descending = (list(args) + [-1, False][len(args):])[:2]
    else:
        dim, descending = kw.get("dim", -1), kw.get("descending", False)
    axis = dim % max(x.type.rank, 1)
    n = x.shape[axis] if x.type.rank else 1
    if not isinstance(n, int):
        raise Unsupported("sort along a symbolic dim")
    v, i = ctx.add("topk", [x], {"k": n, "axis": axis, "largest": bool(descending), "sorted": True})
    return (v, i)


@handles(aten.max.dim, aten.min.dim)
def _max_dim(ctx, x, dim, keepdim=False):
    big = ctx.node.target == aten.max.dim
    v = ctx.add("reduce_max" if big else "reduce_min", [x], {"axes": [dim], "keepdims": keepdim})
    i = ctx.add("argmax" if big else "argmin", [x], {"axis": dim, "keepdims": keepdim})
    return (v, i)


@handles(aten.argmax.default, aten.argmin.default)
def _argmax(ctx, x, dim=None, keepdim=False):
    op = "argmax" if ctx.node.target == aten.argmax.default else "argmin"
    if dim is None:
        x = ctx.add("reshape", [x], {"shape": [D.numel(x.shape)]})
        dim = 0
    return ctx.add(op, [x], {"axis": dim, "keepdims": keepdim})


@handles(aten.cumsum.default, aten.cumprod.default)
def _cumulative(ctx, x, dim, dtype=None):
    op = "cumsum" if ctx.node.target == aten.cumsum.default else "cumprod"
    x = ctx.tensor(x, _out_dtype(ctx))
    return x if x.type.rank == 0 else ctx.add(op, [x], {"axis": dim % x.type.rank})


@handles(aten.cummax.default, aten.cummin.default)
def _cummax(ctx, x, dim):
    """(running max / min along dim, the index it was last seen at): log2(n) doubling steps, each
    combining a window with the one `step` positions earlier, which wins only if strictly better
    (or NaN), so ties keep the later index as torch does."""
    if x.type.rank == 0:
        return x, ctx.tensor(0, "int64")
    axis, n = _static_axis(x, dim, "a running max")
    is_max = ctx.node.target == aten.cummax.default
    shape = [1] * x.type.rank
    shape[axis] = n
    v, i = x, ctx.add("expand", [ctx.g.const(np.arange(n, dtype=np.int64).reshape(shape))], {"shape": list(x.shape)})
    floating = x.dtype.startswith(("float", "bfloat"))
    if floating:
        worst = -math.inf if is_max else math.inf
    else:
        info = np.iinfo(np.uint8 if x.dtype == "bool" else np.dtype(x.dtype))
        worst = info.min if is_max else info.max
    step = 1
    while step < n:                 # the head positions, shifted in as the worst value, never win
        vs, is_ = _shifted(ctx, v, axis, step, worst), _shifted(ctx, i, axis, step, 0)
        take = ctx.add("gt" if is_max else "lt", [vs, v])
        if floating:
            take = ctx.add("or", [take, ctx.add("and", [ctx.add("isnan", [vs]), ctx.add("not", [ctx.add("isnan", [v])])])])
        v, i = ctx.add("where", [take, vs, v]), ctx.add("where", [take, is_, i])
        step *= 2
    return v, i


def _shifted(ctx, x, axis, step, fill):
    """x moved `step` places along axis, the first `step` positions `fill`."""
    n = x.shape[axis]
    pads = [(0, 0)] * x.type.rank
    pads[axis] = (step, -step)                          # a negative pad crops
    shape = [1] * x.type.rank
    shape[axis] = n
    has = ctx.add("expand", [ctx.g.const((np.arange(n) >= step).reshape(shape))], {"shape": list(x.shape)})
    return ctx.add("where", [has, ctx.add("pad", [x], {"pads": pads}), ctx.tensor(fill, x.dtype)])


@handles(aten.logcumsumexp.default)
def _logcumsumexp(ctx, x, dim):
    """log(cumsum(exp(x))) along dim in log2(n) doubling steps of logaddexp (each position combined
    with the one `step` before it), so a small early value is kept beside a later large one."""
    if x.type.rank == 0:
        return x
    axis, n = _static_axis(x, dim, "logcumsumexp")
    y, step = x, 1
    while step < n:
        prev = _shifted(ctx, y, axis, step, -math.inf)
        m = ctx.add("max", [y, prev])
        d = ctx.add("neg", [ctx.add("abs", [ctx.add("sub", [y, prev])])])
        y = ctx.add("where", [ctx.add("isinf", [m]), m, ctx.add("add", [m, ctx.add("log1p", [ctx.add("exp", [d])])])])
        step *= 2
    return y


@handles(aten.var.correction, aten.var_mean.correction)
def _var(ctx, x, dim=None, correction=1, keepdim=False):
    axes = _axes(x, dim)
    mu = ctx.add("reduce_mean", [x], {"axes": axes, "keepdims": True})
    d = ctx.add("sub", [x, mu])
    ss = ctx.add("reduce_sum", [ctx.add("mul", [d, d])], {"axes": axes, "keepdims": keepdim})
    n = D.numel([x.shape[a] for a in axes])
    if not isinstance(n, int):
        raise Unsupported("variance over a symbolic dim")
    var = ctx.add("div", [ss, ctx.tensor(float(max(n - (correction if correction is not None else 1), 0)), x.dtype)])
    if ctx.node.target == aten.var_mean.correction:
        m = mu if keepdim else ctx.add("reshape", [mu], {"shape": var.shape})
        return (var, m)
    return var
