"""Dense linear algebra on batches of small matrices: LU factorization with partial pivoting (LAPACK's
getrf: 1-based row swaps), LAPACK's swaps as a row order, Cholesky, and triangular solves. The
frontends build det, slogdet, inv, solve, lu_solve, cholesky_solve and the rest from these four.
Every op works on the last two dims and keeps the leading (batch) dims; a solve's batch dims match."""
from __future__ import annotations

import numpy as np

from ...errors import CuvilError, ShapeError
from ..types import TensorType
from .registry import OpDef, declare


def _matrix(op, t, square=False):
    if t.rank < 2:
        raise ShapeError(f"{op}: expected a matrix or a batch of them, got shape {list(t.shape)}")
    if not t.dtype.startswith("float"):
        raise ShapeError(f"{op}: expected float matrices, got {t.dtype}")
    m, n = t.shape[-2:]
    if square and isinstance(m, int) and isinstance(n, int) and m != n:
        raise ShapeError(f"{op}: expected square matrices, got {m} x {n}")
    return m, n


def _lu_infer(types, attrs, inputs):
    m, n = _matrix("lu_factor", types[0])
    if not (isinstance(m, int) and isinstance(n, int)):
        raise ShapeError("lu_factor: the matrix size must be static")
    batch = types[0].shape[:-2]
    return [types[0], TensorType((*batch, min(m, n)), "int32"), TensorType(batch, "int32")]


def _lu_one(a):
    """getrf on one matrix, in float32 as LAPACK's sgetrf: (LU, 1-based pivots, info)."""
    a = a.copy()
    m, n = a.shape
    piv, info = np.zeros(min(m, n), np.int32), 0
    for j in range(min(m, n)):
        p = j + int(np.argmax(np.abs(a[j:, j])))          # the first of equal magnitudes, as isamax
        piv[j] = p + 1
        if a[p, j] != 0:
            a[[j, p]] = a[[p, j]]
            a[j + 1:, j] /= a[j, j]
        elif info == 0:
            info = j + 1
        a[j + 1:, j + 1:] -= np.outer(a[j + 1:, j], a[j, j + 1:])
    return a, piv, info


def _lu_ref(xs, attrs):
    x = xs[0]
    m, n = x.shape[-2:]
    flat = x.reshape(-1, m, n)
    out = [_lu_one(a) for a in flat]
    batch = x.shape[:-2]
    lu = np.stack([o[0] for o in out]).reshape(x.shape) if out else x.copy()
    piv = np.stack([o[1] for o in out]).reshape(*batch, min(m, n)) if out else np.zeros((*batch, min(m, n)), np.int32)
    info = np.array([o[2] for o in out], np.int32).reshape(batch)
    return [lu.astype(x.dtype), piv, info]


declare(OpDef("lu_factor", {}, _lu_infer, _lu_ref, doc="LU with partial pivoting: (LU, pivots, info) as getrf"))


def _perm_infer(types, attrs, inputs):
    t = types[0]
    if t.dtype != "int32" or t.rank < 1:
        raise ShapeError(f"lu_permutation: expected int32 pivots [..., k], got {t.dtype} {list(t.shape)}")
    if not isinstance(attrs["rows"], int) or attrs["rows"] < t.shape[-1]:
        raise ShapeError(f"lu_permutation: rows={attrs['rows']} for {t.shape[-1]} pivots")
    return [TensorType((*t.shape[:-1], attrs["rows"]), "int64")]


def _perm_ref(xs, attrs):
    piv, m = xs[0], attrs["rows"]
    flat = piv.reshape(-1, piv.shape[-1])
    perm = np.tile(np.arange(m, dtype=np.int64), (len(flat), 1))
    for b, row in enumerate(flat):
        for j, p in enumerate(row):
            p = min(max(int(p) - 1, 0), m - 1)             # out-of-range pivots clamp, as the kernel
            perm[b, [j, p]] = perm[b, [p, j]]
    return [perm.reshape(*piv.shape[:-1], m)]


