"""The vector exp behind the SiLU and sigmoid epilogues (vmath.h cuvil_vexp: n rounded by the 1.5 * 2^23
add, a degree-6 polynomial): every lane through the vector path of each ISA's build (AVX-512, AVX2 and
SSE2's 4-float portable form, built with explicit flags), against float64 numpy. Near-ulp accuracy where
the results are normal floats, and the edges as the formulas give them: NaN kept, +inf to inf, huge
negative inputs to -0 (SiLU) or 0 (sigmoid)."""
import ctypes

import numpy as np
import pytest

from cuvil.codegen.c.gen_activations import ACT_CODES
from cuvil.target import TARGETS

from .util import build_kernels, skip_unless_host_runs


@pytest.fixture(scope="module", params=["x86_64-avx512", "x86_64-avx2", "x86_64-sse2"])
def lib(request):
    skip_unless_host_runs(request.param)
    lib = build_kernels(("gemm.c", "pool.c"), TARGETS[request.param].flags)
    lib.cuvil_activate_block.restype = None
    return lib


def _activate(lib, x, name):
    """x (a multiple of 16 long, so every lane takes the vector path) through one activation in C."""
    y = np.ascontiguousarray(x, np.float32).copy()
    lib.cuvil_activate_block(y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(y.size), ctypes.c_int64(0),
                             ctypes.c_int64(1), ctypes.c_int64(0), ctypes.c_int64(y.size), ACT_CODES[name])
    return y


def _inputs():
    sweep = np.linspace(-90, 90, 180_000, dtype=np.float32)
    fine = np.linspace(-1, 1, 20_000, dtype=np.float32)       # where the reduced argument is the input itself
    x = np.concatenate([sweep, fine])
    return np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])


@pytest.mark.parametrize("name, formula", [("silu", lambda x: x / (1 + np.exp(-x))),
                                           ("sigmoid", lambda x: 1 / (1 + np.exp(-x)))])
def test_silu_and_sigmoid_are_within_a_few_ulp(lib, name, formula):
    x = _inputs()
    with np.errstate(over="ignore"):
        want = formula(x.astype(np.float64))
    got = _activate(lib, x, name).astype(np.float64)
    # past x = -80 SiLU's tiny results are what the clamp at exp's top leaves (within 1e-35 of them)
    normal = np.abs(want) > 1e-30
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    # 2.4e-7 is 4 ulp: the exp's 1e-7 (9e-8 in its polynomial) and one rounded division
    assert rel.max() < 2.4e-7, f"{name}: worst at x={x[normal][rel.argmax()]}: {got[normal][rel.argmax()]} " \
                               f"against {want[normal][rel.argmax()]}"
    np.testing.assert_allclose(got[~normal], want[~normal], rtol=0, atol=1e-35)


def test_edges(lib):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 88.8, -88.8, 104.5, -104.5, 3.4e38, -3.4e38,
                  1e-30, -1e-30, 20.0], np.float32)
    silu, sigmoid = _activate(lib, x, "silu"), _activate(lib, x, "sigmoid")
    assert np.isnan(silu[0]) and np.isnan(sigmoid[0])
    assert silu[1] == np.inf and sigmoid[1] == 1.0
    assert sigmoid[2] == 0.0 and np.isnan(silu[2])     # -inf / inf, as torch's -inf * sigmoid(-inf)
    np.testing.assert_array_equal(silu[3:5], [0.0, 0.0])
    np.testing.assert_array_equal(sigmoid[3:5], [0.5, 0.5])
    np.testing.assert_array_equal(silu[[5, 9, 11]], x[[5, 9, 11]])          # sigmoid rounds to 1
    np.testing.assert_array_equal(sigmoid[[5, 9, 11]], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(silu[[6, 8, 10, 12]], [0.0, 0.0, 0.0, 0.0], atol=1e-35)
    np.testing.assert_allclose(sigmoid[[6, 8, 10, 12]], [0.0, 0.0, 0.0, 0.0], atol=1e-38)
    np.testing.assert_allclose(silu[13:15], x[13:15] / 2, rtol=1e-7)
    np.testing.assert_allclose(sigmoid[15], 1 / (1 + np.exp(-20.0)), rtol=1e-7)
