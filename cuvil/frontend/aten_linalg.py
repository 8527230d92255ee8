"""ATen linear algebra -> IR: LU (factor, unpack, solve), det, slogdet, inverse, solve, triangular
solves, Cholesky, Householder QR (geqrf, qr, householder_product, ormqr), eigenvalues and singular
values (eigvalsh, svdvals, matrix_rank, cond, nuclear norm) and pinv, all on the IR's linear algebra
ops (ir/ops/linalg.py) and plain matmuls, gathers and reductions. Matrices of a static size.

torch raises on a singular or non-positive-definite input when it checks errors (an effect token and
_linalg_check_errors in the exported graph); a compiled model cannot raise mid-call, so the check is
dropped: a singular matrix gives infinities or NaNs where torch would raise, and the `_ex` variants'
info outputs say which matrices failed, as torch's do."""
from __future__ import annotations

import numpy as np
import torch

from .aten import Unsupported, aten, handles, outputs_read, static_sizes


# what an effect token is bound to (it carries no value)
EFFECT_TOKEN = object()


_static = static_sizes("a matrix of symbolic size")


def _mT(ctx, x):
    perm = list(range(x.type.rank))
    perm[-2:] = perm[-1], perm[-2]
    return ctx.add("transpose", [x], {"perm": perm})


def _triangle(ctx, x, upper, diagonal=0, unit=False):
    """x's upper (lower) triangle from `diagonal` on, zeros elsewhere; unit: ones on the diagonal."""
    m, n = x.shape[-2:]
    keep = np.triu(np.ones((m, n), bool), diagonal) if upper else np.tril(np.ones((m, n), bool), diagonal)
    y = ctx.add("where", [ctx.g.const(keep), x, ctx.scalar(0, x.dtype)])
    if unit:
        y = ctx.add("add", [y, ctx.g.const(np.eye(m, n, dtype=x.dtype))])
    return y


def _cols(ctx, x, start, length, axis):
    return ctx.add("slice", [x], {"axis": axis % x.type.rank, "start": start, "step": 1, "length": length})


def _common_batch(ctx, a, b):
    """a [..., m, n] and b [..., p, q] expanded to one batch shape."""
    _static(*a.shape, *b.shape)
    batch = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    def grow(x):
        shape = [*batch, *x.shape[-2:]]
        return x if list(x.shape) == shape else ctx.add("expand", [x], {"shape": shape})
    return grow(a), grow(b)


def _diagonal(ctx, x):
    """The main diagonals of x [..., n, n], as [..., n]."""
    n = x.shape[-1]
    flat = ctx.add("reshape", [x], {"shape": [*x.shape[:-2], n * n]})
    idx = np.arange(n, dtype=np.int64) * (n + 1)
    idx = np.broadcast_to(idx, (*x.shape[:-2], n))
    return ctx.add("gather_elements", [flat, ctx.g.const(np.ascontiguousarray(idx))], {"axis": -1})


def _lu(ctx, a):
    _static(*a.shape)
    return ctx.add("lu_factor", [a])


def _permutation_matrix(ctx, piv, m, dtype):
    """P [..., m, m] with A = P L U: P[perm[i], i] = 1."""
    perm = ctx.add("lu_permutation", [ctx.tensor(piv, "int32")], {"rows": m})
    rows = ctx.g.const(np.arange(m, dtype=np.int64).reshape(m, 1))
    hit = ctx.add("eq", [ctx.add("reshape", [perm], {"shape": [*perm.shape[:-1], 1, m]}), rows])
    return ctx.add("cast", [hit], {"to": dtype})


def _swap_sign(ctx, piv, dtype):
    """(-1) ** (the number of rows the pivots swapped), per matrix."""
    k = piv.shape[-1]
    moved = ctx.add("ne", [piv, ctx.g.const(np.arange(1, k + 1, dtype=np.int32))])
    count = ctx.add("reduce_sum", [ctx.add("cast", [moved], {"to": "int64"})], {"axes": [piv.type.rank - 1],
                                                                                 "keepdims": False})
    odd = ctx.add("mod", [count, ctx.scalar(2, "int64")])
    return ctx.add("sub", [ctx.scalar(1, dtype), ctx.add("mul", [ctx.add("cast", [odd], {"to": dtype}),
                                                                 ctx.scalar(2, dtype)])])