declare(OpDef("lu_permutation", {"rows": 0}, _perm_infer, _perm_ref,
              doc="LAPACK's row swaps (1-based pivots) applied in order to 0..rows-1: LU's row i is A's row perm[i]"))


def _cholesky_infer(types, attrs, inputs):
    _matrix("cholesky", types[0], square=True)
    return [types[0], TensorType(types[0].shape[:-2], "int32")]


def _cholesky_ref(xs, attrs):
    x = xs[0].astype(np.float64)
    n = x.shape[-1]
    flat = x.reshape(-1, n, n)
    out, info = np.zeros_like(flat), np.zeros(len(flat), np.int32)
    with np.errstate(invalid="ignore"):
        for b, a in enumerate(flat):
            low = out[b]
            for j in range(n):           # reads the lower triangle only
                d = a[j, j] - low[j, :j] @ low[j, :j]
                if not d > 0 and info[b] == 0:
                    info[b] = j + 1
                low[j, j] = np.sqrt(d)
                low[j + 1:, j] = (a[j + 1:, j] - low[j + 1:, :j] @ low[j, :j]) / low[j, j]
    return [out.reshape(x.shape).astype(xs[0].dtype), info.reshape(x.shape[:-2])]


declare(OpDef("cholesky", {}, _cholesky_infer, _cholesky_ref,
              doc="A = L L^T from A's lower triangle: (L, info: the order of the first minor not positive)"))


def _trsm_infer(types, attrs, inputs):
    a, b = types
    n, _ = _matrix("triangular_solve", a, square=True)
    if b.rank != a.rank or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != n:
        raise ShapeError(f"triangular_solve: A {list(a.shape)} and B {list(b.shape)}: expected B [..., {n}, k] "
                         "with A's batch dims")
    if b.dtype != a.dtype:
        raise ShapeError(f"triangular_solve: A is {a.dtype}, B is {b.dtype}")
    return [b]


