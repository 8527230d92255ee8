"""Linear algebra compiled from torch (frontend/aten_linalg.py on ir/ops/linalg.py) against torch eager:
det, slogdet, inverse, solves (batched, broadcast, from the right, vector right-hand sides), LU
(factor, unpack, solve with adjoint), triangular solves, Cholesky, Householder QR, eigenvalues, singular
values, pinv, rank and condition number, in one compiled module; LDL (Bunch-Kaufman) factor and solve;
and eigen/singular vectors refused."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the cases compile torch modules and compare with eager")


class _Linalg(torch.nn.Module):
    def forward(self, a, b, v, spd, low):
        lin = torch.linalg
        lu, piv = lin.lu_factor(a)
        p, l_, u = lin.lu(a[0, :, :4])                        # a wide 5 x 4 slice: L 5 x 4, U 4 x 4
        sign, logabs = lin.slogdet(a)
        factor = lin.cholesky(spd)
        return (lin.det(a), sign, logabs, lin.inv(a), lin.solve(a, b), lin.solve(a[0], b),     # broadcast
                lin.solve(a, b.mT, left=False), lin.solve(a[0], v), lu, piv, p, l_, u,
                lin.lu_solve(lu, piv, b, adjoint=True), lin.lu_solve(lu, piv, b.mT, left=False),
                lin.solve_triangular(low, b, upper=False), lin.solve_triangular(low.mT, b.mT, upper=True, left=False),
                lin.solve_triangular(low, b, upper=False, unitriangular=True),
                torch.triangular_solve(b, low, upper=False, transpose=True)[0],
                factor, lin.cholesky(spd, upper=True), torch.cholesky_solve(b, factor),
                torch.cholesky_solve(b, factor.mT, upper=True), torch.cholesky_inverse(factor),
                torch.logdet(spd), *torch.linalg.qr(a), *torch.linalg.qr(b, mode="complete"), *torch.geqrf(b),
                torch.ormqr(*torch.geqrf(a), b, transpose=True), lin.eigvalsh(spd), lin.svdvals(b), lin.pinv(b),
                lin.pinv(spd, hermitian=True), lin.matrix_rank(a), lin.cond(a), lin.matrix_norm(b, "nuc"),
                lin.pinv(a, atol=0.5), lin.pinv(b, rtol=0.3), lin.pinv(b, atol=0.0))


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2, 5, 5, generator=g) + 3 * torch.eye(5)
    b = torch.randn(2, 5, 3, generator=g)
    v = torch.randn(5, generator=g)
    m = torch.randn(2, 5, 5, generator=g)
    spd = m @ m.mT + 5 * torch.eye(5)
    low = torch.tril(torch.randn(2, 5, 5, generator=g)) + 4 * torch.eye(5)
    return a, b, v, spd, low


def test_linalg_ops_match_eager(tmp_path):
    import cuvil
    m = _Linalg().eval()
    args = _inputs()
    cm = cuvil.compile(m, args, cache_dir=str(tmp_path))
    for seed in (0, 1):                         # the same artifact on other matrices
        args = _inputs(seed)
        with torch.no_grad():
            want = m(*args)
        got = cm.run(*[t.numpy() for t in args])
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            if w.dtype == torch.int32:
                np.testing.assert_array_equal(g, w.numpy(), err_msg=f"output {i}")
            else:
                np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"output {i}")


def test_singular_matrix_gives_info_not_an_exception(tmp_path):
    """A compiled model cannot raise mid-call: torch's error check is dropped, det of a singular matrix
    is 0 and lu_factor_ex / inv_ex / cholesky_ex report the failure in info, as torch's _ex ops do."""
    import cuvil

    class M(torch.nn.Module):
        def forward(self, a, spd):
            return (torch.linalg.det(a), torch.linalg.lu_factor_ex(a).info, torch.linalg.inv_ex(a).info,
                    torch.linalg.cholesky_ex(spd).info)

    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]])   # rank 2
    spd = torch.diag(torch.tensor([2.0, -1.0, 3.0]))                      # not positive definite
    cm = cuvil.compile(M().eval(), (a, spd), cache_dir=str(tmp_path))
    det, lu_info, inv_info, chol_info = cm.run(a.numpy(), spd.numpy())
    want = M()(a, spd)
    assert abs(float(det)) < 1e-5 and float(want[0]) == pytest.approx(0, abs=1e-5)
    assert int(lu_info) == int(want[1]) == 3 and int(inv_info) == int(want[2]) == 3
    assert int(chol_info) == int(want[3]) == 2


def test_eigenvectors_and_singular_vectors_are_refused():
    """Their signs are LAPACK's choice (unspecified), so torch's and cuvil's differ: a clear error, not a
    wrong answer."""
    import cuvil

    class M(torch.nn.Module):
        def forward(self, a):
            return torch.linalg.svd(a).U

    with pytest.raises(cuvil.UnsupportedOpError, match="singular vectors"):
        cuvil.compile(M(), (torch.randn(4, 3),))


class _Ldl(torch.nn.Module):
    def forward(self, a, b):
        ld, piv, info = torch.linalg.ldl_factor_ex(a)
        return ld, piv, info, torch.linalg.ldl_solve(ld, piv, b)


def test_ldl_factor_and_solve_match_lapack_through_torch(tmp_path):
    """Bunch-Kaufman pivots of every kind: diagonally dominant (no swaps), indefinite with small diagonals
    (2 x 2 blocks), a zero column (info), a non-symmetric input (its lower triangle read), odd sizes."""
    import cuvil
    g = torch.Generator().manual_seed(7)
    m = torch.randn(6, 7, 7, generator=g)
    a = m + m.mT
    a[0] += 10 * torch.eye(7)
    a[1] -= torch.diag(torch.diagonal(a[1])) * 0.99                 # tiny diagonal: 2 x 2 pivots
    a[2, :, 3] = 0
    a[2, 3, :] = 0                                                   # a zero row and column
    a[3] = torch.randn(7, 7, generator=g)                            # not symmetric: the lower triangle counts
    b = torch.randn(6, 7, 2, generator=g)
    cm = cuvil.compile(_Ldl(), (a, b), cache_dir=str(tmp_path))
    got, want = cm(a, b), _Ldl()(a, b)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    ok = want[2] == 0                                                 # solves of the nonsingular ones
    torch.testing.assert_close(got[3][ok], want[3][ok], rtol=1e-3, atol=1e-3)
    assert (want[1][1] < 0).any()                                    # the case did exercise 2 x 2 blocks


def test_ldl_solve_with_corrupt_pivots_stays_in_bounds(tmp_path):
    """Pivots are an input of ldl_solve: 0, INT_MIN and out-of-range ones clamp (some answer, no write
    outside the buffers)."""
    import cuvil
    a = torch.randn(5, 5)
    a = a + a.mT
    ld, piv = torch.linalg.ldl_factor(a)
    cm = cuvil.compile(_LdlSolve(), (ld, piv, torch.randn(5, 2)), cache_dir=str(tmp_path))
    for bad in ([0, 0, 0, 0, 0], [-2**31, 7, -9, 2**31 - 1, 1]):
        out = cm(ld, torch.tensor(bad, dtype=torch.int32), torch.randn(5, 2))
        assert out.shape == (5, 2)


class _LdlSolve(torch.nn.Module):
    def forward(self, ld, piv, b):
        return torch.linalg.ldl_solve(ld, piv, b)
