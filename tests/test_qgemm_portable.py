"""The integer-dot kernel, built with AVX2 switched off (the portable C path a CPU without it, e.g.
aarch64, runs), for plain AVX2 (maddubs: the path of a CPU without VNNI, whatever this one has) and for
this machine (VNNI dpbusd where it has it, and the 512-bit int4 prefill tile on AVX-512 VNNI), each
checked against matmul_q's numpy reference."""
import ctypes
import platform
import subprocess

import numpy as np
import pytest

from cuvil.build.toolchain import KERNELS_DIR
from cuvil.codegen.c.lower_llm import _q4_block_scales, _q4_blocks, _q8_block_scales, _q8_blocks
from cuvil.ir.ops import REGISTRY
from cuvil.ir.ops.llm import act_block
from cuvil.target import cpu_flags

from .test_ops import _quantize


@pytest.fixture(scope="module", params=["portable", "avx2", "native"])
def portable_lib(request, tmp_path_factory):
    """The kernel built without AVX2 (the portable C tiles), for Haswell's AVX2 and for this machine."""
    out = tmp_path_factory.mktemp("qgemm") / "libqgemm.so"
    x86 = platform.machine() in ("x86_64", "AMD64")
    if request.param == "avx2" and not (x86 and "avx2" in cpu_flags()):
        pytest.skip("the AVX2 tiles need an x86-64 CPU with AVX2 to run")
    flags = {"native": ["-march=native"], "avx2": ["-march=haswell"]}.get(
        request.param, ["-mno-avx2", "-mno-fma"] if x86 else [])
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", *flags, str(KERNELS_DIR / "qgemm.c"),
                    str(KERNELS_DIR / "gemm.c"), str(KERNELS_DIR / "pool.c"), "-o", str(out), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.cuvil_qgemm.restype = ctypes.c_int
    return lib


@pytest.mark.parametrize("bits,group,m,n,k", [(4, 32, 1, 6, 64), (4, 64, 5, 10, 128), (4, 128, 3, 4, 256),
                                              (4, 32, 17, 22, 448),      # prefill rows, a partial block of columns
                                              (4, 128, 7, 14, 512), (4, 64, 2, 42, 64),
                                              # 512-bit int4 decode tiles of 4 and 8 rows (5-8 rows: one of 8)
                                              (4, 32, 8, 40, 128), (4, 64, 6, 70, 256), (4, 32, 4, 34, 128),
                                              (8, 1 << 30, 1, 7, 96), (8, 1 << 30, 6, 9, 256),
                                              (8, 1 << 30, 1, 40, 192), (8, 1 << 30, 9, 17, 128),
                                              # 512-bit int8 prefill: tiles of 6 rows and the rest, two quads
                                              # and a lone last one, blocks of 32 / 64 / 128
                                              (8, 1 << 30, 13, 72, 192), (8, 1 << 30, 4, 100, 96),
                                              (8, 1 << 30, 8, 130, 256), (8, 1 << 30, 2, 64, 128),
                                              # 512-bit int4 rows past 8: tiles of 8, the last 1-4 rows in one of 4 (9: 8 + 4, 13: 8 + 8, 11: 8 + 4), a lone last quad
                                              (4, 32, 9, 130, 256), (4, 128, 13, 72, 256), (4, 64, 11, 100, 192)])
def test_portable_qgemm_matches_reference(portable_lib, bits, group, m, n, k):
    rng = np.random.default_rng(k + m)
    w, s = _quantize(rng, k, n, bits, group)
    _check(portable_lib, bits, group, w, s, rng.uniform(-1, 1, (m, k)).astype(np.float32), atol=1e-4)


@pytest.mark.parametrize("bits,group", [(8, 1 << 30), (4, 64)])
def test_qgemm_over_threads_matches_reference(portable_lib, bits, group):
    """Enough rows x K that the activations are quantized across the threads (rows split between them),
    and tasks of column blocks on 3 threads."""
    rng = np.random.default_rng(11)
    w, s = _quantize(rng, 1024, 200, bits, group)
    _check(portable_lib, bits, group, w, s, rng.uniform(-1, 1, (45, 1024)).astype(np.float32), atol=1e-4, threads=3)


def test_int4_scales_below_float16_normals(portable_lib):
    """int4 scales are stored as float16: ones in its subnormal range (< 6.1e-5) keep their value."""
    rng = np.random.default_rng(7)
    w, s = _quantize(rng, 128, 16, 4, 64)
    s = (s * 3e-3).astype(np.float32)          # 3e-6 .. 6e-5
    _check(portable_lib, 4, 64, w, s, rng.uniform(-1, 1, (3, 128)).astype(np.float32), atol=1e-9)


def _check(portable_lib, bits, group, w, s, x, atol, threads=1):
    m, k = x.shape
    n = w.shape[1] * (2 if bits == 4 else 1)
    ab = act_block(bits, k, group)
    want = REGISTRY["matmul_q"].ref([x, w, s], {"bits": bits, "group": group, "act_block": ab})
    wp = _q4_blocks(w) if bits == 4 else _q8_blocks(w)
    sp = _q4_block_scales(s) if bits == 4 else _q8_block_scales(s)
    got = np.zeros((m, n), np.float32)
    p = ctypes.c_void_p
    rc = portable_lib.cuvil_qgemm(ctypes.c_int64(m), ctypes.c_int64(n), ctypes.c_int64(k), ctypes.c_int64(k),
                                  p(x.ctypes.data),
                                  ctypes.c_int64(k), p(wp.ctypes.data), bits, p(sp.ctypes.data), ctypes.c_int64(ab),
                                  p(got.ctypes.data), ctypes.c_int64(n), None, threads)
    assert rc == 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