def _trsm_ref(xs, attrs):
    a, b = (x.astype(np.float64) for x in xs)
    n = a.shape[-1]
    tri = np.triu(a) if attrs["upper"] else np.tril(a)
    if attrs["unit"]:
        idx = np.arange(n)
        tri[..., idx, idx] = 1
    x = np.zeros_like(b)
    order = range(n - 1, -1, -1) if attrs["upper"] else range(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in order:
            x[..., i, :] = (b[..., i, :] - np.einsum("...j,...jk->...k", tri[..., i, :], x)) / tri[..., i, i, None]
    return [x.astype(xs[1].dtype)]


declare(OpDef("triangular_solve", {"upper": False, "unit": False}, _trsm_infer, _trsm_ref,
              doc="X with A X = B, A triangular (the other triangle unread; unit: its diagonal taken as ones)"))


def _qr_infer(types, attrs, inputs):
    m, n = _matrix("householder_qr", types[0])
    if not (isinstance(m, int) and isinstance(n, int)):
        raise ShapeError("householder_qr: the matrix size must be static")
    return [types[0], TensorType((*types[0].shape[:-2], min(m, n)), types[0].dtype)]


def _qr_one(a):
    """geqr2 on one matrix: (R and the reflectors below it, tau)."""
    a = a.astype(np.float64)
    m, n = a.shape
    tau = np.zeros(min(m, n))
    for j in range(min(m, n)):
        alpha, norm2 = a[j, j], a[j + 1:, j] @ a[j + 1:, j]
        if norm2 == 0:
            continue
        beta = -np.copysign(np.sqrt(alpha * alpha + norm2), alpha)
        tau[j] = (beta - alpha) / beta
        a[j + 1:, j] /= alpha - beta
        a[j, j] = beta
        v = np.concatenate([[1.0], a[j + 1:, j]])
        a[j:, j + 1:] -= tau[j] * np.outer(v, v @ a[j:, j + 1:])
    return a, tau


def _qr_ref(xs, attrs):
    x = xs[0]
    m, n = x.shape[-2:]
    outs = [_qr_one(a) for a in x.reshape(-1, m, n)]
    qr = np.stack([o[0] for o in outs]).reshape(x.shape) if outs else x.astype(np.float64)
    tau = np.stack([o[1] for o in outs]).reshape(*x.shape[:-2], min(m, n)) if outs else \
        np.zeros((*x.shape[:-2], min(m, n)))
    return [qr.astype(x.dtype), tau.astype(x.dtype)]


declare(OpDef("householder_qr", {}, _qr_infer, _qr_ref,
              doc="Householder QR as LAPACK's geqrf: (R with the reflectors below it, tau)"))


def _hprod_infer(types, attrs, inputs):
    v, tau = types
    m, n = _matrix("householder_product", v)
    k = tau.shape[-1] if tau.rank else None
    if tau.rank != v.rank - 1 or tau.shape[:-1] != v.shape[:-2] or tau.dtype != v.dtype:
        raise ShapeError(f"householder_product: tau {tau} for reflectors {v}: expected [..., k] of their dtype")
    if all(isinstance(d, int) for d in (m, n, k)) and not m >= n >= k:
        raise ShapeError(f"householder_product: needs m >= n >= k, got {m} x {n} with {k} reflectors")
    return [v]


def _hprod_ref(xs, attrs):
    v, tau = (x.astype(np.float64) for x in xs)
    m, n = v.shape[-2:]
    k = tau.shape[-1]
    flat_v, flat_t = v.reshape(-1, m, n), tau.reshape(-1, k)
    q = np.zeros_like(flat_v)
    for b in range(len(flat_v)):
        qb = np.eye(m, n)
        for j in range(min(k, n) - 1, -1, -1):
            w = np.concatenate([[1.0], flat_v[b, j + 1:, j]])
            qb[j:] -= flat_t[b, j] * np.outer(w, w @ qb[j:])
        q[b] = qb
    return [q.reshape(v.shape).astype(xs[0].dtype)]


declare(OpDef("householder_product", {}, _hprod_infer, _hprod_ref,
              doc="the first n columns of H_0 ... H_{k-1} from geqrf's reflectors and tau (LAPACK's orgqr)"))


def _largest_positive(vectors, axis):
    """vectors with each one (along axis) negated where its largest-magnitude entry (the first of equal
    ones) is negative: the sign convention of eigh and svd here (torch's follow LAPACK's, unspecified)."""
    moved = np.moveaxis(vectors, axis, -1)
    pick = np.take_along_axis(moved, np.abs(moved).argmax(-1)[..., None], -1)
    return np.moveaxis(np.where(pick < 0, -moved, moved), -1, axis)


def _eigh_infer(types, attrs, inputs):
    n, _ = _matrix("eigh", types[0], square=True)
    return [TensorType((*types[0].shape[:-2], n), types[0].dtype), types[0]]


def _eigh_ref(xs, attrs):
    x = xs[0].astype(np.float64)
    w, v = np.linalg.eigh(x, UPLO="L")
    return [w.astype(xs[0].dtype), _largest_positive(v, -2).astype(xs[0].dtype)]


declare(OpDef("eigh", {}, _eigh_infer, _eigh_ref,
              doc="eigenvalues ascending and eigenvectors (columns; largest entry positive) of a symmetric "
                  "matrix's lower triangle"))


def _svd_infer(types, attrs, inputs):
    m, n = _matrix("svd", types[0])
    if not (isinstance(m, int) and isinstance(n, int)):
        raise ShapeError("svd: the matrix size must be static")
    batch, k = types[0].shape[:-2], min(m, n)
    dt = types[0].dtype
    return [TensorType((*batch, m, k), dt), TensorType((*batch, k), dt), TensorType((*batch, k, n), dt)]


def _svd_ref(xs, attrs):
    x = xs[0].astype(np.float64)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    m, n = x.shape[-2:]
    if m >= n:                   # the tall side's vectors carry the sign rule, the other side follows
        fixed = _largest_positive(u, -2)
        flip = np.sign((fixed * u).sum(-2, keepdims=True))
        u, vt = fixed, vt * np.swapaxes(flip, -1, -2)
    else:
        fixed = _largest_positive(vt, -1)
        flip = np.sign((fixed * vt).sum(-1, keepdims=True))
        vt, u = fixed, u * np.swapaxes(flip, -1, -2)
    dt = xs[0].dtype
    return [u.astype(dt), s.astype(dt), vt.astype(dt)]


declare(OpDef("svd", {}, _svd_infer, _svd_ref,
              doc="thin SVD (u, s descending, vt); the tall side's vectors have their largest entry positive"))


def _lapack():
    try:
        import scipy.linalg.lapack as lapack
    except ImportError as e:
        raise CuvilError("the reference of an LDL factorization needs scipy (pip install scipy)") from e
    return lapack


def _ldl_infer(types, attrs, inputs):
    t = types[0]
    n, _ = _matrix("ldl_factor", t, square=True)
    if not isinstance(n, int):
        raise ShapeError("ldl_factor: the matrix size must be static")
    return [t, TensorType((*t.shape[:-2], n), "int32"), TensorType(t.shape[:-2], "int32")]


def _ldl_ref(xs, attrs):
    """LAPACK's sytrf (uplo 'L', scipy's) per matrix, in the input's precision; the upper triangle zeroed
    as torch returns it."""
    x = xs[0]
    n = x.shape[-1]
    sytrf = _lapack().ssytrf if x.dtype == np.float32 else _lapack().dsytrf
    out = [sytrf(a, lower=1) for a in x.reshape(-1, n, n)]
    batch = x.shape[:-2]
    ld = np.stack([np.tril(o[0]) for o in out]).reshape(x.shape) if out else x.copy()
    piv = np.stack([o[1] for o in out]).astype(np.int32).reshape(*batch, n) if out else np.zeros((*batch, n), np.int32)
    return [ld.astype(x.dtype), piv, np.array([o[2] for o in out], np.int32).reshape(batch)]


declare(OpDef("ldl_factor", {}, _ldl_infer, _ldl_ref,
              doc="A = P L D L^T P^T by Bunch-Kaufman pivoting from A's lower triangle: (LD, pivots, info) as sytrf"))


def _ldl_solve_infer(types, attrs, inputs):
    ld, piv, b = types
    n, _ = _matrix("ldl_solve", ld, square=True)
    if piv.dtype != "int32" or tuple(piv.shape) != (*ld.shape[:-2], n):
        raise ShapeError(f"ldl_solve: pivots {piv.dtype}{list(piv.shape)} for LD {list(ld.shape)}")
    if b.rank != ld.rank or b.shape[:-2] != ld.shape[:-2] or b.shape[-2] != n or b.dtype != ld.dtype:
        raise ShapeError(f"ldl_solve: LD {ld.dtype}{list(ld.shape)} and B {b.dtype}{list(b.shape)}: expected B "
                         f"[..., {n}, k] of LD's dtype and batch dims")
    return [b]


def _ldl_solve_ref(xs, attrs):
    ld, piv, b = xs
    n = ld.shape[-1]
    sytrs = _lapack().ssytrs if ld.dtype == np.float32 else _lapack().dsytrs
    flat_b = b.reshape(-1, n, b.shape[-1])
    out = [sytrs(a, p, rhs, lower=1)[0] for a, p, rhs in zip(ld.reshape(-1, n, n), piv.reshape(-1, n), flat_b)]
    return [np.stack(out).reshape(b.shape).astype(b.dtype) if out else b.copy()]


declare(OpDef("ldl_solve", {}, _ldl_solve_infer, _ldl_solve_ref, doc="X with A X = B from ldl_factor's (LD, pivots)"))