def _rows(ctx, x, order):
    """x [..., n, k] with row i taken from row order[..., i] (order [..., n] int64)."""
    idx = ctx.add("expand", [ctx.add("reshape", [order], {"shape": [*order.shape, 1]})], {"shape": list(x.shape)})
    return ctx.add("gather_elements", [x, idx], {"axis": x.type.rank - 2})


def _lu_solve(ctx, lu, piv, b, left=True, adjoint=False):
    """X with A X = B (A^T X = B when adjoint; X A = B when not left), A = P L U given as (lu, piv): the
    row swaps as gathers (a dense P would cost n^3 and spread an inf in B into NaN everywhere)."""
    if not left:                               # X A = B  <=>  A^T X^T = B^T
        return _mT(ctx, _lu_solve(ctx, lu, piv, _mT(ctx, b), True, not adjoint))
    lu, b = _common_batch(ctx, lu, b)
    n = lu.shape[-1]
    perm = ctx.add("lu_permutation", [ctx.tensor(_expand_like(ctx, piv, lu), "int32")], {"rows": n})
    if not adjoint:                            # L U X = P^T B: B's rows in the factorization's order
        y = ctx.add("triangular_solve", [lu, _rows(ctx, b, perm)], {"upper": False, "unit": True})
        return ctx.add("triangular_solve", [lu, y], {"upper": True, "unit": False})
    lt = _mT(ctx, lu)                          # U^T L^T P^T X = B: X's row perm[i] is Y's row i
    y = ctx.add("triangular_solve", [lt, b], {"upper": False, "unit": False})
    y = ctx.add("triangular_solve", [lt, y], {"upper": True, "unit": True})
    where = ctx.add("scatter_elements", [ctx.add("mul", [perm, ctx.scalar(0, "int64")]), perm,
                                         ctx.add("expand", [ctx.g.const(np.arange(n, dtype=np.int64))],
                                                 {"shape": list(perm.shape)})],
                    {"axis": perm.type.rank - 1, "reduction": "none"})
    return _rows(ctx, y, where)


def _expand_like(ctx, piv, lu):
    shape = [*lu.shape[:-2], piv.shape[-1]]
    return piv if list(piv.shape) == shape else ctx.add("expand", [piv], {"shape": shape})


def _eye_like(ctx, a):
    n = a.shape[-1]
    return ctx.add("expand", [ctx.g.const(np.eye(n, dtype=a.dtype))], {"shape": list(a.shape)})


@handles(aten.linalg_lu_factor_ex.default)
def _lu_factor_ex(ctx, a, pivot=True, check_errors=False):
    if not pivot:
        raise Unsupported("LU without pivoting")
    return tuple(_lu(ctx, a))


@handles(aten.lu_unpack.default)
def _lu_unpack(ctx, lu, piv, unpack_data=True, unpack_pivots=True):
    """(P, L, U) from a packed LU and its pivots: L m x k with a unit diagonal, U k x n."""
    _static(*lu.shape)
    m, n = lu.shape[-2:]
    k = min(m, n)
    low = _triangle(ctx, _cols(ctx, lu, 0, k, -1), upper=False, diagonal=-1, unit=True)
    up = _triangle(ctx, _cols(ctx, lu, 0, k, -2), upper=True)
    return _permutation_matrix(ctx, piv, m, lu.dtype), low, up


@handles(aten.linalg_lu.default)
def _linalg_lu(ctx, a, pivot=True):
    if not pivot:
        raise Unsupported("LU without pivoting")
    lu, piv, _ = _lu(ctx, a)
    return _lu_unpack(ctx, lu, piv)


@handles(aten.linalg_lu_solve.default)
def _linalg_lu_solve(ctx, lu, piv, b, left=True, adjoint=False):
    return _lu_solve(ctx, lu, piv, b, left, adjoint)


@handles(aten._linalg_det.default)
def _det(ctx, a):
    """(det, LU, pivots): the product of U's diagonal, its sign flipped once per row swap."""
    lu, piv, _ = _lu(ctx, a)
    diag = _diagonal(ctx, lu)
    prod = ctx.add("reduce_prod", [diag], {"axes": [diag.type.rank - 1], "keepdims": False})
    return ctx.add("mul", [prod, _swap_sign(ctx, piv, a.dtype)]), lu, piv


