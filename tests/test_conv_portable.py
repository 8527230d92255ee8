"""The depthwise conv kernel (kernels/conv.c, cuvil_conv2d's depthwise path) built for 4-float vectors
(SSE2, the width NEON and the portable build have), for AVX2's 8 and for this machine, each checked
against torch's conv2d: the vector width decides where a row's last, partly stored vector begins; the
banded kernel's specializations (3x3, 5x5, 7x7 at strides 1 and 2) and its general form (other
filters, dilations, unequal strides), a band of fewer rows than the tile, and the output-by-output
path (stride 3, a row too wide for the band buffer) are each taken by some case."""
import ctypes
import platform

import numpy as np
import pytest
import torch

from cuvil.codegen.c.gen_activations import ACT_CODES
from cuvil.target import cpu_flags

from .util import build_kernels

WIDTHS = {"sse2": ["-march=x86-64"], "avx2": ["-march=haswell"], "native": ["-march=native"]}


class ConvShape(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in
                ("N", "C", "H", "W", "O", "KH", "KW", "OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw", "groups")]


@pytest.fixture(scope="module", params=list(WIDTHS))
def conv_lib(request):
    x86 = platform.machine() in ("x86_64", "AMD64")
    if request.param != "native" and not x86:
        pytest.skip(f"{request.param} flags are x86 flags")
    if request.param == "avx2" and "avx2" not in cpu_flags():
        pytest.skip("this CPU cannot run AVX2 code")
    return build_kernels(("conv.c", "gemm.c", "pool.c"), WIDTHS[request.param])


def _ptr(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if a is not None else None


@pytest.mark.parametrize("k,stride,pad,dil,mult,act,hw", [
    (3, 1, 1, 1, 1, "relu", (13, 37)), (3, 2, 1, 1, 1, "none", (14, 35)), (5, 2, 2, 1, 2, "silu", (11, 29)),
    (7, 1, 3, 1, 1, "gelu", (9, 23)), (3, 1, 2, 2, 1, "none", (10, 19)), (3, 1, 0, 1, 1, "none", (5, 6)),
    (5, 1, 2, 1, 1, "relu", (14, 14)), (3, 1, 1, 1, 1, "none", (7, 7)), (5, 2, 2, 1, 1, "none", (28, 28)),
    (3, 1, 1, 1, 1, "relu", (20, 20, "in place")), (7, 2, 3, 1, 1, "none", (17, 30)),
    ((3, 5), (1, 2), (1, 2), 1, 1, "relu", (9, 21)), (3, 3, 1, 1, 1, "none", (16, 25)),
    (5, 1, 2, 1, 1, "none", (6, 5000)), (3, 1, 1, 1, 1, "none", (1, 40)), (5, 2, 0, 1, 1, "none", (5, 5)),
    (5, 2, 2, 1, 1, "relu", (13, 13, "in place")),
    # planes too large to copy whole (64 KiB): band by band
    (3, 1, 1, 1, 1, "relu", (130, 140)), (5, 2, 2, 1, 1, "none", (150, 100))])
def test_depthwise_matches_torch(conv_lib, k, stride, pad, dil, mult, act, hw):
    """Maps of every width class at 4, 8 and 16 floats: whole vectors and a last vector stored in part
    (rows narrower than one vector too), and a residual the output overwrites in place."""
    in_place = len(hw) == 3
    hw = hw[:2]
    (kh, kw), (sh, sw), (ph, pw) = (v if isinstance(v, tuple) else (v, v) for v in (k, stride, pad))
    rng = np.random.default_rng(kh * 7 + sw)
    n, c, (h, w) = 2, 3, hw
    x = rng.standard_normal((n, c, h, w), np.float32)
    wt = rng.standard_normal((c * mult, 1, kh, kw), np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), (sh, sw),
                                      (ph, pw), dil, groups=c)
    res = rng.standard_normal(tuple(want.shape), np.float32)
    want = want + torch.from_numpy(res)
    want = {"relu": torch.relu, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
            "none": lambda t: t}[act](want).numpy()
    oh, ow = want.shape[2:]
    s = ConvShape(n, c, h, w, c * mult, kh, kw, oh, ow, sh, sw, ph, pw, dil, dil, c)
    y = res.copy() if in_place else np.full(want.shape, np.nan, np.float32)
    conv_lib.cuvil_conv2d(ctypes.byref(s), 0, _ptr(x), _ptr(wt), None, _ptr(b), _ptr(y if in_place else res), _ptr(y),
                          ACT_CODES[act], None, 2)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def _guarded_floats(n):
    """A float32 array of n values that ends where a page no process may read begins (mmap + mprotect):
    a read past its end faults, so a kernel that reads one is caught, not silently given garbage."""
    import mmap
    page = mmap.PAGESIZE
    nbytes = -(-n * 4 // page) * page
    buf = mmap.mmap(-1, nbytes + page)
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(base + nbytes, page, 0) == 0
    arr = np.frombuffer(buf, np.float32, count=n, offset=nbytes - n * 4)
    return arr, buf


@pytest.mark.parametrize("cin,cout,hw,act", [
    (58, 58, (28, 28), "relu"), (116, 116, (14, 14), "none"), (232, 232, (7, 7), "relu"),
    (24, 16, (5, 3), "none"), (200, 40, (9, 9), "relu"), (300, 24, (3, 11), "none"), (260, 8, (3, 7), "relu"),
    # more filters than input channels over a shallow K: in place too (no scratch is given)
    (24, 72, (13, 9), "relu"), (40, 120, (7, 7), "none")])
def test_pointwise_input_read_in_place_at_any_width(conv_lib, cin, cout, hw, act):
    """1x1 convs whose GEMM reads the NCHW input in place (path 1, INPUT_AS_B, no scratch): pixel counts
    that fill no whole panel (784, 196, 49, 15, 81, 33, 21: an edge panel of 16, 4, 17, 15, 17, 1, 21
    columns; 117 and 49 with more filters than input channels), shallow K (<= 192) and deep (200, 232, 300: the block copied for the row tiles; 260 into
    8 filters: one row tile, the edge panel copied alone), two images, the last one's input ending at
    an unreadable page."""
    rng = np.random.default_rng(cin + cout)
    n, (h, w) = 2, hw
    x, keep = _guarded_floats(n * cin * h * w)
    x[:] = rng.standard_normal(x.size, np.float32)
    x4 = x.reshape(n, cin, h, w)
    wt = rng.standard_normal((cout, cin, 1, 1), np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    res = rng.standard_normal((n, cout, h, w), np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x4.copy()), torch.from_numpy(wt), torch.from_numpy(b))
    want = want + torch.from_numpy(res)
    want = (torch.relu(want) if act == "relu" else want).numpy()
    s = ConvShape(n, cin, h, w, cout, 1, 1, h, w, 1, 1, 0, 0, 1, 1, 1)
    y = np.full(want.shape, np.nan, np.float32)
    conv_lib.cuvil_conv2d(ctypes.byref(s), 1, _ptr(x), _ptr(wt), None, _ptr(b), _ptr(res), _ptr(y),
                          ACT_CODES[act], None, 2)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    del x, x4
