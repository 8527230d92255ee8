"""C lowering of the linear-algebra ops (ir/ops/linalg.py): each one call into kernels/linalg.c over
the batch of matrices, float32 only (other float dtypes are refused before code is generated)."""
from __future__ import annotations

from ...ir import dims as D
from . import cexpr
from .emit import lowering


def _float32_only(node):
    return None if node.inputs[0].dtype == "float32" else f"{node.op} of {node.inputs[0].dtype} matrices"


def _call(em, fn, sizes, node, flags=()):
    """fn(the batch of the first input's matrices, sizes..., every input's and output's pointer, flags...)"""
    lead = cexpr.prod(node.inputs[0].type.shape[:-2 if node.op != "lu_permutation" else -1])
    args = [lead, *(D.to_c(d) for d in sizes), *(em.ptr(v) for v in (*node.inputs, *node.outputs)), *flags]
    return [f"{fn}({', '.join(str(a) for a in args)});"]


# ops lowered as cuvil_<op>(batch, the trailing dims of one input, pointers): op -> (that input, dims)
ONE_CALL = {"lu_factor": (0, 2), "cholesky": (0, 1), "householder_qr": (0, 2), "eigh": (0, 1), "svd": (0, 2),
            "ldl_factor": (0, 1), "ldl_solve": (2, 2)}


def _one_call(em, node):
    i, n = ONE_CALL[node.op]
    return _call(em, f"cuvil_{node.op}", node.inputs[i].type.shape[-n:], node)


lowering(*ONE_CALL, supports=_float32_only)(_one_call)


@lowering("lu_permutation")
def lower_lu_permutation(em, node):
    return _call(em, "cuvil_lu_permutation", [node.inputs[0].type.shape[-1], node.attrs["rows"]], node)


@lowering("triangular_solve", supports=_float32_only)
def lower_triangular_solve(em, node):
    return _call(em, "cuvil_triangular_solve", node.inputs[1].type.shape[-2:], node,
                 [int(bool(node.attrs["upper"])), int(bool(node.attrs["unit"]))])


@lowering("householder_product", supports=_float32_only)
def lower_householder_product(em, node):
    v, tau = node.inputs
    return _call(em, "cuvil_householder_product", [*v.type.shape[-2:], tau.type.shape[-1]], node)