@handles(aten._linalg_slogdet.default)
def _slogdet(ctx, a):
    """(sign, log |det|, LU, pivots)."""
    lu, piv, _ = _lu(ctx, a)
    diag = _diagonal(ctx, lu)
    last = {"axes": [diag.type.rank - 1], "keepdims": False}
    sign = ctx.add("reduce_prod", [ctx.add("sign", [diag])], last)
    logabs = ctx.add("reduce_sum", [ctx.add("log", [ctx.add("abs", [diag])])], last)
    return ctx.add("mul", [sign, _swap_sign(ctx, piv, a.dtype)]), logabs, lu, piv


@handles(aten.linalg_inv_ex.default)
def _inv_ex(ctx, a, check_errors=False):
    lu, piv, info = _lu(ctx, a)
    return _lu_solve(ctx, lu, piv, _eye_like(ctx, a)), info


@handles(aten._linalg_solve_ex.default)
def _solve_ex(ctx, a, b, left=True, check_errors=False):
    """(X, LU, pivots, info) with A X = B (X A = B when not left); a B of A's batch dims and one fewer
    (or a 1-d B) is a vector."""
    lu, piv, info = _lu(ctx, a)
    vector = b.type.rank == 1 or (b.type.rank == a.type.rank - 1 and list(b.shape) == list(a.shape[:-1]))
    if vector:
        b = ctx.add("reshape", [b], {"shape": [*b.shape, 1] if left else [*b.shape[:-1], 1, b.shape[-1]]})
    x = _lu_solve(ctx, lu, piv, b, left)
    if vector:
        x = ctx.add("reshape", [x], {"shape": [*x.shape[:-2], x.shape[-2] if left else x.shape[-1]]})
    return x, lu, piv, info


def _tri_solve(ctx, a, b, upper, left=True, unit=False):
    """X with A X = B (X A = B when not left), A triangular."""
    if not left:
        return _mT(ctx, _tri_solve(ctx, _mT(ctx, a), _mT(ctx, b), not upper, True, unit))
    a, b = _common_batch(ctx, a, b)
    return ctx.add("triangular_solve", [a, b], {"upper": bool(upper), "unit": bool(unit)})


@handles(aten.linalg_solve_triangular.default)
def _solve_triangular(ctx, a, b, upper, left=True, unitriangular=False):
    return _tri_solve(ctx, a, b, upper, left, unitriangular)


@handles(aten.triangular_solve.default)
def _triangular_solve(ctx, b, a, upper=True, transpose=False, unitriangular=False):
    """(X, a copy of A) with A X = B, or A^T X = B when transpose."""
    if transpose:
        x = _tri_solve(ctx, _mT(ctx, a), b, not upper, True, unitriangular)
    else:
        x = _tri_solve(ctx, a, b, upper, True, unitriangular)
    return x, ctx.add("reshape", [a], {"shape": list(a.shape)})


def _cholesky_lower(ctx, a, upper):
    """L of A = L L^T, read from A's lower triangle (its upper one when upper: A's transpose's lower)."""
    _static(*a.shape)
    return ctx.add("cholesky", [_mT(ctx, a) if upper else a])


@handles(aten.linalg_cholesky_ex.default)
def _cholesky_ex(ctx, a, upper=False, check_errors=False):
    low, info = _cholesky_lower(ctx, a, upper)
    return (_mT(ctx, low) if upper else low), info


@handles(aten.cholesky.default)
def _cholesky(ctx, a, upper=False):
    return _cholesky_ex(ctx, a, upper)[0]


@handles(aten.cholesky_solve.default)
def _cholesky_solve(ctx, b, factor, upper=False):
    """X with A X = B, A = L L^T (= U^T U when upper) given by its factor."""
    low = _mT(ctx, factor) if upper else factor
    y = _tri_solve(ctx, low, b, upper=False)
    return _tri_solve(ctx, _mT(ctx, low), y, upper=True)


@handles(aten.cholesky_inverse.default)
def _cholesky_inverse(ctx, factor, upper=False):
    _static(*factor.shape)
    return _cholesky_solve(ctx, _eye_like(ctx, factor), factor, upper)


def _full_q(ctx, v, tau, m):
    """The m x m product of the reflectors in v [..., m, c] (a zero column, with a zero tau, is H = I)."""
    _static(*v.shape, *tau.shape)
    c, k = v.shape[-1], tau.shape[-1]
    if c < m:
        v = ctx.add("pad", [v], {"pads": [(0, 0)] * (v.type.rank - 1) + [(0, m - c)], "value": 0.0})
    elif c > m:
        v = _cols(ctx, v, 0, m, -1)
    if k < m:
        tau = ctx.add("pad", [tau], {"pads": [(0, 0)] * (tau.type.rank - 1) + [(0, m - k)], "value": 0.0})
    return ctx.add("householder_product", [v, tau])


