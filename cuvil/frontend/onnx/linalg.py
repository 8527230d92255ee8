"""Linear-algebra op handlers.

MatMul, Gemm (transposes, alpha and beta), Einsum (a two-operand contraction becomes one batched matmul,
anything else a broadcast product and reduce_sum) and Det."""
from __future__ import annotations

import itertools

import numpy as np

from ...errors import ShapeError
from ...ir import dims as D
from .helpers import Unsupported, dequantized_range, dtype_of, rank_of, shape_of, transpose
from .registry import handler


# ---- linear algebra -------------------------------------------------------------------------------
def _grid(c, name):
    """A QDQ model's activation grid under a MatMul's / Gemm's A (helpers.dequantized_range), for
    precision="int8", as int8_range attributes."""
    grid = dequantized_range(c, name) if c.integer_kernels else None
    return {"int8_range": grid} if grid else {}


@handler("MatMul")
def _matmul(c):
    return c.op("matmul", [c.inp(0), c.inp(1)], **_grid(c, c.node.input[0]))


@handler("Gemm")
def _gemm(c):
    a, b, bias = c.inp(0), c.inp(1), c.inp(2)
    grid = {} if c.attr("transA", 0) else _grid(c, c.node.input[0])
    if c.attr("transA", 0):
        a = transpose(c, a, (1, 0))
    if c.attr("transB", 0):
        b = transpose(c, b, (1, 0))
    y = c.op("matmul", [a, b], **grid)
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
        xt = transpose(c, x, perm)
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
    at = transpose(c, a, [ta.index(ch) for ch in batch + m + contracted])
    bt = transpose(c, b, [tb.index(ch) for ch in batch + contracted + n])
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
    return transpose(c, y, [cur.index(ch) for ch in out])


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
