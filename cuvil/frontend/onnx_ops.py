"""ONNX op handlers: each maps one ONNX node onto IR ops (see onnx.py for the driver).

A handler reads its node through the converter `c` (c.inp(i), c.known(i), c.attr(name)) and returns
its outputs: IR Values, or numpy arrays for values known at compile time."""
from __future__ import annotations

import itertools
import math

import numpy as np
import sympy

from ..errors import ShapeError
from ..ir import dims as D
from ..ir.graph import Value
from ..ir.ops._shape import broadcast
from .onnx import (MAX_UNROLL, ONNX_DTYPES, inline_subgraph, NeedsConstant, Unsupported, _auto_pad, _contig, _dim, _ints, _is_sym, _maybe_int,
                   _norm_axis, _sym_array, _tensor_to_numpy, dtype_of, handler, rank_of, shape_of, symfold)

# ---- pointwise ----------------------------------------------------------------------------------
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
    axis = _norm_axis(axis, ra)
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


# ---- linear algebra ---------------------------------------------------------------------------
@handler("MatMul")
def _matmul(c):
    return c.op("matmul", [c.inp(0), c.inp(1)])


@handler("Gemm")
def _gemm(c):
    a, b, bias = c.inp(0), c.inp(1), c.inp(2)
    if c.attr("transA", 0):
        a = _transpose(c, a, (1, 0))
    if c.attr("transB", 0):
        b = _transpose(c, b, (1, 0))
    y = c.op("matmul", [a, b])
    dt = dtype_of(y)
    alpha, beta = c.attr("alpha", 1.0), c.attr("beta", 1.0)
    if alpha != 1.0:
        y = c.op("mul", [y, c.scalar(alpha, dt)])
    if bias is not None:
        if beta != 1.0:
            bias = c.op("mul", [bias, c.scalar(beta, dt)]) if not isinstance(bias, np.ndarray) else \
                (bias * beta).astype(dt)
        y = c.op("add", [y, bias])
    return y


def _transpose(c, x, perm):
    if isinstance(x, np.ndarray):
        return _contig(np.transpose(x, perm))
    if tuple(perm) == tuple(range(len(perm))):
        return x
    return c.op("transpose", [x], perm=tuple(perm))


@handler("Einsum")
def _einsum(c):
    eq = c.attr("equation").replace(" ", "")
    xs = [c.inp(i) for i in range(len(c.node.input))]
    if "->" in eq:
        lhs, out = eq.split("->")
    else:
        lhs = eq
        letters = "".join(ch for ch in lhs if ch.isalpha())
        out = "".join(sorted(ch for ch in set(letters) if letters.count(ch) == 1))
    terms = lhs.split(",")
    if "." in eq:
        # expand ellipsis into unused capital letters
        spare = [ch for ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if ch not in eq]
        ell_rank = max(rank_of(x) - (len(t) - 3) for t, x in zip(terms, xs) if "..." in t)
        ell = "".join(spare[:ell_rank])
        terms = [t.replace("...", ell[ell_rank - (rank_of(x) - (len(t) - 3)):]) for t, x in zip(terms, xs)]
        out = out.replace("...", ell) if "..." in out else ell + out
    sizes = {}
    ops = []
    for t, x in zip(terms, xs):
        if len(t) != rank_of(x):
            raise ShapeError(f"einsum term {t} does not match rank {rank_of(x)}")
        while len(set(t)) != len(t):        # repeated letter: take the diagonal
            ch = next(ch for ch in t if t.count(ch) > 1)
            p, q = t.index(ch), t.index(ch, t.index(ch) + 1)
            n = shape_of(x)[p]
            if not isinstance(n, int) or shape_of(x)[q] != n:
                raise Unsupported("einsum diagonal over symbolic or unequal dims")
            rest = [i for i in range(len(t)) if i not in (p, q)]
            x = c.op("transpose", [x], perm=tuple(rest + [p, q]))
            x = c.reshape(x, [shape_of(x)[i] for i in range(len(rest))] + [n * n])
            x = c.op("slice", [x], axis=len(rest), start=0, step=n + 1, length=n)
            t = "".join(t[i] for i in rest) + ch
        for ch, d in zip(t, shape_of(x)):
            if not (isinstance(d, int) and d == 1):
                sizes[ch] = d
        ops.append((t, x))
    if len(ops) == 2 and _einsum_matmul_ok(ops, out):
        return _einsum_matmul(c, ops, out, sizes)
    allc = out + "".join(sorted(set("".join(terms)) - set(out)))
    prod = None
    for t, x in ops:
        perm = [t.index(ch) for ch in allc if ch in t]
        xt = _transpose(c, x, perm)
        shp = [(sizes.get(ch, 1) if False else shape_of(x)[t.index(ch)]) if ch in t else 1 for ch in allc]
        xt = c.reshape(xt, shp)
        prod = xt if prod is None else c.op("mul", [prod, xt])
    red = list(range(len(out), len(allc)))
    if red:
        prod = c.op("reduce_sum", [prod], axes=red, keepdims=False)
    return c.reshape(prod, [sizes.get(ch, 1) for ch in out]) if rank_of(prod) != len(out) else prod


def _einsum_matmul_ok(ops, out):
    (ta, _), (tb, _) = ops
    shared = set(ta) & set(tb)
    contracted = shared - set(out)
    return bool(contracted) and set(out) <= set(ta) | set(tb) and all(
        ch in out or ch in shared for ch in ta + tb)


def _einsum_matmul(c, ops, out, sizes):
    (ta, a), (tb, b) = ops
    shared = set(ta) & set(tb)
    contracted = [ch for ch in ta if ch in shared and ch not in out]
    batch = [ch for ch in out if ch in shared]
    m = [ch for ch in ta if ch not in shared]
    n = [ch for ch in tb if ch not in shared]
    sz = lambda t, x, ch: shape_of(x)[t.index(ch)]  # noqa: E731
    at = _transpose(c, a, [ta.index(ch) for ch in batch + m + contracted])
    bt = _transpose(c, b, [tb.index(ch) for ch in batch + contracted + n])
    bshape_a = [sz(ta, a, ch) for ch in batch]
    bshape_b = [sz(tb, b, ch) for ch in batch]
    M = D.numel([sz(ta, a, ch) for ch in m])
    N = D.numel([sz(tb, b, ch) for ch in n])
    K = D.numel([sz(ta, a, ch) for ch in contracted])
    at = c.reshape(at, bshape_a + [M, K])
    bt = c.reshape(bt, bshape_b + [K, N])
    y = c.op("matmul", [at, bt])
    bsh = list(shape_of(y)[:len(batch)])
    y = c.reshape(y, bsh + [sz(ta, a, ch) for ch in m] + [sz(tb, b, ch) for ch in n])
    cur = batch + m + n
    return _transpose(c, y, [cur.index(ch) for ch in out])


# ---- convolution and pooling ----------------------------------------------------------------
@handler("Conv")
def _conv(c):
    x, w, b = c.inp(0), c.inp(1), c.inp(2)
    nsp = rank_of(x) - 2
    kernel = list(shape_of(w)[2:])
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    pads = _auto_pad(c, shape_of(x)[2:], kernel, strides, dil)
    ins = [x, w] + ([b] if b is not None else [])
    return c.op("conv", ins, strides=tuple(strides), pads=pads, dilations=tuple(dil), groups=c.attr("group", 1))