@handles(aten.geqrf.default)
def _geqrf(ctx, a):
    _static(*a.shape)
    return tuple(ctx.add("householder_qr", [a]))


@handles(aten.linalg_householder_product.default)
def _householder_product(ctx, v, tau):
    _static(*v.shape, *tau.shape)
    return ctx.add("householder_product", [v, tau])


@handles(aten.linalg_qr.default)
def _linalg_qr(ctx, a, mode="reduced"):
    """(Q, R) of Householder QR, as LAPACK's (R's diagonal may be negative): reduced Q m x k and R k x n,
    complete Q m x m and R m x n; mode "r" returns an empty Q."""
    _static(*a.shape)
    m, n = a.shape[-2:]
    k = min(m, n)
    qr, tau = ctx.add("householder_qr", [a])
    if mode == "complete":
        return _full_q(ctx, qr, tau, m), _triangle(ctx, qr, upper=True)
    r = _triangle(ctx, _cols(ctx, qr, 0, k, -2), upper=True)
    if mode == "r":
        return ctx.g.const(np.zeros((0,), a.dtype)), r
    return ctx.add("householder_product", [_cols(ctx, qr, 0, k, -1), tau]), r


@handles(aten.ormqr.default)
def _ormqr(ctx, v, tau, other, left=True, transpose=False):
    """other multiplied by Q (from the left, or the right), or by Q^T, Q from geqrf's reflectors."""
    q = _full_q(ctx, v, tau, v.shape[-2])
    if transpose:
        q = _mT(ctx, q)
    return ctx.add("matmul", [q, other] if left else [other, q])


VECTORS = ("{0} of a matrix: their signs are LAPACK's (unspecified), cuvil's differ; eigenvalues, singular "
           "values, pinv, matrix_rank, cond and nuclear norms compile")


@handles(aten._linalg_eigh.default)
def _eigh(ctx, a, UPLO="L", compute_v=True):
    """(eigenvalues ascending, an empty eigenvector tensor): eigvalsh and the hermitian matrix rank
    (torch asks for the vectors for its gradient; unread, they are not computed)."""
    if compute_v and 1 in outputs_read(ctx):
        raise Unsupported(VECTORS.format("eigenvectors"))
    _static(*a.shape)
    w, _ = ctx.add("eigh", [_mT(ctx, a) if UPLO == "U" else a])
    return w, ctx.g.const(np.zeros((0,), a.dtype))


@handles(aten._linalg_svd.default)
def _svd(ctx, a, full_matrices=True, compute_uv=True, driver=None):
    """(empty, singular values descending, empty): svdvals, matrix_rank, cond, the nuclear norm."""
    if compute_uv and outputs_read(ctx) & {0, 2}:
        raise Unsupported(VECTORS.format("singular vectors"))
    _static(*a.shape)
    _, s, _ = ctx.add("svd", [a])
    empty = ctx.g.const(np.zeros((0,), a.dtype))
    return empty, s, empty


@handles(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)
def _pinv(ctx, a, atol=None, rtol=None, hermitian=False):
    """The pseudo-inverse by torch's rule: singular values (|eigenvalues| when hermitian) above
    max(atol, rtol * the largest) inverted, the rest 0; the vectors' signs cancel in the product."""
    _static(*a.shape)
    m, n = a.shape[-2:]
    dt = a.dtype
    default_rtol = float(np.finfo(np.float32).eps) * max(m, n)

    def per_matrix(t):                         # a tolerance per matrix [...] against the [..., 1, 1] largest
        t = ctx.tensor(t, dt)
        return ctx.add("reshape", [t], {"shape": [*t.shape, 1, 1]}) if t.type.rank else t
    if rtol is None:                           # torch: rtol = 0 where atol > 0, else eps * max(m, n)
        rtol = default_rtol if atol is None else ctx.add(
            "where", [ctx.add("gt", [ctx.tensor(atol, dt), ctx.scalar(0, dt)]), ctx.scalar(0, dt),
                      ctx.scalar(default_rtol, dt)])
    atol, rtol = per_matrix(0.0 if atol is None else atol), per_matrix(rtol)
    if hermitian:
        s, u = ctx.add("eigh", [a])
        v = u
        mag = ctx.add("abs", [s])
    else:
        u, s, vt = ctx.add("svd", [a])
        v, mag = _mT(ctx, vt), s
    s = ctx.add("reshape", [s], {"shape": [*s.shape[:-1], 1, s.shape[-1]]})
    mag = ctx.add("reshape", [mag], {"shape": list(s.shape)})
    largest = ctx.add("reduce_max", [mag], {"axes": [s.type.rank - 1], "keepdims": True})
    tol = ctx.add("max", [ctx.add("mul", [rtol, largest]), atol])
    inv = ctx.add("where", [ctx.add("gt", [mag, tol]), ctx.add("reciprocal", [s]), ctx.scalar(0, dt)])
    return ctx.add("matmul", [ctx.add("mul", [v, inv]), _mT(ctx, u)])


