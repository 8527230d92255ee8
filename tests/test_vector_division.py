"""hardswish's division by 6 in the vector epilogues (vmath.h cuvil_vdiv_by): with CUVIL_FAST_DIV (Intel
AVX-512's tuning) a multiply and a correction FMA, which must give the quotients vdivps gives, bit for
bit, signed zeros, infinities and NaN included; with it off the division itself. Both built with
explicit AVX-512 flags, so a host whose tuning picks the other form still tests this one."""
import ctypes
import platform

import numpy as np
import pytest

from cuvil.codegen.c.gen_activations import ACT_CODES
from cuvil.target import cpu_flags

from .util import build_kernels

AVX512 = ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]


@pytest.fixture(scope="module", params=[0, 1], ids=["vdivps", "fast"])
def lib(request):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the builds' flags are x86 flags")
    if "avx512f" not in cpu_flags():
        pytest.skip("this CPU has no AVX-512F (the division by 6 is plain C division elsewhere)")
    flags = AVX512 + [f"-DCUVIL_FAST_DIV={request.param}"]
    lib = build_kernels(("gemm.c", "pool.c"), flags)
    lib.cuvil_activate_block.restype = None
    return lib


def _hardswish_in_c(lib, x):
    """x (a multiple of 16 long: every lane through the vector path) hardswished in place by the kernels."""
    y = np.ascontiguousarray(x, np.float32).copy()
    lib.cuvil_activate_block(y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(y.size), ctypes.c_int64(0),
                             ctypes.c_int64(1), ctypes.c_int64(0), ctypes.c_int64(y.size), ACT_CODES["hardswish"])
    return y


def test_hardswish_divides_by_six_as_the_division_does(lib):
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -3.0, 3.0, -2.9999998, 6.0, 1e38, -1e38, 3.4e38,
                        1e-30, -1e-30, 0.5, -0.5, 2.9999998, 1.0 / 3.0], np.float32)
    x = np.concatenate([bits.view(np.float32), special, rng.standard_normal(1 << 12).astype(np.float32) * 4])
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])
    with np.errstate(all="ignore"):
        want = x * np.clip(x + np.float32(3), 0, 6).astype(np.float32) / np.float32(6)
    got = _hardswish_in_c(lib, x)
    # quotients below 1e-37 may differ in their last bits (the remainder is no longer exact there)
    normal = ~(np.abs(want) < 1e-37)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = normal & ~same
    assert not bad.any(), f"{bad.sum()} quotients differ, e.g. x={x[bad][:4]}: {got[bad][:4]} against {want[bad][:4]}"
    np.testing.assert_allclose(got[~normal], want[~normal], rtol=0, atol=1e-37)
    # signed zeros: every x <= -3 gives -0, as x * 0 / 6 does
    neg = x <= -3
    assert np.signbit(got[neg & (want == 0)]).all()
