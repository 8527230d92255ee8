"""The GEMM's facts on the Python side: the target's panel width and tile rows, the packed layouts
of B (panels) and A (tiles) that kernels/gemm.h reads, and the plan of a matmul (which kernel, how
much scratch), read by both its scratch sizing and its lowering."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import dims as D


def panel_width(em):
    """Columns per packed panel for this build's target (2 vectors): see kernels/gemm.h."""
    from ...target import vector_floats
    return 2 * vector_floats(em.target)


def tile_rows(em):
    """Rows of the GEMM's register tile for this build's target (CUVIL_MR): see kernels/gemm.h."""
    return 8 if panel_width(em) == 32 else 6


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> panels [ceil(N/nr), K, nr], zero padded (the layout cuvil_sgemm_packed reads)."""
    K, N = b.shape
    npan = -(-N // nr)
    out = np.zeros((npan, K, nr), np.float32)
    padded = np.zeros((K, npan * nr), np.float32)
    padded[:, :N] = b
    out[:] = padded.reshape(K, npan, nr).transpose(1, 0, 2)
    return out


# kernels/gemm.h's K block and M block: with the target's tile rows (tile_rows), the layout of a
# prepacked A operand, and the M blocks a conv's GEMM runs in (one: im2col inside the GEMM; several:
# im2col once, whole)
GEMM_KC, GEMM_MC = 384, 120


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
    """[M, K] -> the tiles cuvil_sgemm_packed_ab reads: per K block of GEMM_KC, per tile of mr
    rows, [kc][mr] (zero rows past M)."""
    M, K = a.shape
    tiles = -(-M // mr)
    padded = np.zeros((tiles * mr, K), np.float32)
    padded[:M] = a
    blocks = [padded[:, k0:k0 + GEMM_KC].reshape(tiles, mr, -1).transpose(0, 2, 1).ravel()
              for k0 in range(0, K, GEMM_KC)]
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)


def mat_dims(v, is_b):
    """(batch dims, rows, columns) of a matmul operand; a vector is a row of A or a column of B."""
    s = v.type.shape
    if len(s) == 1:
        return ((), s[0], 1) if is_b else ((), 1, s[0])
    return s[:-2], s[-2], s[-1]


@dataclass(frozen=True)
class MatmulPlan:
    """kind: "prepacked" (float32, a constant B without batch dims packed at compile time into panels; all
    batch rows of A form one tall GEMM), "packed" (float32, B packed at run time into the scratch, one GEMM
    per batch matrix) or "naive" (other dtypes: the plain kernel reads B as it is).
    scratch_bytes: the scratch the kind needs at the dims' upper bounds (None when no bounds were given)."""
    kind: str
    scratch_bytes: int | None = None


def matmul_plan(node, bounds=None) -> MatmulPlan:
    a, b = node.inputs[:2]
    if a.dtype != "float32":
        return MatmulPlan("naive", 0 if bounds is not None else None)
    abatch, bbatch = mat_dims(a, False)[0], mat_dims(b, True)[0]
    obatch = node.outputs[0].type.shape[:node.outputs[0].type.rank - (a.type.rank >= 2) - (b.type.rank >= 2)]
    if b.is_const and not bbatch and (not abatch or len(abatch) == len(obatch)):
        return MatmulPlan("prepacked", 0 if bounds is not None else None)
    if bounds is None:
        return MatmulPlan("packed")
    _, K, N = mat_dims(b, True)
    K, N = D.upper_bound(K, bounds), D.upper_bound(N, bounds)
    nr = 64  # widest panel (AVX-512): safe upper bound for every target
    return MatmulPlan("packed", (-(-N // nr) * nr * K) * 4)