@handler("ConvTranspose")
def _conv_transpose(c):
    x, w, b = c.inp(0), c.inp(1), c.inp(2)
    nsp = rank_of(x) - 2
    g = c.attr("group", 1)
    kernel = list(shape_of(w)[2:])
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    outpad = c.attr("output_padding") or [0] * nsp
    insp = list(shape_of(x)[2:])
    if not all(isinstance(d, int) for d in insp):
        raise Unsupported("symbolic spatial dims")
    ap = c.attr("auto_pad", "NOTSET")
    out_shape = c.attr("output_shape")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    if out_shape and ap not in ("SAME_UPPER", "SAME_LOWER"):
        # onnx's reference: the declared pads (default 0) at the start, the end cropped / extended to fit
        p = c.attr("pads") or [0] * (2 * nsp)
        pads = [(p[i], s * (n - 1) + op_ + e - p[i] - t)
                for i, (n, s, e, op_, t) in enumerate(zip(insp, strides, eff, outpad, out_shape[-nsp:]))]
    elif out_shape or ap in ("SAME_UPPER", "SAME_LOWER"):
        tgt = out_shape[-nsp:] if out_shape else [n * s for n, s in zip(insp, strides)]
        pads = []
        for n, s, e, op_, t in zip(insp, strides, eff, outpad, tgt):
            total = s * (n - 1) + op_ + e - t
            lo = total // 2 if (ap != "SAME_LOWER" and not out_shape) or (out_shape and ap != "SAME_LOWER") else total - total // 2
            if ap == "SAME_LOWER":
                lo = total - total // 2
            pads.append((lo, total - lo))
    elif ap == "VALID":
        pads = [(0, 0)] * nsp
    else:
        p = c.attr("pads") or [0] * (2 * nsp)
        pads = [(p[i], p[i + nsp]) for i in range(nsp)]
    # zero-insertion upsampling of x, then a conv with the flipped, transposed kernel
    N, C = shape_of(x)[:2]
    y = x
    if any(s > 1 for s in strides):
        shp, exp_shape, final = [N, C], [N, C], [N, C]
        for n, s in zip(insp, strides):
            shp += [n, 1]
            exp_shape += [n, s]
            final += [n * s]
        y = c.reshape(y, shp)
        padspec = [(0, 0)] * 2 + sum([[(0, 0), (0, s - 1)] for s in strides], [])
        y = c.op("pad", [y], pads=padspec, value=0.0)
        y = c.reshape(y, final)
        for k, (n, s) in enumerate(zip(insp, strides)):
            if s > 1:
                y = c.op("slice", [y], axis=2 + k, start=0, step=1, length=(n - 1) * s + 1)
    conv_pads = []
    for e, (lo, hi), op_ in zip(eff, pads, outpad):
        conv_pads.append((e - 1 - lo, e - 1 - hi + op_))
    # negative conv pads crop: apply them with a pad op first
    if any(lo < 0 or hi < 0 for lo, hi in conv_pads):
        y = c.op("pad", [y], pads=[(0, 0), (0, 0)] + [(min(lo, 0), min(hi, 0)) for lo, hi in conv_pads], value=0.0)
        conv_pads = [(max(lo, 0), max(hi, 0)) for lo, hi in conv_pads]
    Cin, Og = shape_of(w)[:2]
    if isinstance(w, np.ndarray):
        wk = w.reshape((g, Cin // g, Og) + tuple(kernel))
        wk = np.flip(wk, axis=tuple(range(3, 3 + nsp)))
        wk = _contig(np.swapaxes(wk, 1, 2).reshape((g * Og, Cin // g) + tuple(kernel)))
    else:
        wk = c.reshape(w, (g, Cin // g, Og) + tuple(kernel))
        for k, kk in enumerate(kernel):
            if kk > 1:
                wk = c.op("slice", [wk], axis=3 + k, start=kk - 1, step=-1, length=kk)
        wk = c.op("transpose", [wk], perm=(0, 2, 1) + tuple(range(3, 3 + nsp)))
        wk = c.reshape(wk, (g * Og, Cin // g) + tuple(kernel))
    ins = [y, wk] + ([b] if b is not None else [])
    return c.op("conv", ins, strides=(1,) * nsp, pads=conv_pads, dilations=tuple(dil), groups=g)


def _pool(kind):
    def h(c):
        x = c.inp(0)
        nsp = rank_of(x) - 2
        kernel = c.attr("kernel_shape")
        strides = c.attr("strides") or [1] * nsp
        dil = c.attr("dilations") or [1] * nsp
        want_idx = len(c.node.output) > 1 and bool(c.node.output[1])
        ceil = bool(c.attr("ceil_mode", 0))
        ap = c.attr("auto_pad", "NOTSET")
        if ap in ("SAME_UPPER", "SAME_LOWER"):
            pads = []
            for n, k, s, d in zip(shape_of(x)[2:], kernel, strides, dil):
                o = -(-n // s)
                total = max((o - 1) * s + (k - 1) * d + 1 - n, 0)
                small = total // 2
                pads.append((small, total - small) if ap == "SAME_UPPER" else (total - small, small))
        else:
            pads = _auto_pad(c, shape_of(x)[2:], kernel, strides, dil)
        attrs = dict(kernel=tuple(kernel), strides=tuple(strides), pads=pads, dilations=tuple(dil), ceil_mode=ceil)
        if kind == "avg_pool":
            attrs["count_include_pad"] = bool(c.attr("count_include_pad", 0))
        if want_idx:
            if kind != "max_pool" or not dtype_of(x).startswith("float"):
                raise Unsupported("Indices output")
            return _max_pool_with_indices(c, x, kernel, strides, pads, dil, ceil)
        if kind == "max_pool" and dtype_of(x) in ("uint8", "int8"):     # exact in float32
            return c.cast(c.op(kind, [c.cast(x, "float32")], **attrs), dtype_of(x))
        return c.op(kind, [x], **attrs)
    return h


handler("MaxPool")(_pool("max_pool"))
handler("AveragePool")(_pool("avg_pool"))


@handler("LpPool")
def _lppool(c):
    x = c.inp(0)
    p = c.attr("p", 2)
    dt = dtype_of(x)
    kernel = c.attr("kernel_shape")
    nsp = rank_of(x) - 2
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    pads = _auto_pad(c, shape_of(x)[2:], kernel, strides, dil)
    xp = c.op("pow", [c.op("abs", [x]), c.scalar(p, dt)])
    s = c.op("avg_pool", [xp], kernel=tuple(kernel), strides=tuple(strides), pads=pads, dilations=tuple(dil),
             ceil_mode=bool(c.attr("ceil_mode", 0)), count_include_pad=True)
    s = c.op("mul", [s, c.scalar(math.prod(kernel), dt)])
    return c.op("pow", [s, c.scalar(1.0 / p, dt)])


@handler("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _gpool(c):
    x = c.inp(0)
    axes = tuple(range(2, rank_of(x)))
    if c.node.op_type == "GlobalLpPool":
        p = c.attr("p", 2)
        dt = dtype_of(x)
        s = c.op("reduce_sum", [c.op("pow", [c.op("abs", [x]), c.scalar(p, dt)])], axes=axes, keepdims=True)
        return c.op("pow", [s, c.scalar(1.0 / p, dt)])
    return c.op("reduce_mean" if c.node.op_type == "GlobalAveragePool" else "reduce_max", [x], axes=axes,
                keepdims=True)


# ---- normalisation --------------------------------------------------------------------------
@handler("BatchNormalization")
def _bn(c):
    if c.attr("training_mode", 0) or any(o for o in c.node.output[1:]):
        return _bn_training(c)
    x = c.inp(0)
    if c.opset < 7 and c.attr("is_test", 0) == 0 and False:
        raise Unsupported("training")
    params = [c.inp(i) for i in range(1, 5)]
    return c.op("batch_norm", [x] + params, eps=c.attr("epsilon", 1e-5))


def _bn_training(c):
    """Batch statistics normalise; the running mean / var outputs are updated with momentum."""
    x, scale, bias, mean, var = (c.inp(i) for i in range(5))
    if c.opset < 14:
        raise Unsupported("training mode before opset 14")
    r, dt = rank_of(x), dtype_of(x)
    axes = (0,) + tuple(range(2, r))
    m = c.op("reduce_mean", [x], axes=axes, keepdims=True)
    d = c.op("sub", [x, m])
    v = c.op("reduce_mean", [c.op("mul", [d, d])], axes=axes, keepdims=True)
    ps = [shape_of(x)[1]] + [1] * (r - 2)
    y = c.op("div", [d, c.op("sqrt", [c.op("add", [v, c.scalar(c.attr("epsilon", 1e-5), dt)])])])
    y = c.op("add", [c.op("mul", [y, c.reshape(scale, ps)]), c.reshape(bias, ps)])
    mom = c.attr("momentum", 0.9)
    C = shape_of(x)[1]
    upd = [c.op("add", [c.op("mul", [s0, c.scalar(mom, dt)]), c.op("mul", [c.reshape(s1, [C]), c.scalar(1 - mom, dt)])])
           for s0, s1 in ((mean, m), (var, v))]
    return [y] + upd


@handler("InstanceNormalization")
def _instnorm(c):
    x, s, b = c.inp(0), c.inp(1), c.inp(2)
    r = rank_of(x)
    y = c.op("layer_norm", [c.reshape(x, list(shape_of(x)[:2]) + [D.numel(shape_of(x)[2:])])], axis=2,
             eps=c.attr("epsilon", 1e-5))
    y = c.reshape(y, shape_of(x))
    ps = [shape_of(x)[1]] + [1] * (r - 2)
    return c.op("add", [c.op("mul", [y, c.reshape(s, ps)]), c.reshape(b, ps)])


def _expand_param(c, p, inner):
    if p is None:
        return None
    if D.dims_equal(D.numel(shape_of(p)), D.numel(inner)):
        return p
    if isinstance(p, np.ndarray):
        return _contig(np.broadcast_to(p, tuple(int(d) for d in inner)))
    return c.op("expand", [p], shape=tuple(inner))


@handler("LayerNormalization")
def _layernorm(c):
    x, s, b = c.inp(0), c.inp(1), c.inp(2)
    r = rank_of(x)
    axis = _norm_axis(c.attr("axis", -1), r)
    eps = c.attr("epsilon", 1e-5)
    inner = shape_of(x)[axis:]
    want_stats = any(o for o in c.node.output[1:])
    if not want_stats and dtype_of(x) == "float32":
        return c.op("layer_norm", [x, _expand_param(c, s, inner)] + ([_expand_param(c, b, inner)] if b is not None else []),
                    axis=axis, eps=eps)
    dt = dtype_of(x)
    axes = tuple(range(axis, r))
    mu = c.op("reduce_mean", [x], axes=axes, keepdims=True)
    d = c.op("sub", [x, mu])
    var = c.op("reduce_mean", [c.op("mul", [d, d])], axes=axes, keepdims=True)
    inv = c.op("rsqrt", [c.op("add", [var, c.scalar(eps, dt)])])
    y = c.op("mul", [c.op("mul", [d, inv]), s])
    if b is not None:
        y = c.op("add", [y, b])
    return [y, mu, inv]


@handler("RMSNormalization")
def _rmsnorm(c):
    x, s = c.inp(0), c.inp(1)
    axis = _norm_axis(c.attr("axis", -1), rank_of(x))
    inner = shape_of(x)[axis:]
    if dtype_of(x) != "float32":
        raise Unsupported("non-float32")
    return c.op("rms_norm", [x, _expand_param(c, s, inner)], axis=axis, eps=c.attr("epsilon", 1e-5))


@handler("GroupNormalization")
def _groupnorm(c):
    x, s, b = c.inp(0), c.inp(1), c.inp(2)
    G = c.attr("num_groups")
    sh = shape_of(x)
    N, C = sh[:2]
    if not isinstance(C, int):
        raise Unsupported("symbolic channels")
    y = c.reshape(x, [N, G, D.numel([C // G] + list(sh[2:]))])
    y = c.op("layer_norm", [y], axis=2, eps=c.attr("epsilon", 1e-5))
    y = c.reshape(y, sh)
    if c.opset < 21:
        idx = np.arange(C) // (C // G)
        s = np.take(s, idx) if isinstance(s, np.ndarray) else c.op("gather", [s, idx], axis=0)
        b = np.take(b, idx) if isinstance(b, np.ndarray) else c.op("gather", [b, idx], axis=0)
    ps = [C] + [1] * (len(sh) - 2)
    return c.op("add", [c.op("mul", [y, c.reshape(s, ps)]), c.reshape(b, ps)])


@handler("LpNormalization")
def _lpnorm(c):
    x = c.inp(0)
    axis = _norm_axis(c.attr("axis", -1), rank_of(x))
    p = c.attr("p", 2)
    if p == 1:
        n = c.op("reduce_sum", [c.op("abs", [x])], axes=(axis,), keepdims=True)
    elif p == 2:
        n = c.op("sqrt", [c.op("reduce_sum", [c.op("mul", [x, x])], axes=(axis,), keepdims=True)])
    else:
        raise Unsupported(f"p={p}")
    zero = c.op("eq", [n, c.scalar(0, dtype_of(x))])          # a zero vector stays zero (onnx's reference)
    return c.op("div", [x, c.op("where", [zero, c.scalar(1, dtype_of(x)), n])])


@handler("LRN")
def _lrn(c):
    x = c.inp(0)
    dt = dtype_of(x)
    size = c.attr("size")
    alpha, beta, bias = c.attr("alpha", 1e-4), c.attr("beta", 0.75), c.attr("bias", 1.0)
    C = shape_of(x)[1]
    sq = c.op("mul", [x, x])
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    p = c.op("pad", [sq], pads=[(0, 0), (lo, hi)] + [(0, 0)] * (rank_of(x) - 2), value=0.0)
    acc = None
    for k in range(size):
        s = c.op("slice", [p], axis=1, start=k, step=1, length=C)
        acc = s if acc is None else c.op("add", [acc, s])
    den = c.op("add", [c.op("mul", [acc, c.scalar(alpha / size, dt)]), c.scalar(bias, dt)])
    return c.op("div", [x, c.op("pow", [den, c.scalar(beta, dt)])])


def _softmax(kind):
    def h(c):
        x = c.inp(0)
        r = rank_of(x)
        if c.opset < 13:
            axis = _norm_axis(c.attr("axis", 1), r)
            sh = shape_of(x)
            x2 = c.reshape(x, [D.numel(sh[:axis]), D.numel(sh[axis:])])
            y = _softmax_axis(c, kind, x2, 1)
            return c.reshape(y, sh)
        return _softmax_axis(c, kind, x, _norm_axis(c.attr("axis", -1), r))
    return h


def _softmax_axis(c, kind, x, axis):
    if kind == "hardmax":
        am = c.op("argmax", [x], axis=axis, keepdims=True)
        n = shape_of(x)[axis]
        io = c.op("iota", [], length=n, dtype="int64")
        io = c.reshape(io, [n] + [1] * (rank_of(x) - axis - 1))
        return c.op("cast", [c.op("eq", [am, io])], to=dtype_of(x))
    return c.op(kind, [x], axis=axis)


handler("Softmax")(_softmax("softmax"))
handler("LogSoftmax")(_softmax("log_softmax"))
handler("Hardmax")(_softmax("hardmax"))


# ---- reductions ---------------------------------------------------------------------------
def _reduce_axes(c, since):
    x = c.inp(0)
    r = rank_of(x)
    if c.opset >= since:
        axes = c.known(1, "axes")
        axes = None if axes is None else _ints(axes)
    else:
        axes = c.attr("axes")
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            return x, None
        axes = list(range(r))
    return x, tuple(sorted(_norm_axis(a, r) for a in axes))


def _reduce(kind):
    def h(c):
        since = 13 if c.node.op_type == "ReduceSum" else 18
        x, axes = _reduce_axes(c, since)
        kd = bool(c.attr("keepdims", 1))
        dt = dtype_of(x)
        if axes is None:
            if kind == "l1":
                return c.op("abs", [x])
            if kind in ("l2",):
                return c.op("abs", [x])
            if kind == "sumsq":
                return c.op("mul", [x, x])
            if kind == "logsum":
                return c.op("log", [x])
            if kind == "logsumexp":
                return c.op("log", [c.op("exp", [x])])
            return x
        if kind in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"):
            if any(isinstance(shape_of(x)[a], int) and shape_of(x)[a] == 0 for a in axes) and \
                    kind in ("reduce_max", "reduce_min") and not dt.startswith(("float", "bfloat")):
                if not all(isinstance(d, int) for d in shape_of(x)):
                    raise Unsupported("empty integer max/min over symbolic dims")
                info = (0, 1) if dt == "bool" else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
                oshape = [1 if i in axes else d for i, d in enumerate(shape_of(x)) if kd or i not in axes]
                return np.full(oshape, info[0] if kind == "reduce_max" else info[1], dtype=dt)
            return c.op(kind, [x], axes=axes, keepdims=kd)
        if kind == "l1":
            return c.op("reduce_sum", [c.op("abs", [x])], axes=axes, keepdims=kd)
        if kind == "l2":
            return c.op("sqrt", [c.op("reduce_sum", [c.op("mul", [x, x])], axes=axes, keepdims=kd)]) \
                if dt.startswith(("float", "bfloat")) else _int_l2(c, x, axes, kd)
        if kind == "sumsq":
            return c.op("reduce_sum", [c.op("mul", [x, x])], axes=axes, keepdims=kd)
        if kind == "logsum":
            return c.op("log", [c.op("reduce_sum", [x], axes=axes, keepdims=kd)])
        if kind == "logsumexp":
            m = c.op("reduce_max", [x], axes=axes, keepdims=True)
            m = c.op("where", [c.op("isinf", [m]), c.scalar(0, dt), m])
            s = c.op("reduce_sum", [c.op("exp", [c.op("sub", [x, m])])], axes=axes, keepdims=kd)
            mm = m if kd else c.reshape(m, shape_of(s))
            return c.op("add", [c.op("log", [s]), mm])
        raise Unsupported(kind)
    return h


def _int_l2(c, x, axes, kd):
    s = c.op("reduce_sum", [c.op("mul", [x, x])], axes=axes, keepdims=kd)
    return c.op("cast", [c.op("sqrt", [c.op("cast", [s], to="float64")])], to=dtype_of(x))


for _k, _v in {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max",
               "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod", "ReduceL1": "l1", "ReduceL2": "l2",
               "ReduceSumSquare": "sumsq", "ReduceLogSum": "logsum", "ReduceLogSumExp": "logsumexp"}.items():
    handler(_k)(_reduce(_v))


def _arg(kind):
    def h(c):
        x = c.inp(0)
        return c.op(kind, [x], axis=_norm_axis(c.attr("axis", 0), rank_of(x)), keepdims=bool(c.attr("keepdims", 1)),
                    select_last_index=bool(c.attr("select_last_index", 0)))
    return h


handler("ArgMax")(_arg("argmax"))
handler("ArgMin")(_arg("argmin"))


@handler("CumSum")
def _cumsum(c):
    x = c.inp(0)
    axis = int(np.asarray(c.known(1, "axis")).ravel()[0])
    return c.op("cumsum", [x], axis=_norm_axis(axis, rank_of(x)), exclusive=bool(c.attr("exclusive", 0)),
                reverse=bool(c.attr("reverse", 0)))


# ---- shape values -------------------------------------------------------------------------
@handler("Shape")
@symfold("Shape")
def _shape(c, ins=None):
    x = c.inp(0)
    sh = list(shape_of(x))
    r = len(sh)
    start, end = c.attr("start", 0), c.attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return _sym_array(sh[start:end])


@handler("Size")
@symfold("Size")
def _size(c, ins=None):
    return _sym_array([D.numel(shape_of(c.inp(0)))], shape=())


@handler("Constant")
def _constant(c):
    for a in c.node.attribute:
        if a.name == "value":
            return _tensor_to_numpy(a.t, f"{c.loc} value")
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
    v = _tensor_to_numpy(t, "value") if t is not None else np.zeros(1, np.float32)
    shape = [_dim(d) for d in np.asarray(shape).ravel()]
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ShapeError(f"negative dim in {shape}")
    if all(isinstance(d, int) for d in shape) and math.prod(shape) <= 4096:
        return np.full(shape, v.ravel()[0], dtype=v.dtype)
    return c.op("full", [], shape=tuple(shape), value=v.ravel()[0].item(), dtype=str(v.dtype))


def _shape_input(c, i):
    s = c.known(i, "shape")
    return [_dim(d) for d in np.asarray(s).ravel()]


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
        return None if a is None else _ints(a)
    return c.attr("axes")


@handler("Squeeze")
@symfold("Squeeze")
def _squeeze(c, ins=None):
    x = c.inp(0)
    sh = shape_of(x)
    axes = _axes_arg(c, 13)
    if axes is None:
        axes = [i for i, d in enumerate(sh) if isinstance(d, int) and d == 1]
    axes = {_norm_axis(a, len(sh)) for a in axes}
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
    axes = sorted(_norm_axis(a, r) for a in axes)
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
    return _transpose(c, x, perm)


@handler("Expand")
@symfold("Expand")
def _expand(c, ins=None):
    x = c.inp(0)
    shape = _shape_input(c, 1)
    out = broadcast(tuple(shape_of(x)), tuple(shape))
    if isinstance(x, np.ndarray):
        if _is_sym(x) or math.prod(int(d) for d in out) <= 4096:
            return _contig(np.broadcast_to(x, tuple(int(d) for d in out)))
    if tuple(out) == tuple(shape_of(x)):
        return x
    return c.op("expand", [x], shape=tuple(out))


@handler("Concat")
@symfold("Concat")
def _concat(c, ins=None):
    xs = [c.inp(i) for i in range(len(c.node.input))]
    xs = [x for x in xs if x is not None]
    r = rank_of(xs[0])
    axis = _norm_axis(c.attr("axis", 0 if c.opset < 4 else None), r)
    if all(isinstance(x, np.ndarray) for x in xs):
        if any(_is_sym(x) for x in xs):
            return _maybe_int(np.concatenate([x.astype(object) for x in xs], axis=axis))
        return np.concatenate(xs, axis=axis)
    xs = [x for x in xs if not (isinstance(shape_of(x)[axis], int) and shape_of(x)[axis] == 0)] or xs[:1]
    if len(xs) == 1:
        return xs[0]
    return c.op("concat", xs, axis=axis)


@handler("Split")
def _split(c):
    x = c.inp(0)
    sh = shape_of(x)
    axis = _norm_axis(c.attr("axis", 0), len(sh))
    nout = len(c.node.output)
    if c.opset >= 13:
        sp = c.known(1, "split")
        sp = None if sp is None else _ints(sp)
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


def _clamp_slice(n, s, e, st):
    if isinstance(n, int):
        if s < 0:
            s += n
        if e < 0:
            e += n
        if st > 0:
            s = min(max(s, 0), n)
            e = min(max(e, 0), n)
            length = max(0, -(-(e - s) // st))
        else:
            s = min(max(s, -1), n - 1)
            e = min(max(e, -1), n - 1)
            length = max(0, -(-(s - e) // -st))
        return s, length
    if st != 1:
        raise Unsupported("symbolic slice with a step")
    big = 2**62
    s = D.as_dim(n + s) if s < 0 else s
    e = n if e >= big else (D.as_dim(n + e) if e < 0 else e)
    return s, D.as_dim(e - s)


@handler("Slice")
@symfold("Slice")
def _slice(c, ins=None):
    x = c.inp(0)
    sh = shape_of(x)
    r = len(sh)
    if c.opset < 10:
        starts, ends = c.attr("starts"), c.attr("ends")
        axes = c.attr("axes") or list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(c.known(1, "starts")), _ints(c.known(2, "ends"))
        a = c.known(3, "axes")
        axes = _ints(a) if a is not None else list(range(len(starts)))
        s = c.known(4, "steps")
        steps = _ints(s) if s is not None else [1] * len(starts)
    y = x
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = _norm_axis(ax, r)
        if st == 0:
            raise ShapeError("slice step 0")
        start, length = _clamp_slice(sh[ax], s, e, st)
        if isinstance(y, np.ndarray):
            idx = start + st * np.arange(length)
            y = np.take(y, idx.astype(np.int64), axis=ax)
            continue
        if isinstance(length, int) and isinstance(sh[ax], int) and start == 0 and st == 1 and length == sh[ax]:
            continue
        y = c.op("slice", [y], axis=ax, start=start, step=st, length=length)
    return y


@handler("Gather")
@symfold("Gather")
def _gather(c, ins=None):
    x, idx = c.inp(0), c.inp(1)
    axis = _norm_axis(c.attr("axis", 0), rank_of(x))
    if isinstance(x, np.ndarray) and isinstance(idx, np.ndarray):
        n = x.shape[axis]
        i = np.where(idx < 0, idx + n, idx)
        if i.size and (i.min() < 0 or i.max() >= n):
            raise ShapeError(f"gather index out of range for a dim of size {n}")
        if _is_sym(x):
            return _maybe_int(np.asarray(np.take(x, i, axis=axis), dtype=object))
        return np.take(x, i, axis=axis)
    if isinstance(idx, np.ndarray) and idx.dtype not in (np.int64, np.int32):
        idx = idx.astype(np.int64)
    return c.op("gather", [x, idx], axis=axis)


@handler("GatherElements")
def _gather_el(c):
    x, idx = c.inp(0), c.inp(1)
    return c.op("gather_elements", [x, idx], axis=_norm_axis(c.attr("axis", 0), rank_of(x)))


@handler("GatherND")
def _gather_nd(c):
    x, idx = c.inp(0), c.inp(1)
    bd = c.attr("batch_dims", 0)
    if bd:      # batch dims fold into the linear index: gather from x flattened over batch + indexed dims
        xs, ishape = shape_of(x), shape_of(idx)
        m = ishape[-1]
        if not all(isinstance(d, int) for d in list(xs[:bd + (m if isinstance(m, int) else 0)]) + [m]):
            raise Unsupported("symbolic batch or index dims")
        inner = int(math.prod(xs[bd:bd + m]))
        strides = np.array([int(math.prod(xs[bd + k + 1:bd + m])) for k in range(m)], np.int64)
        dims = np.array(xs[bd:bd + m], np.int64)
        idx = c.cast(idx, "int64")
        fixed = c.op("where", [c.op("lt", [idx, c.scalar(0, "int64")]), c.op("add", [idx, dims]), idx])
        lin = c.op("reduce_sum", [c.op("mul", [fixed, strides])], axes=(len(ishape) - 1,), keepdims=False)
        nb = int(math.prod(xs[:bd]))
        boff = (np.arange(nb, dtype=np.int64) * inner).reshape(list(xs[:bd]) + [1] * (len(ishape) - 1 - bd))
        lin = c.op("add", [lin, boff])
        return c.op("gather", [c.reshape(x, [nb * inner] + list(xs[bd + m:])), lin], axis=0)
    xs, ishape = shape_of(x), shape_of(idx)
    m = ishape[-1]
    if not isinstance(m, int) or not all(isinstance(d, int) for d in xs[:m]):
        raise Unsupported("symbolic index depth")
    strides = [int(math.prod(xs[k + 1:m])) for k in range(m)]
    dims = np.array(xs[:m], np.int64)
    idx = c.cast(idx, "int64")
    if isinstance(idx, np.ndarray):
        lin = (np.where(idx < 0, idx + dims, idx) * np.array(strides)).sum(-1)
    else:
        neg = c.op("lt", [idx, c.scalar(0, "int64")])
        fixed = c.op("where", [neg, c.op("add", [idx, dims]), idx])
        lin = c.op("reduce_sum", [c.op("mul", [fixed, np.array(strides, np.int64)])], axes=(len(ishape) - 1,),
                   keepdims=False)
    flat = c.reshape(x, [int(math.prod(xs[:m]))] + list(xs[m:]))
    return c.op("gather", [flat, lin], axis=0)


@handler("Pad")
def _pad(c):
    x = c.inp(0)
    r = rank_of(x)
    mode = c.attr("mode", "constant")
    if c.opset < 11:
        pads = c.attr("pads") or c.attr("paddings")
        value = c.attr("value", 0.0)
        axes = list(range(r))
    else:
        pads = _ints(c.known(1, "pads"))
        v = c.inp(2)
        if isinstance(v, Value):
            value = v             # a run-time pad value: pad with 0, then select it through a constant mask
        else:
            value = 0 if v is None or v.size == 0 else v.ravel()[0].item()
        a = c.known(3, "axes")
        axes = [_norm_axis(k, r) for k in _ints(a)] if a is not None else list(range(r))
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise Unsupported(f"mode {mode}")
    na = len(axes)
    if len(pads) != 2 * na:
        raise ShapeError(f"pads {pads} do not fit {na} axes")
    full = [(0, 0)] * r
    for k, ax in enumerate(axes):
        full[ax] = (pads[k], pads[k + na])
    if all(p == (0, 0) for p in full):
        return x
    if mode == "wrap":
        if any(lo < 0 or hi < 0 for lo, hi in full) or any(
                (lo or hi) and (not isinstance(shape_of(x)[k], int) or max(lo, hi) > shape_of(x)[k])
                for k, (lo, hi) in enumerate(full)):
            raise Unsupported("wrap padding by more than the dim, or cropping")
        for k, (lo, hi) in enumerate(full):
            n = shape_of(x)[k]
            parts = ([c.op("slice", [x], axis=k, start=n - lo, length=lo)] if lo else []) + [x] + (
                [c.op("slice", [x], axis=k, start=0, length=hi)] if hi else [])
            x = parts[0] if len(parts) == 1 else c.op("concat", parts, axis=k)
        return x
    if isinstance(value, Value):
        if mode != "constant" or not all(isinstance(d, int) for d in shape_of(x)):
            raise Unsupported("run-time pad value")
        y = c.op("pad", [x], pads=full, value=0, mode=mode)
        mask = np.pad(np.ones(shape_of(x), bool), [(max(lo, 0), max(hi, 0)) for lo, hi in full])
        mask = mask[tuple(slice(max(-lo, 0), mask.shape[k] - max(-hi, 0)) for k, (lo, hi) in enumerate(full))]
        return c.op("where", [mask, y, c.reshape(value, [])])
    return c.op("pad", [x], pads=full, value=value, mode=mode)


@handler("Tile")
def _tile(c):
    x = c.inp(0)
    reps = _ints(c.known(1, "repeats"))
    sh = shape_of(x)
    if len(reps) != len(sh):
        raise ShapeError(f"repeats {reps} do not fit rank {len(sh)}")
    if all(r == 1 for r in reps):
        return x
    inter, exp_, final = [], [], []
    for d, r in zip(sh, reps):
        inter += [1, d]
        exp_ += [r, d]
        final.append(D.as_dim(d * r))
    y = c.reshape(x, inter)
    y = c.op("expand", [y], shape=tuple(exp_))
    return c.reshape(y, final)


@handler("EyeLike")
def _eyelike(c):
    x = c.inp(0)
    sh = shape_of(x)
    if not all(isinstance(d, int) for d in sh):
        raise Unsupported("symbolic shape")
    dt = c.attr("dtype")
    dt = ONNX_DTYPES.get(dt) if dt is not None else dtype_of(x)
    if dt is None:
        raise Unsupported("dtype")
    return np.eye(sh[0], sh[1], k=c.attr("k", 0), dtype=dt)


@handler("Trilu")
def _trilu(c):
    x = c.inp(0)
    k = c.known(1, "k")
    k = 0 if k is None else int(np.asarray(k).ravel()[0])
    sh = shape_of(x)
    n, m = sh[-2], sh[-1]
    if not (isinstance(n, int) and isinstance(m, int)):
        raise Unsupported("symbolic matrix dims")
    ones = np.ones((n, m), bool)
    mask = np.triu(ones, k) if c.attr("upper", 1) else np.tril(ones, k)
    return c.op("where", [mask, x, c.scalar(0, dtype_of(x))])


@handler("DepthToSpace")
def _d2s(c):
    x = c.inp(0)
    b = c.attr("blocksize")
    N, C, H, W = shape_of(x)
    if c.attr("mode", "DCR") == "DCR":
        y = c.reshape(x, [N, b, b, C // (b * b), H, W])
        y = _transpose(c, y, (0, 3, 4, 1, 5, 2))
    else:
        y = c.reshape(x, [N, C // (b * b), b, b, H, W])
        y = _transpose(c, y, (0, 1, 4, 2, 5, 3))
    return c.reshape(y, [N, C // (b * b), H * b, W * b])


@handler("SpaceToDepth")
def _s2d(c):
    x = c.inp(0)
    b = c.attr("blocksize")
    N, C, H, W = shape_of(x)
    y = c.reshape(x, [N, C, H // b, b, W // b, b])
    y = _transpose(c, y, (0, 3, 5, 1, 2, 4) if c.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4))
    return c.reshape(y, [N, C * b * b, H // b, W // b])


@handler("OneHot")
def _onehot(c):
    idx, depth, values = c.inp(0), c.known(1, "depth"), c.inp(2)
    depth = int(np.asarray(depth).ravel()[0])
    r = rank_of(idx) + 1
    axis = _norm_axis(c.attr("axis", -1), r)
    dt = dtype_of(values)
    idx = c.cast(idx, "int64")
    if isinstance(idx, np.ndarray):
        idx = c.val(idx)
    idx = c.op("where", [c.op("lt", [idx, c.scalar(0, "int64")]), c.op("add", [idx, c.scalar(depth, "int64")]), idx])
    sh = list(shape_of(idx))
    sh.insert(axis, 1)
    idx = c.reshape(idx, sh)
    io = np.arange(depth, dtype=np.int64).reshape([depth] + [1] * (r - axis - 1))
    hit = c.op("eq", [idx, io])
    if isinstance(values, np.ndarray):
        off, on = values.ravel()[0], values.ravel()[1]
        return c.op("where", [hit, np.array(on, dt), np.array(off, dt)])
    off = c.reshape(c.op("slice", [values], axis=0, start=0, step=1, length=1), [])
    on = c.reshape(c.op("slice", [values], axis=0, start=1, step=1, length=1), [])
    return c.op("where", [hit, on, off])


# ---- symbolic folding of shape arithmetic --------------------------------------------------
def _sym_binary(fn):
    def f(c, ins):
        a, b = ins
        a = a.astype(object) if _is_sym(a) or _is_sym(b) else a
        b = b.astype(object) if _is_sym(a) or _is_sym(b) else b
        out = np.vectorize(lambda p, q: _dim(fn(p, q)), otypes=[object])(a, b)
        return _maybe_int(np.asarray(out, dtype=object))
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
    if to in ("int64", "int32") and _is_sym(ins[0]):
        return ins[0]
    if _is_sym(ins[0]):
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
    return _maybe_int(np.asarray(acc, dtype=object))


@symfold("Where")
def _sym_where(c, ins):
    cond, a, b = ins
    if _is_sym(cond):
        raise Unsupported("symbolic condition")
    return _maybe_int(np.where(cond, a.astype(object), b.astype(object)))


__all__ = ["NeedsConstant", "Value"]


# ---- resize: separable per-axis linear maps computed at compile time ---------------------------
def _resize_coeff_fn(mode, nearest_mode, cubic_a, antialias):
    from onnx.reference.ops import op_resize as R
    if mode == "nearest":
        return lambda x, s: R._nearest_coeffs(x, mode=nearest_mode)
    if mode == "cubic":
        f = R._cubic_coeffs_antialias if antialias else R._cubic_coeffs
        return lambda x, s: f(x, s, A=cubic_a)
    if mode == "linear":
        return R._linear_coeffs_antialias if antialias else R._linear_coeffs
    raise Unsupported(f"mode {mode!r}")


@handler("Resize", "Upsample")
def _resize(c):
    x = c.inp(0)
    sh = shape_of(x)
    r = len(sh)
    if not all(isinstance(d, int) for d in sh):
        raise Unsupported("symbolic input shape")
    mode = c.attr("mode", "nearest")
    if c.node.op_type == "Upsample" or c.opset < 11:
        ctm, nearest_mode = "asymmetric", "floor"
        if c.node.op_type == "Upsample" and c.opset < 9:
            scales = c.attr("scales")
        else:
            scales = c.known(1, "scales")
            scales = None if scales is None else [float(v) for v in np.asarray(scales).ravel()]
        sizes, roi, axes = None, None, None
        if mode == "bilinear":
            mode = "linear"
    else:
        ctm = c.attr("coordinate_transformation_mode", "half_pixel")
        nearest_mode = c.attr("nearest_mode", "round_prefer_floor")
        roi = c.known(1, "roi")
        sc = c.known(2, "scales")
        sz = c.known(3, "sizes")
        scales = [float(v) for v in np.asarray(sc).ravel()] if sc is not None and sc.size else None
        sizes = [int(v) for v in np.asarray(sz).ravel()] if sz is not None and sz.size else None
        axes = c.attr("axes")
        roi = None if roi is None or roi.size == 0 else [float(v) for v in roi.ravel()]
    policy = c.attr("keep_aspect_ratio_policy", "stretch")
    excl = bool(c.attr("exclude_outside", 0))
    extrap = float(c.attr("extrapolation_value", 0.0))
    try:
        fct = _resize_coeff_fn(mode, nearest_mode, c.attr("cubic_coeff_a", -0.75), c.attr("antialias", 0))
        from onnx.reference.ops import op_resize as R
    except ImportError:
        raise Unsupported("needs onnx's reference resize helpers") from None
    # output sizes and scales, exactly as onnx's reference computes them
    if axes is not None:
        axes = [_norm_axis(a, r) for a in axes]
        if scales is not None:
            full = [1.0] * r
            for i, d in enumerate(axes):
                full[d] = scales[i]
            scales = full
        if sizes is not None:
            full = list(sh)
            for i, d in enumerate(axes):
                full[d] = sizes[i]
            sizes = full
        if roi is not None:
            full = [0.0] * r + [1.0] * r
            for i, d in enumerate(axes):
                full[d], full[r + d] = roi[i], roi[len(axes) + i]
            roi = full
    else:
        axes = list(range(r))
    if sizes is not None:
        scales = [sizes[i] / sh[i] for i in range(r)]
        if policy != "stretch":
            s = min(scales[a] for a in axes) if policy == "not_larger" else max(scales[a] for a in axes)
            scales = [s if i in axes else 1.0 for i in range(r)]
            sizes = [int(s * sh[i] + 0.5) if i in axes else sh[i] for i in range(r)]
    elif scales is not None:
        if len(scales) != r:
            raise ShapeError(f"{len(scales)} scales for rank {r}")
        sizes = [int(v) for v in (np.array(scales) * np.array(sh))]
    else:
        raise ShapeError("Resize needs scales or sizes")
    dt = dtype_of(x)
    y = x
    for ax in axes:
        n, m, s = sh[ax], int(sizes[ax]), float(scales[ax])
        if math.isclose(s, 1.0) and m == n and (roi is None or (math.isclose(roi[ax], 0.0) and
                                                               math.isclose(roi[ax + r], 1.0))):
            continue
        aroi = None if roi is None else [roi[ax], roi[ax + r]]
        kw = dict(roi=aroi, exclude_outside=excl, coordinate_transformation_mode=ctm)
        W = R._interpolate_1d_along_axis(np.eye(n), 0, s, m, fct, extrapolation_value=0.0, **kw)
        E = R._interpolate_1d_along_axis(np.zeros((n, 1)), 0, s, m, fct, extrapolation_value=1.0, **kw)[:, 0] != 0
        onehot = np.all((W == 0) | (W == 1), axis=1) & (W.sum(axis=1) == 1)
        if np.all(onehot | E):
            idx = np.where(E, 0, W.argmax(axis=1)).astype(np.int64)
            y = c.op("gather", [y, idx], axis=ax)
        else:
            if not dt.startswith(("float", "bfloat")):
                raise Unsupported(f"{mode} resize of {dt}")
            perm = [i for i in range(r) if i != ax] + [ax]
            inv = [perm.index(i) for i in range(r)]
            yt = _transpose(c, y, perm)
            yt = c.op("matmul", [yt, np.ascontiguousarray(W.T).astype(dt)])
            y = _transpose(c, yt, inv)
        if E.any():
            mask = E.reshape([m] + [1] * (r - ax - 1))
            y = c.op("where", [mask, c.scalar(extrap, dt), y])
    return y


# ---- ops declared in ir/ops/extra.py -----------------------------------------------------------
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


@handler("CumProd")
def _cumprod(c):
    x = c.inp(0)
    axis = int(np.asarray(c.known(1, "axis")).ravel()[0])
    return c.op("cumprod", [x], axis=_norm_axis(axis, rank_of(x)), exclusive=bool(c.attr("exclusive", 0)),
                reverse=bool(c.attr("reverse", 0)))


@handler("ScatterElements", "Scatter")
def _scatter_el(c):
    x, idx, upd = c.inp(0), c.inp(1), c.inp(2)
    return c.op("scatter_elements", [x, idx, upd], axis=_norm_axis(c.attr("axis", 0), rank_of(x)),
                reduction=c.attr("reduction", "none"))


@handler("ScatterND")
def _scatter_nd(c):
    return c.op("scatter_nd", [c.inp(0), c.inp(1), c.inp(2)], reduction=c.attr("reduction", "none"))


@handler("TopK")
def _topk(c):
    x = c.inp(0)
    if c.opset < 10:
        k = c.attr("k")
    else:
        k = int(np.asarray(c.known(1, "k")).ravel()[0])
    return c.op("topk", [x], k=k, axis=_norm_axis(c.attr("axis", -1), rank_of(x)),
                largest=bool(c.attr("largest", 1)), sorted=bool(c.attr("sorted", 1)))


@handler("Range")
def _range_h(c):
    start, limit, delta = (c.known(i, n) for i, n in enumerate(("start", "limit", "delta")))
    if _is_sym(start) or _is_sym(limit) or _is_sym(delta):
        raise Unsupported("Range over symbolic bounds")
    n = max(int(math.ceil((limit.item() - start.item()) / delta.item())), 0)
    if n * start.itemsize > 1 << 28:
        raise ShapeError(f"Range of {n} elements is absurdly large")
    return (start.item() + delta.item() * np.arange(n)).astype(start.dtype)


# ---- quantization ----------------------------------------------------------------------------
def _q_param(c, p, x, axis, block):
    """Scale / zero point broadcast against x (per-tensor, per-axis or blocked)."""
    if p is None or rank_of(p) == 0 or (rank_of(p) == 1 and shape_of(p)[0] == 1 and not block):
        return p if p is None or rank_of(p) == 0 else c.reshape(p, [])
    r = rank_of(x)
    axis = _norm_axis(axis, r)
    if block:
        if isinstance(p, np.ndarray):
            return np.repeat(p, block, axis=axis).take(range(shape_of(x)[axis]), axis=axis)
        c.need_const.update(c._input_ancestors(p))
        raise NeedsConstant("blocked quantization with run-time parameters")
    return c.reshape(p, [shape_of(p)[0]] + [1] * (r - axis - 1))


_QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
           "int32": (-2**31, 2**31 - 1), "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
_QFLOAT = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn")


@handler("QuantizeLinear")
def _quantize(c):
    x, scale, zp = c.inp(0), c.inp(1), c.inp(2)
    r = rank_of(x)
    axis = c.attr("axis", 1)
    block = c.attr("block_size", 0)
    out_dt = dtype_of(zp) if zp is not None else ONNX_DTYPES.get(c.attr("output_dtype", 0) or 2)
    dt = dtype_of(x)
    s = _q_param(c, scale, x, axis, block)
    if out_dt in _QFLOAT:       # x / scale (+ zero point), rounded by the cast to the float format
        y = c.op("div", [x, c.cast(s, dt)])
        if zp is not None:
            y = c.op("add", [y, c.cast(_q_param(c, zp, x, axis, block), dt)])
        return c.op("cast", [y], to=out_dt, saturate=bool(c.attr("saturate", 1)))
    if out_dt not in _QRANGE:
        raise Unsupported(f"quantize to {out_dt}")
    if not c.attr("saturate", 1):
        raise Unsupported("saturate=0")
    y = c.op("round", [c.op("div", [x, c.cast(s, dt)])])
    if zp is not None:
        y = c.op("add", [y, c.cast(_q_param(c, zp, x, axis, block), dt)])
    lo, hi = _QRANGE[out_dt]
    y = c.op("clip", [y], min=float(lo), max=float(hi))
    return c.op("cast", [y], to=out_dt)


@handler("DequantizeLinear")
def _dequantize(c):
    x, scale, zp = c.inp(0), c.inp(1), c.inp(2)
    r = rank_of(x)
    axis = c.attr("axis", 1)
    block = c.attr("block_size", 0)
    sdt = dtype_of(scale)
    y = c.cast(x, "int64" if not dtype_of(x).startswith(("float", "bfloat")) else sdt if "_" in dtype_of(x) else dtype_of(x))
    y = c.val(y) if isinstance(y, np.ndarray) else y
    if zp is not None:
        y = c.op("sub", [y, c.cast(_q_param(c, zp, x, axis, block), dtype_of(y))])
    y = c.cast(y, sdt)
    return c.op("mul", [y, _q_param(c, scale, x, axis, block)])


# ---- control flow: inlined when the condition / trip count is known at compile time ---------------
@handler("If")
def _if(c):
    cond = c.known(0, "cond")
    g = c.attr("then_branch") if bool(np.asarray(cond).ravel()[0]) else c.attr("else_branch")
    return inline_subgraph(c, g, {})


def _stack(c, xs, axis):
    if all(isinstance(x, np.ndarray) and not _is_sym(x) for x in xs):
        return np.stack(xs, axis=axis)
    parts = []
    for x in xs:
        sh = list(shape_of(x))
        sh.insert(_norm_axis(axis, len(sh) + 1), 1)
        parts.append(c.reshape(x, sh))
    return parts[0] if len(parts) == 1 else c.op("concat", parts, axis=axis)


def _take_slice(c, x, axis, t):
    if isinstance(x, np.ndarray):
        return np.take(x, t, axis=axis)
    y = c.op("slice", [x], axis=axis, start=t, step=1, length=1)
    sh = list(shape_of(x))
    del sh[axis]
    return c.reshape(y, sh)


@handler("Loop")
def _loop(c):
    body = c.attr("body")
    M = c.known(0, "M") if c.inp(0) is not None else None
    cond = c.known(1, "cond") if c.inp(1) is not None else None
    trips = int(np.asarray(M).ravel()[0]) if M is not None else MAX_UNROLL
    if M is None and cond is None:
        raise Unsupported("an infinite loop")
    n_carried = len(c.node.input) - 2
    carried = [c.inp(2 + k) for k in range(n_carried)]
    go = True if cond is None else bool(np.asarray(cond).ravel()[0])
    scans = []
    names = [i.name for i in body.input]
    for i in range(min(trips, MAX_UNROLL + 1)):
        if not go:
            break
        if i >= MAX_UNROLL:
            raise Unsupported(f"more than {MAX_UNROLL} iterations")
        bind = {names[0]: np.array(i, np.int64), names[1]: np.array(go)}
        bind.update(zip(names[2:], carried))
        outs = inline_subgraph(c, body, bind)
        if any(o is None for o in outs):
            raise Unsupported("loop body")
        co = outs[0]
        if not isinstance(co, np.ndarray):
            raise Unsupported("a data-dependent loop condition")
        go = bool(np.asarray(co).ravel()[0])
        carried = outs[1:1 + n_carried]
        scans.append(outs[1 + n_carried:])
    n_scan = len(body.output) - 1 - n_carried
    if n_scan and not scans:
        raise Unsupported("a loop with zero iterations and scan outputs")
    return list(carried) + [_stack(c, [s[k] for s in scans], 0) for k in range(n_scan)]


@handler("Scan")
def _scan(c):
    if c.opset < 9:
        raise Unsupported("Scan-8 (batched)")
    body = c.attr("body")
    m = c.attr("num_scan_inputs")
    ins = [c.inp(i) for i in range(len(c.node.input))]
    n = len(ins) - m
    states, xs = ins[:n], ins[n:]
    in_axes = [_norm_axis(a, rank_of(x)) for a, x in zip(c.attr("scan_input_axes") or [0] * m, xs)]
    in_dirs = c.attr("scan_input_directions") or [0] * m
    T = shape_of(xs[0])[in_axes[0]]
    if not isinstance(T, int):
        raise Unsupported("a symbolic scan length")
    if T > MAX_UNROLL:
        raise Unsupported(f"more than {MAX_UNROLL} scan steps")
    names = [i.name for i in body.input]
    ys = []
    for t in range(T):
        bind = dict(zip(names[:n], states))
        for k, x in enumerate(xs):
            bind[names[n + k]] = _take_slice(c, x, in_axes[k], T - 1 - t if in_dirs[k] else t)
        outs = inline_subgraph(c, body, bind)
        if any(o is None for o in outs):
            raise Unsupported("scan body")
        states = outs[:n]
        ys.append(outs[n:])
    n_out = len(body.output) - n
    out_axes = c.attr("scan_output_axes") or [0] * n_out
    out_dirs = c.attr("scan_output_directions") or [0] * n_out
    res = list(states)
    for k in range(n_out):
        seq = [y[k] for y in ys]
        if out_dirs[k]:
            seq = seq[::-1]
        res.append(_stack(c, seq, out_axes[k]))
    return res


@handler("BitCast")
def _bitcast(c):
    to = c.attr("to")
    if to not in ONNX_DTYPES:
        raise Unsupported(f"bitcast to dtype {to}")
    x = c.inp(0)
    if np.dtype(dtype_of(x)).itemsize != np.dtype(ONNX_DTYPES[to]).itemsize:
        raise Unsupported("bitcast between dtypes of different sizes")
    return c.op("bitcast", [x], to=ONNX_DTYPES[to])


# ---- recurrent layers: RNN, GRU, LSTM unrolled over a static sequence length -----------------
_RNN_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_RNN_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _rnn_act(c, name, x, alpha, beta):
    name = name.lower()
    if name in ("tanh", "sigmoid", "relu"):
        return c.op(name, [x])
    dt = dtype_of(x)
    if name == "hardsigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        y = c.op("add", [c.op("mul", [x, c.scalar(a, dt)]), c.scalar(b, dt)])
        return c.op("clip", [y], min=0.0, max=1.0)
    if name == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return c.op("where", [c.op("lt", [x, c.scalar(0, dt)]), c.op("mul", [x, c.scalar(a, dt)]), x])
    if name == "affine":
        return c.op("add", [c.op("mul", [x, c.scalar(alpha, dt)]), c.scalar(beta, dt)])
    if name == "scaledtanh":
        return c.op("mul", [c.op("tanh", [c.op("mul", [x, c.scalar(beta, dt)])]), c.scalar(alpha, dt)])
    raise Unsupported(f"activation {name}")


def _recurrent(kind):
    def h(c):
        x, w, r, b = c.inp(0), c.inp(1), c.inp(2), c.inp(3)
        seq_lens, h0 = c.inp(4), c.inp(5)
        c0 = c.inp(6) if kind == "LSTM" else None
        p = c.inp(7) if kind == "LSTM" else None
        G = _RNN_GATES[kind]
        layout = c.attr("layout", 0)
        direction = c.attr("direction", "forward")
        if isinstance(direction, bytes):
            direction = direction.decode()
        ndir = 2 if direction == "bidirectional" else 1
        H = c.attr("hidden_size") or shape_of(r)[-1]
        clip = c.attr("clip")
        if kind == "LSTM" and c.attr("input_forget", 0):
            raise Unsupported("input_forget=1")
        acts = [a.decode() if isinstance(a, bytes) else a for a in (c.attr("activations") or _RNN_ACTS[kind] * ndir)]
        alphas, betas = c.attr("activation_alpha") or [], c.attr("activation_beta") or []
        if layout:
            x = c.op("transpose", [x], perm=(1, 0, 2))
        S, B, I = shape_of(x)
        if not isinstance(S, int):
            raise Unsupported("symbolic sequence length")
        if seq_lens is not None:
            sl = c.known(4, "sequence_lens")
            if not np.all(np.asarray(sl) == S):
                raise Unsupported("sequence_lens shorter than the sequence")
        dt = dtype_of(x)

        def sl_(v, axis, start, length):
            return c.op("slice", [v], axis=axis, start=start, length=length)

        def add(a, b_):
            return c.op("add", [a, b_])

        def mul(a, b_):
            return c.op("mul", [a, b_])

        ys, hs, cs = [], [], []
        for d in range(ndir):
            reverse = direction == "reverse" or d == 1
            na = len(_RNN_ACTS[kind])
            act = [(acts[d * na + k], alphas[d * na + k] if d * na + k < len(alphas) else None,
                    betas[d * na + k] if d * na + k < len(betas) else None) for k in range(na)]

            def f(k, v):
                if clip is not None:
                    v = c.op("clip", [v], min=-float(clip), max=float(clip))
                return _rnn_act(c, act[k][0], v, act[k][1], act[k][2])
            wd = c.op("transpose", [c.reshape(sl_(w, 0, d, 1), (G * H, I))], perm=(1, 0))
            rd = c.reshape(sl_(r, 0, d, 1), (G * H, H))
            xw = c.op("matmul", [x, wd])                                       # S, B, G*H
            if b is not None:
                bd = c.reshape(sl_(b, 0, d, 1), (2 * G * H,))
                wb, rb = sl_(bd, 0, 0, G * H), sl_(bd, 0, G * H, G * H)
                xw = add(xw, wb) if kind == "GRU" else add(xw, add(wb, rb))
            else:
                rb = None
            rt = c.op("transpose", [rd], perm=(1, 0))
            hp = c.reshape(sl_(h0, 0, d, 1), (B, H)) if h0 is not None else c.op("full", [], shape=(B, H), value=0.0, dtype=dt)
            cp = None
            if kind == "LSTM":
                cp = c.reshape(sl_(c0, 0, d, 1), (B, H)) if c0 is not None else c.op("full", [], shape=(B, H), value=0.0, dtype=dt)
                pd = c.reshape(sl_(p, 0, d, 1), (3 * H,)) if p is not None else None
            outs = [None] * S
            for t in (range(S - 1, -1, -1) if reverse else range(S)):
                xt = c.reshape(sl_(xw, 0, t, 1), (B, G * H))
                if kind == "RNN":
                    hp = f(0, add(xt, c.op("matmul", [hp, rt])))
                elif kind == "LSTM":
                    g = add(xt, c.op("matmul", [hp, rt]))
                    gi, go, gf, gc = (sl_(g, 1, k * H, H) for k in range(4))
                    if pd is not None:
                        gi = add(gi, mul(sl_(pd, 0, 0, H), cp))
                        gf = add(gf, mul(sl_(pd, 0, 2 * H, H), cp))
                    it, ft, ct = f(0, gi), f(0, gf), f(1, gc)
                    cp = add(mul(ft, cp), mul(it, ct))
                    if pd is not None:
                        go = add(go, mul(sl_(pd, 0, H, H), cp))
                    hp = mul(f(0, go), f(2, cp))
                else:   # GRU: z, r, h
                    hr = c.op("matmul", [c.reshape(hp, (B, H)), sl_(rt, 1, 0, 2 * H)])
                    if rb is not None:
                        hr = add(hr, sl_(rb, 0, 0, 2 * H))
                    zr = add(sl_(xt, 1, 0, 2 * H), hr)
                    z, rr = f(0, sl_(zr, 1, 0, H)), f(0, sl_(zr, 1, H, H))
                    rh = sl_(rt, 1, 2 * H, H)
                    if c.attr("linear_before_reset", 0):
                        hh = c.op("matmul", [hp, rh])
                        if rb is not None:
                            hh = add(hh, sl_(rb, 0, 2 * H, H))
                        hh = mul(rr, hh)
                    else:
                        hh = c.op("matmul", [mul(rr, hp), rh])
                        if rb is not None:
                            hh = add(hh, sl_(rb, 0, 2 * H, H))
                    ht = f(1, add(sl_(xt, 1, 2 * H, H), hh))
                    one = c.scalar(1, dt)
                    hp = add(mul(c.op("sub", [one, z]), ht), mul(z, hp))
                outs[t] = c.reshape(hp, (1, 1, B, H))
            ys.append(outs[0] if S == 1 else c.op("concat", outs, axis=0))
            hs.append(c.reshape(hp, (1, B, H)))
            if kind == "LSTM":
                cs.append(c.reshape(cp, (1, B, H)))
        y = ys[0] if ndir == 1 else c.op("concat", ys, axis=1)               # S, D, B, H
        yh = hs[0] if ndir == 1 else c.op("concat", hs, axis=0)
        res = [y, yh]
        if kind == "LSTM":
            res.append(cs[0] if ndir == 1 else c.op("concat", cs, axis=0))
        if layout:
            res = [c.op("transpose", [res[0]], perm=(2, 0, 1, 3))] + [c.op("transpose", [v], perm=(1, 0, 2)) for v in res[1:]]
        return res
    return h


for _k in _RNN_GATES:
    handler(_k)(_recurrent(_k))


@handler("QLinearMatMul")
def _qlinear_matmul(c):
    """Integer matmul of the zero-point-shifted operands, requantized as onnx's reference does."""
    a, as_, azp, b, bs, bzp, ys, yzp = (c.inp(i) for i in range(8))
    out_dt = dtype_of(yzp) if yzp is not None else dtype_of(a)
    if out_dt not in _QRANGE:
        raise Unsupported(f"QLinearMatMul to {out_dt}")
    A = c.cast(a, "int32")
    if azp is not None:
        A = c.op("sub", [A, c.cast(azp, "int32")])
    B = c.cast(b, "int32")
    if bzp is not None:
        B = c.op("sub", [B, c.cast(bzp, "int32")])
    acc = c.cast(c.op("matmul", [A, B]), "float64")
    scale = c.op("div", [c.op("mul", [as_, c.cast(bs, dtype_of(as_))]), c.cast(ys, dtype_of(as_))])
    d = c.op("mul", [acc, c.cast(scale, "float64")])
    if yzp is not None:
        d = c.op("add", [d, c.cast(yzp, "float64")])
    lo, hi = _QRANGE[out_dt]
    return c.cast(c.op("clip", [c.op("round", [d])], min=float(lo), max=float(hi)), out_dt)


@handler("ConvInteger")
def _conv_integer(c):
    """Exact in float64 for 8-bit operands: conv of the zero-point-shifted inputs, cast to int32."""
    x, w, xzp, wzp = (c.inp(i) for i in range(4))
    xf = c.cast(x, "float64")
    if xzp is not None:
        xf = c.op("sub", [xf, c.cast(xzp, "float64")])
    wf = c.cast(w, "float64")
    if wzp is not None:
        wz = c.cast(wzp, "float64")
        if rank_of(wz) == 1 and shape_of(wz)[0] != 1:
            wz = c.reshape(wz, [shape_of(wz)[0]] + [1] * (rank_of(w) - 1))
        wf = c.op("sub", [wf, wz])
    nsp = rank_of(x) - 2
    kernel = c.attr("kernel_shape") or list(shape_of(w)[2:])
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    pads = _auto_pad(c, list(shape_of(x)[2:]), kernel, strides, dil)
    y = c.op("conv", [xf, wf], strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil), groups=c.attr("group", 1))
    return c.cast(y, "int32")


# ---- ai.onnx.preview.training optimizers (one update step; the step count T must be known) ----
def _optimizer(kind):
    nstate = {"Adagrad": 1, "Momentum": 1, "Adam": 2}[kind]

    def h(c):
        n = (len(c.node.input) - 2) // (2 + nstate)
        t = float(np.asarray(c.known(1, "T")).ravel()[0])
        outs = [[] for _ in range(1 + nstate)]
        for i in range(n):
            x, g = c.inp(2 + i), c.inp(2 + n + i)
            st = [c.inp(2 + (2 + k) * n + i) for k in range(nstate)]
            dt = dtype_of(x)
            r = c.cast(c.inp(0), dt)

            def k(v):
                return c.scalar(v, dt)

            def op(name, *a):
                return c.op(name, list(a))
            greg = op("add", op("mul", k(c.attr("norm_coefficient", 0.0)), x), g)
            if kind == "Adagrad":
                r_ = op("div", r, k(1 + t * c.attr("decay_factor", 0.0)))
                hn = op("add", st[0], op("mul", greg, greg))
                hs = op("add", op("sqrt", hn), k(c.attr("epsilon", 1e-6)))
                res = [op("sub", x, op("div", op("mul", r_, greg), hs)), hn]
            elif kind == "Momentum":
                alpha, beta = c.attr("alpha"), c.attr("beta")
                mode = c.attr("mode", "standard")
                mode = mode.decode() if isinstance(mode, bytes) else mode
                vn = op("add", op("mul", k(alpha), st[0]), op("mul", k(beta if t > 0 else 1.0), greg))
                step = vn if mode == "standard" else op("add", greg, op("mul", k(alpha), vn))
                res = [op("sub", x, op("mul", r, step)), vn]
            else:
                alpha, beta = c.attr("alpha", 0.9), c.attr("beta", 0.999)
                vn = op("add", op("mul", k(alpha), st[0]), op("mul", k(1 - alpha), greg))
                hn = op("add", op("mul", k(beta), st[1]), op("mul", k(1 - beta), op("mul", greg, greg)))
                hs = op("add", op("sqrt", hn), k(c.attr("epsilon", 1e-6)))
                ra = op("mul", r, k(math.sqrt(1 - beta ** t) / (1 - alpha ** t))) if t > 0 else r
                xn = op("sub", x, op("mul", ra, op("div", vn, hs)))
                res = [op("mul", k(1 - c.attr("norm_coefficient_post", 0.0)), xn), vn, hn]
            for lst, v in zip(outs, res):
                lst.append(v)
        return [v for lst in outs for v in lst]
    return h


for _k in ("Adagrad", "Momentum", "Adam"):
    handler(f"ai.onnx.preview.training:{_k}")(_optimizer(_k))


@handler("ReverseSequence")
def _reverse_sequence(c):
    """out[t, b] = x[len[b] - 1 - t, b] for t < len[b], else x[t, b]: one gather_elements over time."""
    x, lens = c.inp(0), c.cast(c.inp(1), "int64")
    ta, ba = c.attr("time_axis", 0), c.attr("batch_axis", 1)
    shp = shape_of(x)
    r = len(shp)
    T, B = shp[ta], shp[ba]
    tshape, bshape = [1] * r, [1] * r
    tshape[ta], bshape[ba] = T, B
    t = c.reshape(c.op("iota", [], length=T, dtype="int64"), tshape)
    n = c.reshape(lens, bshape)
    rev = c.op("sub", [c.op("sub", [n, c.scalar(1, "int64")]), t])
    idx = c.op("where", [c.op("lt", [t, n]), rev, c.op("expand", [t], shape=tuple(
        T if i == ta else B if i == ba else 1 for i in range(r)))])
    idx = c.op("expand", [idx], shape=tuple(shp))
    return c.op("gather_elements", [x, idx], axis=ta)


@handler("MatMulInteger")
def _matmul_integer(c):
    a, b, azp, bzp = (c.inp(i) for i in range(4))
    A = c.cast(a, "int32")
    if azp is not None:
        z = c.cast(azp, "int32")
        A = c.op("sub", [A, c.reshape(z, [shape_of(z)[0], 1]) if rank_of(z) == 1 and shape_of(z)[0] != 1 else z])
    B = c.cast(b, "int32")
    if bzp is not None:
        B = c.op("sub", [B, c.cast(bzp, "int32")])
    return c.op("matmul", [A, B])


# ---- GridSample: taps gathered from the flattened input, weights computed pointwise -------------
def _gs_reflect(c, v, lo, hi, S):
    def op(name, *a):
        return c.op(name, list(a))
    rng = S(hi - lo)

    def fold(dx):
        n = op("floor", op("div", dx, rng))
        r = op("sub", dx, op("mul", n, rng))
        even = op("eq", op("sub", n, op("mul", S(2), op("floor", op("div", n, S(2))))), S(0))
        return r, even
    rb, eb = fold(op("sub", S(lo), v))
    ra, ea = fold(op("sub", v, S(hi)))
    below = op("where", eb, op("add", S(lo), rb), op("sub", S(hi), rb))
    above = op("where", ea, op("sub", S(hi), ra), op("add", S(lo), ra))
    return op("where", op("lt", v, S(lo)), below, op("where", op("gt", v, S(hi)), above, v))


@handler("GridSample")
def _grid_sample(c):
    x, grid = c.inp(0), c.inp(1)
    mode = c.attr("mode", "linear" if c.opset >= 20 else "bilinear")
    pad = c.attr("padding_mode", "zeros")
    mode, pad = (m.decode() if isinstance(m, bytes) else m for m in (mode, pad))
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    ac = bool(c.attr("align_corners", 0))
    shp = shape_of(x)
    N, C, dims = shp[0], shp[1], list(shp[2:])
    k = len(dims)
    out = list(shape_of(grid)[1:-1])
    if not all(isinstance(d, int) for d in list(shp) + out):
        raise Unsupported("symbolic shapes")
    P = int(np.prod(out)) if out else 1
    dt = dtype_of(grid)

    def S(v):
        return c.scalar(v, dt)

    def op(name, *a, **kw):
        return c.op(name, list(a), **kw)
    g = c.reshape(grid, [N, P, k])
    taps = []          # per dim: list of (index tensor (float, integral), weight or None)
    for i in range(k):
        L = dims[i]
        gi = c.reshape(op("slice", g, axis=2, start=k - 1 - i, length=1), [N, P])
        if ac:
            v = op("mul", op("div", op("add", gi, S(1)), S(2)), S(L - 1))
        else:
            v = op("div", op("sub", op("mul", op("add", gi, S(1)), S(L)), S(1)), S(2))
        if mode == "nearest":
            v = op("round", v)
        lo, hi = (0.0, L - 1.0) if ac else (-0.5, L - 0.5)
        if pad == "border":
            oob = op("or", op("lt", v, S(lo)), op("gt", v, S(hi)))
            v = op("where", oob, op("clip", v, min=0.0, max=float(L - 1)), v)
        elif pad == "reflection":
            v = _gs_reflect(c, v, lo, hi, S)
        if mode == "nearest":
            taps.append([(v, None)])
            continue
        x0 = op("floor", v)
        f = op("sub", v, x0)
        if mode == "linear":
            taps.append([(x0, op("sub", S(1), f)), (op("add", x0, S(1)), f)])
        elif mode == "cubic":
            a = -0.75

            def cub(t):     # Keys kernel on |t|, t in [0, 2]
                t1 = op("mul", op("mul", t, t), t)
                t2 = op("mul", t, t)
                near = op("add", op("sub", op("mul", S(a + 2), t1), op("mul", S(a + 3), t2)), S(1))
                far = op("sub", op("add", op("sub", op("mul", S(a), t1), op("mul", S(5 * a), t2)),
                                   op("mul", S(8 * a), t)), S(4 * a))
                return near, far
            _, w0 = cub(op("add", f, S(1)))
            w1, _ = cub(f)
            w2, _ = cub(op("sub", S(1), f))
            _, w3 = cub(op("sub", S(2), f))
            taps.append([(op("add", x0, S(d)), w) for d, w in zip((-1, 0, 1, 2), (w0, w1, w2, w3))])
        else:
            raise Unsupported(f"mode {mode}")
    xf = c.reshape(x, [N, C, int(np.prod(dims))])
    xdt = dtype_of(x)
    acc = None
    strides = [int(np.prod(dims[i + 1:])) for i in range(k)]
    fixed = []
    for i in range(k):
        L = dims[i]
        lst = []
        for t, w in taps[i]:
            valid = op("and", op("ge", t, S(0)), op("le", t, S(L - 1))) if pad == "zeros" else None
            tt = t
            if pad == "reflection":
                lo, hi = (0.0, L - 1.0) if ac else (-0.5, L - 0.5)
                tt = _gs_reflect(c, t, lo, hi, S)
            idx = c.cast(op("clip", tt, min=0.0, max=float(L - 1)), "int64")
            lst.append((idx, w, valid))
        fixed.append(lst)
    for combo in itertools.product(*fixed):
        flat, w, valid = None, None, None
        for i, (idx, wi, vi) in enumerate(combo):
            term = op("mul", idx, c.scalar(strides[i], "int64")) if strides[i] != 1 else idx
            flat = term if flat is None else op("add", flat, term)
            if wi is not None:
                w = wi if w is None else op("mul", w, wi)
            if vi is not None:
                valid = vi if valid is None else op("and", valid, vi)
        idx = op("expand", c.reshape(flat, [N, 1, P]), shape=(N, C, P))
        val = c.cast(op("gather_elements", xf, idx, axis=2), dt)
        if valid is not None:
            w = c.cast(valid, dt) if w is None else op("mul", w, c.cast(valid, dt))
        if w is not None:
            val = op("mul", val, c.reshape(w, [N, 1, P]))
        acc = val if acc is None else op("add", acc, val)
    return c.cast(c.reshape(acc, [N, C] + out), xdt)


@handler("DFT")
def _dft(c):
    """DFT as matmuls with constant cos / sin matrices over the transformed axis (moved last)."""
    x = c.inp(0)
    r = rank_of(x)
    shp = list(shape_of(x))
    L = c.inp(1)
    if c.opset >= 20:
        ax = c.known(2, "axis") if c.inp(2) is not None else -2
        ax = int(np.asarray(ax).ravel()[0])
    else:
        ax = c.attr("axis", 1)
    ax = ax % r
    inverse, onesided = bool(c.attr("inverse", 0)), bool(c.attr("onesided", 0))
    nin = shp[ax]
    if not isinstance(nin, int):
        raise Unsupported("symbolic signal length")
    if L is not None:
        L = int(np.asarray(c.known(1, "dft_length")).ravel()[0])
    else:
        L = 2 * (nin - 1) if inverse and onesided else nin
    return _dft_apply(c, x, ax, L, inverse, onesided)


def _dft_apply(c, x, ax, L, inverse, onesided):
    r = rank_of(x)
    shp = list(shape_of(x))
    nin = shp[ax]
    dt = dtype_of(x)
    comp = shp[-1]
    perm = [i for i in range(r - 1) if i != ax] + [ax]

    def part(k):
        p = c.reshape(c.op("slice", [x], axis=r - 1, start=k, length=1), shp[:-1])
        return c.op("transpose", [p], perm=tuple(perm)) if perm != list(range(r - 1)) else p
    xr = part(0)
    xi = part(1) if comp == 2 else None
    n = np.arange(nin)[:, None].astype(np.float64)
    if inverse and onesided:          # irfft: hermitian input of L // 2 + 1 bins -> L real samples
        kout = L
        theta = 2 * np.pi * n * np.arange(L)[None, :] / L
        w = np.where((n == 0) | ((L % 2 == 0) & (n == L // 2)), 1.0, 2.0) * (n <= L // 2)
        A, B, Cm, Dm = w * np.cos(theta) / L, -w * np.sin(theta) / L, None, None
    else:
        kout = L // 2 + 1 if onesided and not inverse else L
        sgn = 1.0 if inverse else -1.0
        theta = sgn * 2 * np.pi * n * np.arange(kout)[None, :] / L
        keep = (n < L).astype(np.float64)
        scale = 1.0 / L if inverse else 1.0
        A, B = keep * np.cos(theta) * scale, -keep * np.sin(theta) * scale
        Cm, Dm = keep * np.sin(theta) * scale, keep * np.cos(theta) * scale

    def mm(v, m):
        return c.op("matmul", [v, c.g.const(m.astype(dt))])
    re = mm(xr, A)
    if xi is not None:
        re = c.op("add", [re, mm(xi, B)])
    parts = [re]
    if Cm is not None:
        im = mm(xr, Cm)
        if xi is not None:
            im = c.op("add", [im, mm(xi, Dm)])
        parts.append(im)
    inv = [perm.index(i) for i in range(r - 1)]
    oshape = [kout if i == ax else d for i, d in enumerate(shp[:-1])]
    outs = []
    for p in parts:
        if perm != list(range(r - 1)):
            p = c.op("transpose", [p], perm=tuple(inv))
        outs.append(c.reshape(p, oshape + [1]))
    return outs[0] if len(outs) == 1 else c.op("concat", outs, axis=r - 1)


@handler("Col2Im")
def _col2im(c):
    """Sum over kernel offsets of the column block, zero-stuffed by the strides and shifted into place."""
    x = c.inp(0)
    img = [int(v) for v in np.asarray(c.known(1, "image_shape")).ravel()]
    blk = [int(v) for v in np.asarray(c.known(2, "block_shape")).ravel()]
    k = len(img)
    dil = c.attr("dilations") or [1] * k
    st = c.attr("strides") or [1] * k
    p = c.attr("pads") or [0] * (2 * k)
    N, CK, L = shape_of(x)
    K = int(np.prod(blk))
    C = CK // K
    padded = [img[i] + p[i] + p[i + k] for i in range(k)]
    outs = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(k)]
    if int(np.prod(outs)) != L:
        raise ShapeError(f"Col2Im: {L} blocks, the shapes imply {int(np.prod(outs))}")
    xr = c.reshape(x, [N, C, K] + outs)
    acc = None
    for kf, kidx in enumerate(itertools.product(*[range(b) for b in blk])):
        y = c.reshape(c.op("slice", [xr], axis=2, start=kf, length=1), [N, C] + outs)
        pads = [(0, 0), (0, 0)]
        for i in range(k):
            if st[i] > 1:      # zero insertion along dim 2 + i
                sh = list(shape_of(y))
                y = c.reshape(y, sh[:2 + i + 1] + [1] + sh[2 + i + 1:])
                y = c.op("pad", [y], pads=[(0, 0)] * (3 + i) + [(0, st[i] - 1)] + [(0, 0)] * (k - i - 1), value=0.0)
                y = c.reshape(y, sh[:2 + i] + [sh[2 + i] * st[i]] + sh[2 + i + 1:])
                y = c.op("slice", [y], axis=2 + i, start=0, length=(outs[i] - 1) * st[i] + 1)
            lo = kidx[i] * dil[i]
            pads.append((lo, padded[i] - lo - ((outs[i] - 1) * st[i] + 1)))
        y = c.op("pad", [y], pads=pads, value=0.0)
        acc = y if acc is None else c.op("add", [acc, y])
    for i in range(k):
        if p[i] or p[i + k]:
            acc = c.op("slice", [acc], axis=2 + i, start=p[i], length=img[i])
    return acc


@handler("Det")
def _det(c):
    """Leibniz expansion over the permutations (square matrices up to 4 x 4)."""
    x = c.inp(0)
    shp = list(shape_of(x))
    n = shp[-1]
    if not isinstance(n, int) or n > 4 or shp[-2] != n:
        raise Unsupported("Det of matrices larger than 4 x 4")
    batch = shp[:-2]
    flat = c.reshape(x, batch + [n * n])
    cols = [c.reshape(c.op("slice", [flat], axis=len(batch), start=i, length=1), batch) for i in range(n * n)]
    acc = None
    for perm in itertools.permutations(range(n)):
        sign = 1
        for i in range(n):
            for j in range(i + 1, n):
                if perm[i] > perm[j]:
                    sign = -sign
        term = cols[perm[0]]
        for i in range(1, n):
            term = c.op("mul", [term, cols[i * n + perm[i]]])
        acc = term if acc is None else c.op("add" if sign > 0 else "sub", [acc, term])
        if acc is term and sign < 0:
            acc = c.op("neg", [term])
    return acc


@handler("ai.onnx.ml:Binarizer")
def _binarizer(c):
    x = c.inp(0)
    dt = dtype_of(x)
    return c.cast(c.op("gt", [x, c.scalar(c.attr("threshold", 0.0), dt)]), dt)


@handler("ai.onnx.ml:ArrayFeatureExtractor")
def _array_feature_extractor(c):
    x, idx = c.inp(0), c.cast(c.inp(1), "int64")
    return c.op("gather", [x, c.reshape(idx, [D.numel(shape_of(idx))]) if rank_of(idx) != 1 else idx], axis=rank_of(x) - 1)


@handler("TensorScatter")
def _tensor_scatter(c):
    """present[b, .., s] = update[b, .., (s - w[b]) (mod S)] where that index is < the update length."""
    cache, upd, w = c.inp(0), c.inp(1), c.inp(2)
    mode = c.attr("mode", "linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    shp = list(shape_of(cache))
    r = len(shp)
    a = c.attr("axis", -2) % r
    S, Sn = shp[a], shape_of(upd)[a]
    if not all(isinstance(d, int) for d in shp) or not isinstance(Sn, int):
        raise Unsupported("symbolic shapes")
    s = c.reshape(c.op("iota", [], length=S, dtype="int64"), [S if i == a else 1 for i in range(r)])
    w = c.cast(w, "int64") if w is not None else np.zeros([shp[0]], np.int64)
    j = c.op("sub", [s, c.reshape(w, [shp[0]] + [1] * (r - 1))])
    if mode == "circular":
        j = c.op("mod", [j, c.scalar(S, "int64")])
    valid = c.op("and", [c.op("ge", [j, c.scalar(0, "int64")]), c.op("lt", [j, c.scalar(Sn, "int64")])])
    jc = c.op("expand", [c.op("clip", [j], min=0.0, max=float(Sn - 1))], shape=tuple(shp))
    return c.op("where", [c.op("expand", [valid], shape=tuple(shp)), c.op("gather_elements", [upd, jc], axis=a), cache])


@handler("STFT")
def _stft(c):
    x, step, window, flen = c.inp(0), c.known(1, "frame_step"), c.inp(2), c.inp(3)
    step = int(np.asarray(step).ravel()[0])
    if flen is not None:
        fl = int(np.asarray(c.known(3, "frame_length")).ravel()[0])
    elif window is not None:
        fl = shape_of(window)[0]
    else:
        raise ShapeError("STFT needs a window or a frame_length")
    B, n, comp = shape_of(x)
    if not isinstance(n, int):
        raise Unsupported("symbolic signal length")
    nf = 1 + (n - fl) // step
    frames = [c.reshape(c.op("slice", [x], axis=1, start=f * step, length=fl), [B, 1, fl, comp]) for f in range(nf)]
    fr = frames[0] if nf == 1 else c.op("concat", frames, axis=1)
    if window is not None:
        fr = c.op("mul", [fr, c.reshape(c.cast(window, dtype_of(x)), [1, 1, fl, 1])])
    return _dft_apply(c, fr, 2, fl, False, bool(c.attr("onesided", 1)))


@handler("QLinearConv")
def _qlinear_conv(c):
    x, xs, xzp, w, ws, wzp, ys, yzp, b = (c.inp(i) for i in range(9))
    xf = c.cast(x, "float64")
    if xzp is not None:
        xf = c.op("sub", [xf, c.cast(xzp, "float64")])
    wf = c.cast(w, "float64")
    if wzp is not None:
        wz = c.cast(wzp, "float64")
        if rank_of(wz) == 1 and shape_of(wz)[0] != 1:
            wz = c.reshape(wz, [shape_of(wz)[0]] + [1] * (rank_of(w) - 1))
        wf = c.op("sub", [wf, wz])
    nsp = rank_of(x) - 2
    kernel = c.attr("kernel_shape") or list(shape_of(w)[2:])
    strides = c.attr("strides") or [1] * nsp
    dil = c.attr("dilations") or [1] * nsp
    pads = _auto_pad(c, list(shape_of(x)[2:]), kernel, strides, dil)
    ins = [xf, wf] + ([c.cast(b, "float64")] if b is not None else [])
    acc = c.op("conv", ins, strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil), groups=c.attr("group", 1))
    scale = c.op("mul", [xs, c.cast(ws, dtype_of(xs))])
    if rank_of(scale) == 1 and shape_of(scale)[0] != 1:
        scale = c.reshape(scale, [1, shape_of(scale)[0]] + [1] * nsp)
    scale = c.op("div", [scale, c.cast(ys, dtype_of(xs))])
    d = c.op("mul", [acc, c.cast(scale, "float64")])
    out_dt = dtype_of(yzp) if yzp is not None else "uint8"
    if yzp is not None:
        d = c.op("add", [d, c.cast(yzp, "float64")])
    lo, hi = _QRANGE[out_dt]
    return c.cast(c.op("round", [c.op("clip", [d], min=float(lo), max=float(hi))]), out_dt)


@handler("MelWeightMatrix")
def _mel_weight_matrix(c):
    """Every input sizes the output: evaluated at compile time by onnx's reference."""
    ins = [c.known(i, n) for i, n in enumerate(("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
                                                 "upper_edge_hertz"))]
    r = c.ref_eval(c.node, ins)
    if r is None:
        raise Unsupported("reference evaluation failed")
    return r


@handler("MaxUnpool")
def _max_unpool(c):
    """Zeros with x scattered at its (flat, whole-tensor) indices."""
    x, idx, oshape = c.inp(0), c.cast(c.inp(1), "int64"), c.inp(2)
    xs = list(shape_of(x))
    nsp = len(xs) - 2
    k = c.attr("kernel_shape")
    st = c.attr("strides") or [1] * nsp
    p = c.attr("pads") or [0] * (2 * nsp)
    inferred = xs[:2] + [(xs[2 + i] - 1) * st[i] + k[i] - p[i] - p[i + nsp] for i in range(nsp)]
    out = [int(v) for v in np.asarray(c.known(2, "output_shape")).ravel()] if oshape is not None else inferred
    if not all(isinstance(d, int) for d in xs + out):
        raise Unsupported("symbolic shapes")
    n = int(np.prod(xs))
    zeros = np.zeros([int(np.prod(inferred))], dtype=dtype_of(x))
    y = c.reshape(c.op("scatter_elements", [zeros, c.reshape(idx, [n]), c.reshape(x, [n])], axis=0), inferred)
    if out != inferred:     # onnx's reference: the inferred block at the origin of a zero output
        y = c.op("pad", [y], pads=[(0, o - i) for o, i in zip(out, inferred)], value=0.0)
    return y


def _max_pool_with_indices(c, x, kernel, strides, pads, dil, ceil_mode):
    """Max over the kernel offsets of strided slices of the -inf padded input, tracking the flat index
    of the first maximum (storage_order 0)."""
    xs = list(shape_of(x))
    nsp = len(xs) - 2
    if not all(isinstance(d, int) for d in xs):
        raise Unsupported("symbolic shapes")
    y = c.op("max_pool", [x], kernel=tuple(kernel), strides=tuple(strides), pads=pads, dilations=tuple(dil),
             ceil_mode=ceil_mode)
    outs = list(shape_of(y)[2:])
    ext = [max(0, (outs[i] - 1) * strides[i] + dil[i] * (kernel[i] - 1) + 1 - (xs[2 + i] + pads[i][0]))
           for i in range(nsp)]
    xp = c.op("pad", [x], pads=[(0, 0), (0, 0)] + [(pads[i][0], ext[i]) for i in range(nsp)], value=float("-inf"))
    flat = np.arange(int(np.prod(xs)), dtype=np.int64).reshape(xs)
    if c.attr("storage_order", 0):      # column-major spatial indices
        flat = np.arange(int(np.prod(xs)), dtype=np.int64).reshape(xs[:2] + xs[2:][::-1])
        flat = flat.transpose([0, 1] + list(range(len(xs) - 1, 1, -1)))
    fp = np.pad(flat, [(0, 0), (0, 0)] + [(pads[i][0], ext[i]) for i in range(nsp)], constant_values=-1)
    best = bi = None
    for kidx in itertools.product(*[range(k) for k in kernel]):
        v, ind = xp, fp
        sl = [slice(None), slice(None)]
        for i in range(nsp):
            start = kidx[i] * dil[i]
            v = c.op("slice", [v], axis=2 + i, start=start, step=strides[i], length=outs[i])
            sl.append(slice(start, start + strides[i] * (outs[i] - 1) + 1, strides[i]))
        ind = np.ascontiguousarray(fp[tuple(sl)])
        if best is None:
            best, bi = v, ind
            continue
        upd = c.op("gt", [v, best])
        best = c.op("where", [upd, v, best])
        bi = c.op("where", [upd, ind, bi])
    return [y, bi]


@handler("DeformConv")
def _deform_conv(c):
    """2-d deformable conv: bilinear samples (zero outside) at the offset kernel taps, then one matmul."""
    x, w, off, b, mask = (c.inp(i) for i in range(5))
    if rank_of(x) != 4 or c.attr("group", 1) != 1:
        raise Unsupported("only 2-d DeformConv with group=1")
    N, C, H, W = shape_of(x)
    O, _, KH, KW = shape_of(w)
    OH, OW = shape_of(off)[2:]
    if not all(isinstance(d, int) for d in (N, C, H, W, OH, OW)):
        raise Unsupported("symbolic shapes")
    G = c.attr("offset_group", 1)
    st = c.attr("strides") or [1, 1]
    dl = c.attr("dilations") or [1, 1]
    p = c.attr("pads") or [0, 0, 0, 0]
    K, P, Cg = KH * KW, OH * OW, C // G
    dt = dtype_of(x)

    def op(name, *a, **kw):
        return c.op(name, list(a), **kw)
    offr = c.reshape(off, [N, G, K, 2, P])
    base = [np.array([[-p[a] + st[a] * (q // OW if a == 0 else q % OW) + (k // KW if a == 0 else k % KW) * dl[a]
                       for q in range(P)] for k in range(K)], dtype=dt) for a in (0, 1)]    # [K, P]
    ys = op("add", c.reshape(op("slice", offr, axis=3, start=0, length=1), [N, G, K, P]), base[0])
    xs = op("add", c.reshape(op("slice", offr, axis=3, start=1, length=1), [N, G, K, P]), base[1])
    y0, x0 = op("floor", ys), op("floor", xs)
    fy, fx = op("sub", ys, y0), op("sub", xs, x0)
    one = c.scalar(1, dt)
    xflat = c.reshape(x, [N, G, Cg, H * W])
    cols = None
    for dy, wy in ((0, op("sub", one, fy)), (1, fy)):
        for dx, wx in ((0, op("sub", one, fx)), (1, fx)):
            yy, xx = op("add", y0, c.scalar(dy, dt)), op("add", x0, c.scalar(dx, dt))
            ok = op("and", op("and", op("ge", yy, c.scalar(0, dt)), op("le", yy, c.scalar(H - 1, dt))),
                    op("and", op("ge", xx, c.scalar(0, dt)), op("le", xx, c.scalar(W - 1, dt))))
            yi = c.cast(op("clip", yy, min=0.0, max=float(H - 1)), "int64")
            xi = c.cast(op("clip", xx, min=0.0, max=float(W - 1)), "int64")
            flat = op("add", op("mul", yi, c.scalar(W, "int64")), xi)                     # N, G, K, P
            idx = op("expand", c.reshape(flat, [N, G, 1, K * P]), shape=(N, G, Cg, K * P))
            v = c.reshape(op("gather_elements", xflat, idx, axis=3), [N, G, Cg, K, P])
            wgt = c.reshape(op("mul", op("mul", wy, wx), c.cast(ok, dt)), [N, G, 1, K, P])
            t = op("mul", v, wgt)
            cols = t if cols is None else op("add", cols, t)
    if mask is not None:
        cols = op("mul", cols, c.reshape(mask, [N, G, 1, K, P]))
    cols = c.reshape(cols, [N, C * K, P])
    y = op("matmul", c.reshape(w, [O, C * K]), cols)                                       # N, O, P
    if b is not None:
        y = op("add", y, c.reshape(b, [O, 1]))
    return c.reshape(y, [N, O, OH, OW])
