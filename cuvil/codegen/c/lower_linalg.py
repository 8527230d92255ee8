"""C lowering of the linear-algebra ops (ir/ops/linalg.py): each one call into kernels/linalg.c over
the batch of matrices, float32 only (other float dtypes are refused before code is generated)."""
from __future__ import annotations

from ...ir import dims as D
from . import cexpr
from .emit import lowering


def _float32_only(node):
    return None if node.inputs[0].dtype == "float32" else f"{node.op} of {node.inputs[0].dtype} matrices"


def _batch(v):
    return cexpr.prod(v.type.shape[:-2])


@lowering("lu_factor", supports=_float32_only)
def lower_lu_factor(em, node):
    x = node.inputs[0]
    lu, piv, info = node.outputs
    m, n = x.type.shape[-2:]
    return [f"cuvil_lu_factor({_batch(x)}, {D.to_c(m)}, {D.to_c(n)}, {em.ptr(x)}, {em.ptr(lu)}, {em.ptr(piv)}, "
            f"{em.ptr(info)});"]


@lowering("lu_permutation")
def lower_lu_permutation(em, node):
    piv, perm = node.inputs[0], node.outputs[0]
    return [f"cuvil_lu_permutation({cexpr.prod(piv.type.shape[:-1])}, {D.to_c(piv.type.shape[-1])}, "
            f"{node.attrs['rows']}, {em.ptr(piv)}, {em.ptr(perm)});"]


@lowering("cholesky", supports=_float32_only)
def lower_cholesky(em, node):
    x = node.inputs[0]
    low, info = node.outputs
    return [f"cuvil_cholesky({_batch(x)}, {D.to_c(x.type.shape[-1])}, {em.ptr(x)}, {em.ptr(low)}, {em.ptr(info)});"]


@lowering("triangular_solve", supports=_float32_only)
def lower_triangular_solve(em, node):
    a, b = node.inputs
    x = node.outputs[0]
    n, k = b.type.shape[-2:]
    return [f"cuvil_triangular_solve({_batch(a)}, {D.to_c(n)}, {D.to_c(k)}, {em.ptr(a)}, {em.ptr(b)}, {em.ptr(x)}, "
            f"{int(bool(node.attrs['upper']))}, {int(bool(node.attrs['unit']))});"]


@lowering("householder_qr", supports=_float32_only)
def lower_householder_qr(em, node):
    x = node.inputs[0]
    qr, tau = node.outputs
    m, n = x.type.shape[-2:]
    return [f"cuvil_householder_qr({_batch(x)}, {D.to_c(m)}, {D.to_c(n)}, {em.ptr(x)}, {em.ptr(qr)}, {em.ptr(tau)});"]


@lowering("householder_product", supports=_float32_only)
def lower_householder_product(em, node):
    v, tau = node.inputs
    m, n = v.type.shape[-2:]
    return [f"cuvil_householder_product({_batch(v)}, {D.to_c(m)}, {D.to_c(n)}, {D.to_c(tau.type.shape[-1])}, "
            f"{em.ptr(v)}, {em.ptr(tau)}, {em.ptr(node.outputs[0])});"]


@lowering("eigh", supports=_float32_only)
def lower_eigh(em, node):
    x = node.inputs[0]
    w, v = node.outputs
    return [f"cuvil_eigh({_batch(x)}, {D.to_c(x.type.shape[-1])}, {em.ptr(x)}, {em.ptr(w)}, {em.ptr(v)});"]


@lowering("svd", supports=_float32_only)
def lower_svd(em, node):
    x = node.inputs[0]
    u, s, vt = node.outputs
    m, n = x.type.shape[-2:]
    return [f"cuvil_svd({_batch(x)}, {D.to_c(m)}, {D.to_c(n)}, {em.ptr(x)}, {em.ptr(u)}, {em.ptr(s)}, {em.ptr(vt)});"]