@handles(torch.ops.higher_order.with_effects)
def _with_effects(ctx, token, op, *args, **kwargs):
    """An op run for its side effect, ordered by a token: torch's error checks of the factorizations
    are dropped (the module docstring says why); any other effect is not compiled."""
    if op is not aten._linalg_check_errors.default:
        raise Unsupported(f"the side effect {op}")
    return (EFFECT_TOKEN,)


MATRIX_EXP_TAYLOR = 18          # terms: the truncation error of ||X|| <= 1/2 is 0.5^19 / 19! ~ 2e-23
MATRIX_EXP_SQUARINGS = 48       # ||A|| up to 2^47 (exp of anything larger overflows or underflows)


@handles(aten.linalg_matrix_exp.default)
def _matrix_exp(ctx, a):
    """Scaling and squaring in float64: X = A / 2^s with s per matrix from its 1-norm so ||X|| <= 1/2,
    exp(X) by Horner's Taylor sum, then squared s times (every squaring step computed, kept where the
    matrix needs it)."""
    _static(*a.shape)
    dt = a.dtype
    x = ctx.add("cast", [a], {"to": "float64"}) if dt != "float64" else a
    norm = ctx.add("reduce_max", [ctx.add("reduce_sum", [ctx.add("abs", [x])], {"axes": [x.type.rank - 2],
                                                                               "keepdims": True})],
                   {"axes": [x.type.rank - 1], "keepdims": True})              # [..., 1, 1]
    s = ctx.add("ceil", [ctx.add("log2", [ctx.add("mul", [norm, ctx.scalar(2.0, "float64")])])])
    s = ctx.add("min", [ctx.add("max", [s, ctx.scalar(0.0, "float64")]), ctx.scalar(MATRIX_EXP_SQUARINGS, "float64")])
    x = ctx.add("mul", [x, ctx.add("exp2", [ctx.add("neg", [s])])])
    eye = _eye_like(ctx, x)
    e = eye
    for k in range(MATRIX_EXP_TAYLOR, 0, -1):
        e = ctx.add("add", [eye, ctx.add("mul", [ctx.add("matmul", [x, e]), ctx.scalar(1.0 / k, "float64")])])
    for i in range(MATRIX_EXP_SQUARINGS):
        e = ctx.add("where", [ctx.add("lt", [ctx.scalar(float(i), "float64"), s]), ctx.add("matmul", [e, e]), e])
    return ctx.add("cast", [e], {"to": dt}) if dt != "float64" else e


def _symmetric_only(hermitian):
    if hermitian:
        raise Unsupported("ldl with hermitian=True (complex matrices)")


@handles(aten.linalg_ldl_factor_ex.default)
def _ldl_factor_ex(ctx, a, *, hermitian=False, check_errors=False):
    """Bunch-Kaufman LDL^T of A's lower triangle, as LAPACK's sytrf (and torch)."""
    _symmetric_only(hermitian)
    _static(*a.shape)
    return tuple(ctx.add("ldl_factor", [a]))


@handles(aten.linalg_ldl_solve.default)
def _ldl_solve(ctx, ld, piv, b, *, hermitian=False):
    _symmetric_only(hermitian)
    ld, b = _common_batch(ctx, ld, b)
    piv = ctx.add("expand", [ctx.tensor(piv, "int32")], {"shape": [*ld.shape[:-1]]}) \
        if tuple(piv.shape) != tuple(ld.shape[:-1]) else ctx.tensor(piv, "int32")
    return ctx.add("ldl_solve", [ld, piv, b])
