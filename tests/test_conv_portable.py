"""The depthwise conv kernel (kernels/conv.c, cuvil_conv2d's depthwise path) built for 4-float vectors
(SSE2, the width NEON and the portable build have), for AVX2's 8 and for this machine, each checked
against torch's conv2d: the vector loop's width decides which columns it takes and where the tail
and the edges begin."""
import ctypes
import platform
import subprocess

import numpy as np
import pytest
import torch

from cuvil.build.toolchain import COMMON_FLAGS, KERNELS_DIR
from cuvil.codegen.c.gen_activations import ACT_CODES
from cuvil.target import cpu_flags

WIDTHS = {"sse2": ["-march=x86-64"], "avx2": ["-march=haswell"], "native": ["-march=native"]}


class ConvShape(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in
                ("N", "C", "H", "W", "O", "KH", "KW", "OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw", "groups")]


@pytest.fixture(scope="module", params=list(WIDTHS))
def conv_lib(request, tmp_path_factory):
    x86 = platform.machine() in ("x86_64", "AMD64")
    if request.param != "native" and not x86:
        pytest.skip(f"{request.param} flags are x86 flags")
    if request.param == "avx2" and "avx2" not in cpu_flags():
        pytest.skip("this CPU cannot run AVX2 code")
    out = tmp_path_factory.mktemp("conv") / "libconv.so"
    srcs = [str(KERNELS_DIR / f) for f in ("conv.c", "gemm.c", "pool.c")]
    subprocess.run(["gcc", *COMMON_FLAGS, "-shared", *WIDTHS[request.param], *srcs, "-o", str(out), "-lm"],
                   check=True)
    return ctypes.CDLL(str(out))


def _ptr(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if a is not None else None


@pytest.mark.parametrize("k,stride,pad,dil,mult,act,hw", [
    (3, 1, 1, 1, 1, "relu", (13, 37)), (3, 2, 1, 1, 1, "none", (14, 35)), (5, 2, 2, 1, 2, "silu", (11, 29)),
    (7, 1, 3, 1, 1, "gelu", (9, 23)), (3, 1, 2, 2, 1, "none", (10, 19)), (3, 1, 0, 1, 1, "none", (5, 6)),
    (5, 1, 2, 1, 1, "relu", (14, 14)), (3, 1, 1, 1, 1, "none", (7, 7)), (5, 2, 2, 1, 1, "none", (28, 28)),
    (3, 1, 1, 1, 1, "relu", (20, 20, "in place"))])
def test_depthwise_matches_torch(conv_lib, k, stride, pad, dil, mult, act, hw):
    """Maps of every width class at 4, 8 and 16 floats: whole vectors, an overlapping last vector,
    8-float halves (16-float builds), the untested one-by-one columns; and a residual the output
    overwrites in place (no column recomputed from it)."""
    in_place = len(hw) == 3
    hw = hw[:2]
    rng = np.random.default_rng(k * 7 + stride)
    n, c, (h, w) = 2, 3, hw
    x = rng.standard_normal((n, c, h, w), np.float32)
    wt = rng.standard_normal((c * mult, 1, k, k), np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), stride, pad,
                                      dil, groups=c)
    res = rng.standard_normal(tuple(want.shape), np.float32)
    want = want + torch.from_numpy(res)
    want = {"relu": torch.relu, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
            "none": lambda t: t}[act](want).numpy()
    oh, ow = want.shape[2:]
    s = ConvShape(n, c, h, w, c * mult, k, k, oh, ow, stride, stride, pad, pad, dil, dil, c)
    y = res.copy() if in_place else np.full(want.shape, np.nan, np.float32)
    conv_lib.cuvil_conv2d(ctypes.byref(s), 0, _ptr(x), _ptr(wt), None, _ptr(b), _ptr(y if in_place else res), _ptr(y),
                          ACT_CODES[act], None, 2)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
