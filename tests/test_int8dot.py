"""Integer dot products for precision="int8" convs: the u8 x s8 GEMM rows (kernels/int8dot.c) and the
channel-blocked conv on them (kernels/blocked_dot.c cuvil_conv_blocked_int8) against numpy doing the
same arithmetic (each image mapped onto bytes over its range, int32 sums, scaled back). Built with
AVX-512 VNNI where this CPU has it, and always as portable C (4-float blocks) and for AVX2 (8-float
blocks), which run the same layouts, edges and epilogue on any x86-64 host; then compiled models
against torch."""
import ctypes
import platform

import numpy as np
import pytest

from cuvil.codegen.c.gen_activations import ACT_CODES
from cuvil.codegen.c.lower_blocked import filters_as_b, int8_filter_panels
from cuvil.codegen.c.lower_int8dot import filter_terms, int8_dot_panels, int8_matmul_terms, quantized_filters
from cuvil.target import cpu_flags

from .util import branching_conv_block, build_kernels, compile_linked_and_plain

# the native build runs AMX tiles where the CPU has them (the same integer sums), and without them VNNI
BUILDS = {"portable": (["-march=x86-64"], 4), "avx2": (["-march=haswell"], 8),
          "avx512_vnni": (["-march=native", "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"], 16),
          "amx": (["-march=native"], 16)}
FILES = ("blocked_dot.c", "depthwise_bytes.c", "blocked.c", "int8dot.c", "int8_matmul.c", "bf16dot.c", "gemm.c", "pool.c", "conv.c", "winograd.c",
         "winograd4.c", "winograd_blocked.c", "special.c")


class Shape(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int64) for f in "N C H W O KH KW OH OW sh sw ph pw dh dw groups".split()]


class DotOut(ctypes.Structure):
    _fields_ = [("C", ctypes.c_void_p), ("bias_row", ctypes.c_void_p), ("bias_col", ctypes.c_void_p),
                ("residual", ctypes.c_void_p), ("scale_col", ctypes.c_void_p), ("nb", ctypes.c_int64),
                ("ldn", ctypes.c_int64), ("ldm", ctypes.c_int64), ("res_ldm", ctypes.c_int64),
                ("alpha", ctypes.c_float), ("act", ctypes.c_int), ("bytes", ctypes.c_void_p), ("row0", ctypes.c_int64),
                ("col0", ctypes.c_int64), ("res_q", ctypes.c_void_p), ("res_ld", ctypes.c_int64),
                ("res_scale", ctypes.c_float), ("res_shift", ctypes.c_float), ("C16", ctypes.c_void_p),
                ("res16", ctypes.c_void_p)]


@pytest.fixture(scope="module", params=list(BUILDS))
def lib(request):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the builds' flags are x86 flags")
    flags, block = BUILDS[request.param]
    if request.param == "avx512_vnni" and not {"avx512_vnni", "avx512bw"} <= cpu_flags():
        pytest.skip("this CPU has no AVX-512 VNNI (the portable and AVX2 builds cover the kernels' C)")
    if request.param == "amx" and not {"amx_int8", "avx512_vnni"} <= cpu_flags():
        pytest.skip("this CPU has no AMX-INT8 (the VNNI build covers the kernels on this CPU)")
    if request.param == "avx2" and "avx2" not in cpu_flags():
        pytest.skip("this CPU has no AVX2")
    lib = build_kernels(FILES, flags)
    lib.cuvil_conv_blocked_int8.restype = ctypes.c_int
    lib.cuvil_conv_blocked_int8_scratch.restype = ctypes.c_int64
    lib.cuvil_max_pool_bytes.restype = None
    lib.block, lib.levels = block, lib.cuvil_i8_levels()
    assert lib.levels == (127 if request.param == "avx2" else 255)
    return lib


def _ptr(x):
    return None if x is None else x.ctypes.data_as(ctypes.c_void_p)


def test_panels_layout():
    q = np.arange(-60, 60, dtype=np.int8)[:, None].repeat(70, 1)[:9]        # K 9 (not a multiple of 4), N 70
    q[:, 67] = np.arange(9) - 4
    p = int8_dot_panels(q)
    assert p.shape == (2, 3, 64) and p.dtype == np.uint32
    word = int(p[1, 1, 3])                              # column 67, rows 4..7
    assert [np.int8(np.uint8((word >> 8 * i) & 255)) for i in range(4)] == [0, 1, 2, 3]
    assert (p[0, 2] >> 8 == 0).all()                    # K 9: row 8 in the low byte, zeros past it
    assert (p[1, :, 6:] == 0).all()                     # past N


@pytest.mark.parametrize("M,N,K,act,res", [(1, 64, 16, "none", False), (7, 100, 37, "relu", True),
                                           (200, 130, 96, "gelu", False), (3, 5, 4, "none", True)])
def test_matmul_on_a_fixed_grid_matches_its_bytes(lib, M, N, K, act, res):
    """cuvil_matmul_int8 (a QDQ model's linear layer): A onto bytes over the fixed range (values outside
    clipped, the zero point an integer), exact integer sums with the int8 weights, the zero point's share
    taken out per column, then bias, residual, activation; rows in blocks over threads, K no multiple of 4."""
    from cuvil.ir.ops.fused import apply_act
    rng = np.random.default_rng(M + N + K)
    lo, hi = -1.5, 2.5
    a = rng.uniform(lo - 0.5, hi + 0.5, (M, K)).astype(np.float32)          # some outside the range
    q = rng.integers(-127, 128, (K, N), dtype=np.int8)
    ws = rng.uniform(0.5, 2, (1, N)).astype(np.float32) * 1e-2
    bias = rng.standard_normal(N).astype(np.float32)
    r = rng.standard_normal((M, N)).astype(np.float32) if res else None
    scale = np.float32((hi - lo) / lib.levels)
    zero = np.float32(np.rint(-lo / scale))
    ab = np.clip(np.floor(a * np.float32(1 / scale) + (zero + np.float32(0.5))), 0, lib.levels)
    sums = (ab.astype(np.int64) - int(zero)) @ q.astype(np.int64)
    want = apply_act((sums * (scale * ws.astype(np.float64)) + bias + (0 if r is None else r)).astype(np.float32), act)
    y = np.full((M, N), np.nan, np.float32)
    wq, terms = int8_dot_panels(q), int8_matmul_terms(q, ws)
    rng_arr = np.array([lo, hi], np.float32)
    lib.cuvil_matmul_int8.restype = ctypes.c_int
    assert lib.cuvil_matmul_int8(ctypes.c_int64(M), ctypes.c_int64(N), ctypes.c_int64(K), _ptr(a), ctypes.c_int64(K),
                                 _ptr(wq), _ptr(terms), _ptr(bias), _ptr(r), _ptr(rng_arr), _ptr(y), ctypes.c_int64(N),
                                 ACT_CODES[act], 2) == 0
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("M,N,K,act", [(1, 64, 16, "none"), (7, 100, 36, "relu"), (53, 130, 96, "none"),
                                       (13, 5, 4, "relu"), (96, 256, 1024, "none")])
def test_rows_match_integer_sums(lib, M, N, K, act):
    """cuvil_i8_rows: exact int32 sums of unsigned A (bytes up to the build's levels) and signed B bytes
    (no saturation at the extremes), scaled per column, biased and activated, into row-major C."""
    rng = np.random.default_rng(M * N + K)
    a = rng.integers(0, lib.levels + 1, (M, K), dtype=np.uint8)
    a[0] = lib.levels                                   # extremes: 255 (AVX2: 127) * -128 summed K deep
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    b[:, 0] = -128
    scale = rng.uniform(0.5, 2, N).astype(np.float32) * 1e-3
    bias = rng.standard_normal(N).astype(np.float32)
    c = np.full((M, N), np.nan, np.float32)
    out = DotOut(_ptr(c), None, _ptr(bias), None, _ptr(scale), 1 << 40, 0, N, 0, 1.0, ACT_CODES[act])
    lib.cuvil_i8_rows(_ptr(a), ctypes.c_int64(M), ctypes.c_int64(K // 4), _ptr(int8_dot_panels(b)),
                      ctypes.c_int64(N), ctypes.c_int64(0), ctypes.c_int64(-(-N // 64)), ctypes.byref(out))
    want = a.astype(np.int64) @ b.astype(np.int64)
    want = want.astype(np.float32) * scale + bias
    if act == "relu":
        want = np.maximum(want, 0)
    np.testing.assert_allclose(c, want, rtol=1e-6, atol=1e-6)


def _byte_map(x, rng_, levels):
    lo, hi = (float(x.min()), float(x.max())) if rng_ is None else rng_
    lo, hi = np.float32(min(lo, 0)), np.float32(max(hi, 0))
    scale = np.float32((hi - lo) / np.float32(levels))
    if not scale > 0:
        scale = np.float32(1)
    zero = np.float32(np.clip(np.rint(-lo / scale), 0, levels))
    q = np.floor(np.clip(x * (np.float32(1) / scale) + (zero + np.float32(0.5)), 0, levels))
    return q, scale, zero


def _conv_int(q, wq, stride, pad, dil, zero, groups):
    """The integer conv of bytes q [C, H, W] (padding at the zero point) with int8 filters [O, C/G, KH, KW]."""
    import torch
    qp = np.pad(q - zero, ((0, 0), (pad, pad), (pad, pad)))             # centred: the zero point's padding is 0
    y = torch.nn.functional.conv2d(torch.from_numpy(qp[None].astype(np.float64)),
                                   torch.from_numpy(wq.astype(np.float64)), stride=stride, dilation=dil, groups=groups)
    return y[0].numpy()


def _blocked(x, b):
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def _unblocked(y, b):
    n, cb, h, w, _ = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)


@pytest.mark.parametrize("k,stride,pad,dil,cin,cout,hw,calibrated,nchw,groups", [
    (1, 1, 0, 1, 32, 48, (9, 11), False, False, 1),       # direct: the quantized image is the GEMM's A
    (1, 2, 0, 1, 16, 80, (13, 10), True, False, 1),       # gathered in place, a calibrated range that clips
    (3, 2, 1, 1, 32, 64, (15, 14), False, False, 1),      # gathered from the padded image
    (3, 1, 1, 1, 16, 80, (7, 9), False, False, 1),        # direct 3x3 (no Winograd in int8), a panel cut short
    (3, 1, 2, 2, 16, 32, (12, 12), True, False, 1),       # dilated
    (5, 1, 2, 1, 48, 16, (7, 9), False, False, 1),
    (7, 2, 3, 1, 3, 64, (23, 21), False, True, 1),        # an NCHW stem: K = 147, up to whole words
    (1, 1, 0, 1, 24, 48, (9, 11), False, True, 1),        # NCHW, 24 channels: read in place
    (1, 1, 0, 1, 6, 32, (5, 7), True, True, 1),           # NCHW, 6 channels: rows copied to whole words
    (3, 1, 1, 1, 5, 16, (8, 8), False, True, 1),
    (5, 1, 2, 1, 5, 16, (9, 8), True, True, 1),           # NCHW: 25-byte runs, copied as 32
    (4, 2, 0, 1, 8, 32, (10, 11), False, True, 1),        # NCHW: 32-byte runs, read in place up to the end
    (3, 1, 1, 1, 64, 64, (9, 10), False, False, 2),       # grouped (RegNet): each group a GEMM of its own
    (1, 1, 0, 1, 64, 128, (6, 7), False, False, 4),       # grouped 1x1: gathered, not in place
    (3, 2, 1, 1, 48, 96, (11, 9), True, False, 3),
])
def test_blocked_conv_matches_integer_arithmetic(lib, k, stride, pad, dil, cin, cout, hw, calibrated, nchw, groups):
    B = lib.block
    cout = cout // B * B
    cin = cin if nchw else cin // B * B
    cg = cin // groups
    rng = np.random.default_rng(k * 100 + cin)
    N, (H, W) = 2, hw
    x = rng.standard_normal((N, cin, H, W)).astype(np.float32)
    x[1] = np.maximum(x[1], 0)                        # a ReLU output: its zero point is 0
    w = rng.standard_normal((cout, cg, k, k)).astype(np.float32) * 0.1
    bias = rng.standard_normal(cout).astype(np.float32)
    OH, OW = ((H + 2 * pad - dil * (k - 1) - 1) // stride + 1), ((W + 2 * pad - dil * (k - 1) - 1) // stride + 1)
    res = rng.standard_normal((N, cout, OH, OW)).astype(np.float32)
    rng_ = (-1.5, 1.25) if calibrated else None
    s = Shape(N, cin, H, W, cout, k, k, OH, OW, stride, stride, pad, pad, dil, dil, groups)
    scratch = np.zeros(lib.cuvil_conv_blocked_int8_scratch(ctypes.byref(s)) + 16, np.float32)
    y = np.full((N, cout // B, OH, OW, B), np.nan, np.float32)
    xb, rb = (x if nchw else _blocked(x, B)), _blocked(res, B)
    wq = int8_filter_panels(w, groups)
    terms = filter_terms(filters_as_b(w))
    r = None if rng_ is None else np.array(rng_, np.float32)
    assert lib.cuvil_conv_blocked_int8(ctypes.byref(s), _ptr(xb), _ptr(wq), _ptr(terms), _ptr(bias), _ptr(rb), None, _ptr(r),
                                       int(nchw), _ptr(y), 0, None, None, ACT_CODES["relu"], _ptr(scratch), 2) == 0
    got = _unblocked(y, B)

    q, ws = quantized_filters(filters_as_b(w))
    wint = q.reshape(k, k, cg, cout).transpose(3, 2, 0, 1)
    for n in range(N):
        qx, scale, zero = _byte_map(x[n], rng_, lib.levels)
        acc = _conv_int(qx, wint, stride, pad, dil, zero, groups)
        want = np.maximum(acc * (scale * ws)[:, None, None] + bias[:, None, None] + res[n], 0)
        # one input byte a step off (the fused multiply-add's rounding at a half) moves an output by
        # scale * |w|; a slip in the layout or the gather by far more
        step = float(scale * np.abs(wint).max() * ws.max())
        assert np.abs(got[n] - want).max() <= 2 * step + 1e-4 * np.abs(want).max(), n
        if not calibrated:          # and the whole is near the float conv
            import torch
            ref = torch.nn.functional.conv2d(torch.from_numpy(x[n:n + 1]), torch.from_numpy(w), torch.from_numpy(bias),
                                             stride, pad, dil, groups)[0].numpy()
            ref = np.maximum(ref + res[n], 0)
            assert np.abs(got[n] - ref).max() <= 0.03 * np.abs(ref).max()


def _int8_conv(lib, x, w, bias, stride, pad, groups, rng_, kind, out_image=None, out_range=None, res=None, hw=None,
               res_range=None):
    """cuvil_conv_blocked_int8 on x ([N, C, H, W] floats, blocked here; or kind 2: the byte images of an
    H x W map, hw) -> its output, blocked floats or (out_image) the next conv's byte images; the residual
    res: [N, O, OH, OW] floats, or with res_range its bytes over that range, pixel-major per image."""
    B = lib.block
    N, C, H, W = x.shape if kind != 2 else (x.shape[0], w.shape[1] * groups, *hw)
    O, k = w.shape[0], w.shape[2]
    OH, OW = (H + 2 * pad - k) // stride + 1, (W + 2 * pad - k) // stride + 1
    s = Shape(N, C, H, W, O, k, k, OH, OW, stride, stride, pad, pad, 1, 1, groups)
    scratch = np.zeros(lib.cuvil_conv_blocked_int8_scratch(ctypes.byref(s)) + 16, np.float32)
    y = (np.full((N, out_image[0] * out_image[1] * O), 0xcd, np.uint8) if out_image is not None  # border: written
         else np.full((N, O // B, OH, OW, B), np.nan, np.float32))
    img = None if out_image is None else np.array(out_image, np.int64)
    orng = None if out_range is None else np.array(out_range, np.float32)
    xb = x if kind == 2 else _blocked(x, B)
    assert lib.cuvil_conv_blocked_int8(
        ctypes.byref(s), _ptr(xb), _ptr(int8_filter_panels(w, groups)), _ptr(filter_terms(filters_as_b(w))),
        _ptr(bias), _ptr(None if res is None else res if res_range is not None else _blocked(res, B)),
        _ptr(None if res_range is None else np.array(res_range, np.float32)), _ptr(np.array(rng_, np.float32)),
        kind, _ptr(y),
        0, _ptr(img), _ptr(orng), ACT_CODES["relu"], _ptr(scratch), 2) == 0
    return y


@pytest.mark.parametrize("k2,stride2,pad2,groups2,hw,groups1", [
    (3, 1, 1, 1, (9, 11), 1),        # the next conv pads: a border at its zero point
    (3, 2, 1, 1, (10, 12), 1),       # strided: its padded image drops the map's last row and column
    (1, 1, 0, 1, (7, 6), 1),         # 1x1: the map itself, read in place
    (3, 1, 1, 2, (8, 8), 1),         # grouped reader
    (1, 2, 0, 1, (9, 9), 1),         # 1x1 stride 2, read in place: rows and columns dropped
    (3, 1, 1, 1, (6, 7), 2),         # grouped writer: each group's channels at their place in the pixel
])
def test_conv_writes_the_next_convs_input_bytes(lib, k2, stride2, pad2, groups2, hw, groups1):
    """A conv writing its output as the next conv's input bytes (int8_out; residual, ReLU fused before)
    and that conv reading them (int8_in) give exactly what the two give through float output and the
    next conv's own quantization pass."""
    B = lib.block
    C1, C2, C3 = 2 * B, 4 * B, 2 * B
    rng = np.random.default_rng(k2 * 10 + stride2)
    x = rng.standard_normal((2, C1, *hw)).astype(np.float32)
    w1 = (rng.standard_normal((C2, C1 // groups1, 1, 1)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((C3, C2 // groups2, k2, k2)) * 0.2).astype(np.float32)
    b1, b2 = (rng.standard_normal(C2).astype(np.float32) for _ in range(2))
    res = rng.standard_normal((2, C2, *hw)).astype(np.float32)
    r1, r2 = [-2.5, 3.0], [0.0, 2.75]                 # the second conv reads a ReLU's output, clipped at 2.75
    H, W = hw
    OH, OW = (H + 2 * pad2 - k2) // stride2 + 1, (W + 2 * pad2 - k2) // stride2 + 1
    hp, wp = (OH - 1) * stride2 + k2, (OW - 1) * stride2 + k2       # every window's pixels
    image = [H, W, 0, 0] if pad2 == 0 and hp <= H and wp <= W else [hp, wp, pad2, pad2]
    floats = _int8_conv(lib, x, w1, b1, 1, 0, groups1, r1, 0, res=res)
    want = _int8_conv(lib, _unblocked(floats, B), w2, b2, stride2, pad2, groups2, r2, 0)
    bytes_ = _int8_conv(lib, x, w1, b1, 1, 0, groups1, r1, 0, out_image=image, out_range=r2, res=res)
    got = _int8_conv(lib, bytes_, w2, b2, stride2, pad2, groups2, r2, 2, hw=hw)
    assert not np.isnan(want).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cout,residual", [(24, False), (24, True), (40, True), (8, False)])
def test_bytes_of_a_panel_in_part(lib, cout, residual):
    """A conv whose output channels end in part of a vector (24 = 16 + 8 on AVX-512) writes the same bytes
    for them as the conv padded to whole vectors with zero filters does (its residual bytes read only as
    far as the channels go): the last vector's masked load and store, and nothing past the channels."""
    B = lib.block
    full = -(-cout // B) * B
    rng = np.random.default_rng(cout)
    x = rng.standard_normal((2, 2 * B, 7, 9)).astype(np.float32)
    w = np.zeros((full, 2 * B, 1, 1), np.float32)
    w[:cout] = rng.standard_normal((cout, 2 * B, 1, 1)) * 0.2
    bias = np.zeros(full, np.float32)
    bias[:cout] = rng.standard_normal(cout)
    res = rng.integers(0, 256, (2, 7 * 9, full), dtype=np.uint8)
    args = dict(out_image=[7, 9, 0, 0], out_range=[0.0, 4.0])

    def conv(o):
        r = dict(res=np.ascontiguousarray(res[:, :, :o]).reshape(2, -1), res_range=[-2.0, 3.0]) if residual else {}
        return _int8_conv(lib, x, w[:o], bias[:o], 1, 0, 1, [-3.0, 3.0], 0, **args, **r).reshape(2, 7 * 9, o)
    got, want = conv(cout), conv(full)[:, :, :cout]
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 50


@pytest.mark.parametrize("C,hw,stride,residual", [
    (16, (9, 30), 1, False),           # an output row of five whole tiles
    (16, (7, 31), 1, True),            # ... and a tile of one row at each row's end, copied
    (16, (8, 61), 2, True),            # strided
    (64, (5, 29), 1, False),           # a filter row of three lines
])
def test_windows_read_in_place_equal_copied_rows(lib, C, hw, stride, residual):
    """A 3x3 conv into bytes whose output rows are wide enough reads its windows where they lie in the
    padded image (cuvil_i8_window_rows, on VNNI); with 80 output channels (a panel in part) it copies its
    rows as before. The first 64 channels' bytes are the same either way (the other 16 filters are zero)."""
    rng = np.random.default_rng(C + stride)
    H, W = hw
    OH, OW = (H + 2 - 3) // stride + 1, (W + 2 - 3) // stride + 1
    x = rng.standard_normal((2, C, H, W)).astype(np.float32)
    w = np.zeros((80, C, 3, 3), np.float32)
    w[:64] = rng.standard_normal((64, C, 3, 3)) * 0.3
    bias = np.zeros(80, np.float32)
    bias[:64] = rng.standard_normal(64)
    res = rng.integers(0, 256, (2, OH * OW, 80), dtype=np.uint8)

    def conv(o):
        r = dict(res=np.ascontiguousarray(res[:, :, :o]).reshape(2, -1), res_range=[-2.0, 3.0]) if residual else {}
        y = _int8_conv(lib, x, w[:o], bias[:o], stride, 1, 1, [-3.0, 3.0], 0, out_image=[OH, OW, 0, 0],
                       out_range=[0.0, 6.0], **r)
        return y.reshape(2, OH * OW, o)
    got, want = conv(64), conv(80)[:, :, :64]
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 100


@pytest.mark.parametrize("k,stride,groups,bytes_out", [
    (1, 1, 1, False),                  # a ResNet block's last conv: floats out
    (1, 1, 1, True),                   # ... and the next block's bytes out (the folded clamp)
    (3, 2, 1, False),                  # gathered, strided
    (3, 1, 2, True),                   # grouped
])
def test_residual_as_bytes_equals_its_floats(lib, k, stride, groups, bytes_out):
    """A residual read as the bytes an integer conv wrote (res_range: kernels/dot_out.h widens them in the
    epilogue) gives what the same conv gives with those bytes' float values as its residual: the floats
    to float rounding, the bytes out to one step (the multiply-adds fold the map differently)."""
    B = lib.block
    C, O, H, W = 2 * B, 4 * B, 9, 11         # each group's channels whole blocks
    rng = np.random.default_rng(k * 10 + stride + groups)
    x = rng.standard_normal((2, C, H, W)).astype(np.float32)
    w = (rng.standard_normal((O, C // groups, k, k)) * 0.2).astype(np.float32)
    bias = rng.standard_normal(O).astype(np.float32)
    pad = k // 2
    OH, OW = (H + 2 * pad - k) // stride + 1, (W + 2 * pad - k) // stride + 1
    r_range = [-1.5, 4.0]
    q, scale, zero = _byte_map(rng.standard_normal((2, O, OH, OW)).astype(np.float32) * 2, r_range, lib.levels)
    res_bytes = np.ascontiguousarray(q.transpose(0, 2, 3, 1)).astype(np.uint8).reshape(2, -1)   # pixel-major
    res_floats = ((q - zero) * scale).astype(np.float32)
    out = dict(out_image=[OH, OW, 0, 0], out_range=[0.0, 5.0]) if bytes_out else {}
    want = _int8_conv(lib, x, w, bias, stride, pad, groups, [-3.0, 3.0], 0, res=res_floats, **out)
    got = _int8_conv(lib, x, w, bias, stride, pad, groups, [-3.0, 3.0], 0, res=res_bytes, res_range=r_range, **out)
    if bytes_out:
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01 and len(np.unique(want)) > 100
    else:
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("k,stride,pad,dil,cin,cout,hw", [
    (1, 1, 0, 1, 32, 48, (9, 11)),        # direct
    (1, 2, 0, 1, 16, 80, (13, 10)),       # gathered in place
    (3, 2, 1, 1, 32, 64, (15, 14)),       # gathered from the padded image
    (3, 1, 1, 1, 32, 64, (14, 14)),       # 3x3 stride 1: direct integer products, no Winograd
    (5, 1, 2, 1, 16, 16, (7, 9)),
])
@pytest.mark.parametrize("target", ["native", "x86_64-avx2"])
def test_compiled_int8_convs_against_torch(k, stride, pad, dil, cin, cout, hw, target):
    """precision="int8" on channel-blocked convs (bias, residual and ReLU fused) against torch: within
    int8's rounding of input and filters. With AVX-512 VNNI every one calls cuvil_conv_blocked_int8
    (3x3 stride-1 ones too); built for AVX2 (run here where the CPU has it) all but the 3x3 stride-1
    convs, which keep fp32 Winograd; elsewhere the fp32 conv."""
    import torch

    import cuvil
    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    from cuvil.target import has_features
    if target != "native" and not has_features("native", ("avx2", "fma")):
        pytest.skip("this CPU runs no AVX2 build")

    torch.manual_seed(k * 10 + stride)
    m = branching_conv_block(cin, cout, k, stride, pad, dil)
    x = torch.randn(2, cin, *hw)
    cm = cuvil.compile(m, (x,), precision="int8", layout="blocked", target=target)
    want = m(x).detach().numpy()
    got = cm(x).numpy()
    kind, winograd = int8_conv_kind(target), k == 3 and stride == 1
    assert cm.c_source.count("cuvil_conv_blocked_int8(") == (0 if not kind else 1 if kind == 1 and winograd else 3)
    assert ("cuvil_conv3x3_winograd" in cm.c_source) == (winograd and kind != 2)
    # 8 bits each for input and filters: ~2^-8 of the output's scale; a slip in the layout is off by it
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("bad", [[float("nan"), 1.0], [0.0, float("inf")], [0.0, 1e39], [1.0, 0.0], [0, 1], [0.5], "x", {"lo": 0.0, "hi": 1.0}])
def test_int8_range_is_checked(bad):
    """int8_range reaches the generated code (as a constant): the op refuses anything but two finite
    floats, lo <= hi."""
    from cuvil.errors import ShapeError
    from cuvil.ir.ops import REGISTRY
    from cuvil.ir.types import TensorType

    op = REGISTRY["conv"]
    attrs = {**op.attrs, "strides": [1, 1], "pads": [[0, 0], [0, 0]], "dilations": [1, 1], "int8_act": 1}
    types = [TensorType((1, 16, 4, 4), "float32"), TensorType((16, 16, 1, 1), "float32")]
    op.infer(types, {**attrs, "int8_range": [-1.0, 2.0]}, [None, None])
    with pytest.raises(ShapeError, match="int8_range"):
        op.infer(types, {**attrs, "int8_range": bad}, [None, None])


@pytest.mark.parametrize("attrs", [
    {"int8_out": [16, 16, 1, 1]},                                   # no range for the bytes
    {"int8_out": [16, 16, 1], "int8_out_range": [0.0, 1.0]},
    {"int8_out": [16, -1, 1, 1], "int8_out_range": [0.0, 1.0]},
    {"int8_out": [16, 16, 1, 1.5], "int8_out_range": [0.0, 1.0]},
    {"int8_out": [1 << 40, 16, 1, 1], "int8_out_range": [0.0, 1.0]},
    {"int8_out": "16,16,1,1", "int8_out_range": [0.0, 1.0]},
    {"int8_out": [16, 16, 1, 1], "int8_out_range": [float("nan"), 1.0]},
    {"int8_out": [16, 16, 1, 1], "int8_out_range": ["a", 1.0]},      # found by the fuzz: had been a TypeError
    {"int8_in": 1},                                                  # bytes in need the range they are on
    {"int8_in": 2, "int8_range": [0.0, 1.0]},
    {"int8_res_range": [0.0, 1.0]},                                  # no residual to read as bytes
    {"int8_res_range": [2.0, 1.0]},
    {"int8_res_seen": [2.0, 1.0]},                                   # a residual's calibrated range, as the others
    {"int8_res_seen": [0.0, float("inf")]},
])
def test_int8_links_are_checked(attrs):
    """The byte links between convs reach the generated code as constants (the image's extent, the
    range): the op refuses any but ints in range and two finite floats."""
    from cuvil.errors import ShapeError
    from cuvil.ir.ops import REGISTRY
    from cuvil.ir.types import TensorType

    op = REGISTRY["conv"]
    base = {**op.attrs, "strides": [1, 1], "pads": [[0, 0], [0, 0]], "dilations": [1, 1], "int8_act": 2}
    types = [TensorType((1, 16, 4, 4), "float32"), TensorType((16, 16, 1, 1), "float32")]
    op.infer(types, {**base, "int8_out": [6, 6, 1, 1], "int8_out_range": [-1.0, 2.0]}, [None, None])
    op.infer(types, {**base, "int8_in": 1, "int8_range": [0.0, 2.0]}, [None, None])
    with pytest.raises(ShapeError, match="int8_out|int8_in|int8_res_range|int8_res_seen"):
        op.infer(types, {**base, **attrs}, [None, None])


@pytest.mark.parametrize("attrs", [
    {"int8_in": 1},                                                  # bytes in, none out
    {"int8_out": [4, 4, 0, 0], "int8_out_range": [0.0, 1.0]},        # bytes out, none in
    {"int8_in": 1, "int8_out": [4, 4, 0, 0]},                        # no range for the bytes
    {"int8_in": 1, "int8_out": [4, 4, 0, -1], "int8_out_range": [0.0, 1.0]},
    {"int8_in": 2, "int8_out": [4, 4, 0, 0], "int8_out_range": [0.0, 1.0]},
])
def test_max_pool_byte_link_is_checked(attrs):
    """A max pool's byte link (int8_in with int8_out and its range) is refused in any other form."""
    from cuvil.errors import ShapeError
    from cuvil.ir.ops import REGISTRY
    from cuvil.ir.types import TensorType

    op = REGISTRY["max_pool"]
    base = {**op.attrs, "kernel": [3, 3], "strides": [2, 2], "pads": [[1, 1], [1, 1]], "dilations": [1, 1]}
    types = [TensorType((1, 16, 8, 8), "float32")]
    op.infer(types, {**base, "int8_in": 1, "int8_out": [4, 4, 0, 0], "int8_out_range": [0.0, 2.0]}, [None])
    with pytest.raises(ShapeError, match="max_pool: int8"):
        op.infer(types, {**base, **attrs}, [None])


def test_max_pool_byte_link_fuzz():
    """Any value in a max pool's byte-link attributes: a ShapeError, or the checked form."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cuvil.errors import ShapeError
    from cuvil.ir.ops import REGISTRY
    from cuvil.ir.types import TensorType

    op = REGISTRY["max_pool"]
    base = {**op.attrs, "kernel": [3, 3], "strides": [2, 2], "pads": [[1, 1], [1, 1]], "dilations": [1, 1]}
    anything = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=4),
                         st.lists(st.one_of(st.integers(-5, 2 ** 21), st.floats(), st.text(max_size=2)), max_size=5))

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(inb=anything, out=anything, rng=anything)
    def check(inb, out, rng):
        try:
            op.infer([TensorType((1, 16, 8, 8), "float32")], {**base, "int8_in": inb, "int8_out": out, "int8_out_range": rng},
                     [None])
        except ShapeError:
            return
        assert inb in (0, 1) and bool(inb) == (out is not None)
        if out is not None:
            assert len(out) == 4 and all(type(v) is int and 0 <= v < 1 << 20 for v in out)
            assert all(isinstance(v, float) and np.isfinite(v) for v in rng) and rng[0] <= rng[1]
    check()


def test_calibration_data_with_nan_is_refused():
    import torch

    import cuvil
    from cuvil.target import has_features
    if not has_features("native", ("avx512_vnni", "avx512bw")):
        pytest.skip("int8 convs are marked only for a target with AVX-512 VNNI (no ranges to calibrate)")
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 1)).eval()
    x = torch.randn(1, 16, 4, 4)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(cuvil.QuantizationError, match=r"calibration_data\[1\]: conv at .*NaN"):
        cuvil.compile(m, (x,), precision="int8", layout="blocked", calibration_data=[x, bad])


def test_compiled_grouped_int8_conv_against_torch():
    """A grouped conv whose groups fill channel blocks (RegNet's, ResNeXt's) runs each group as its own
    integer GEMM where the CPU has VNNI; within int8's error of torch either way."""
    import torch

    import cuvil
    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 1), torch.nn.ReLU(),
                            torch.nn.Conv2d(64, 64, 3, padding=1, groups=4), torch.nn.ReLU()).eval()
    x = torch.randn(1, 64, 10, 9)
    cm = cuvil.compile(m, (x,), precision="int8", layout="blocked")
    assert cm.c_source.count("cuvil_conv_blocked_int8(") == (2 if int8_conv_kind("native") else 0)
    want = m(x).detach().numpy()
    assert np.abs(cm(x).numpy() - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("target", ["native", "x86_64-avx2"])
def test_calibrated_convs_pass_bytes_along(target, tmp_path, monkeypatch):
    """With calibrated ranges, an integer conv whose output only the next integer conv reads writes that
    conv's input bytes (int8_out), which reads them without a quantization pass (CUVIL_I8_IN_BYTES): the
    outputs equal the same model compiled without the links exactly, and torch within int8's error.
    VNNI: all three links of a 1x1 -> 1x1 -> 3x3 -> 1x1 chain; AVX2 (3x3 convs stay Winograd): the first."""
    import torch

    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    from cuvil.target import has_features
    if target != "native" and not has_features("native", ("avx2", "fma")):
        pytest.skip("this CPU runs no AVX2 build")

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(32, 64, 1), torch.nn.Conv2d(64, 32, 1)
            self.c3, self.c4 = torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.Conv2d(32, 32, 1)

        def forward(self, x):
            y = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
            return torch.relu(self.c4(y) + x)
    torch.manual_seed(5)
    m = Chain().eval()
    calib = [torch.randn(1, 32, 13, 11) for _ in range(4)]
    x = torch.randn(1, 32, 13, 11)
    kw = dict(precision="int8", layout="blocked", target=target, calibration_data=calib)
    cm, plain = compile_linked_and_plain(m, (x,), tmp_path, monkeypatch, **kw)
    kind = int8_conv_kind(target)
    assert cm.c_source.count("CUVIL_I8_IN_BYTES") == (3 if kind == 2 else 1 if kind == 1 else 0)
    assert "CUVIL_I8_IN_BYTES" not in plain.c_source
    got = cm(x).numpy()
    np.testing.assert_array_equal(got, plain(x).numpy())
    want = m(x).detach().numpy()
    assert np.abs(got - want).max() <= 0.04 * np.abs(want).max()


@pytest.mark.parametrize("target,threads", [("native", 1), ("native", 2), ("x86_64-avx2", 2)])
def test_channels_no_block_holds_pass_bytes(target, threads, tmp_path, monkeypatch):
    """MobileNetV2's 24-channel maps: channels that fill no block of 16 keep the NCHW layout in fp32, and the
    integer convs around them passed them as NCHW floats (a project conv turned its rows, the next conv
    quantized them again). Now they pass as bytes, pixel-major as every byte image is: the project conv
    writes them with its last vector of 16 in part (24 = 16 + 8), the expand conv reads them in place and
    the residual reader widens them. All three readers take bytes (none quantizes an NCHW map but the
    first, from the model's input); within int8's error of torch and of the unlinked model, from which
    the residual's bytes make it differ."""
    import torch

    from cuvil.target import has_features
    if target != "native" and not has_features("native", ("avx2", "fma")):
        pytest.skip("this CPU runs no AVX2 build")

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(32, 24, 1), torch.nn.Conv2d(24, 40, 1)
            self.c3, self.c4 = torch.nn.Conv2d(40, 24, 1), torch.nn.Conv2d(24, 32, 1)

        def forward(self, x):
            y = self.c1(x)
            return torch.relu(self.c4(self.c3(torch.relu(self.c2(y))) + y))
    torch.manual_seed(5)
    m = Chain().eval()
    calib = [torch.randn(1, 32, 13, 11) for _ in range(4)]
    x = torch.randn(1, 32, 13, 11)
    kw = dict(precision="int8", layout="blocked", target=target, calibration_data=calib, num_threads=threads)
    cm, plain = compile_linked_and_plain(m, (x,), tmp_path, monkeypatch, **kw)
    assert cm.c_source.count("CUVIL_I8_IN_BYTES") == 3 and cm.c_source.count("CUVIL_I8_IN_NCHW") <= 1
    want = m(x).detach().numpy()
    got, ref = cm(x).numpy(), plain(x).numpy()
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 0.04 * scale and np.abs(ref - want).max() <= 0.04 * scale
    assert np.abs(got - ref).max() <= 0.03 * scale and not np.array_equal(got, ref)   # the residual's bytes


@pytest.mark.parametrize("k,stride,pad,dil,C,hw,threads", [
    (3, 2, 1, 1, 64, (15, 14), 2),     # ResNet's stem pool at odd sizes
    (3, 2, 1, 1, 16, (8, 8), 1),
    (2, 2, 0, 1, 48, (9, 7), 2),       # the last row and column in no window
    (3, 1, 1, 2, 32, (10, 11), 1),     # dilated
    (5, 3, 2, 1, 16, (13, 12), 2),
])
def test_max_pool_on_bytes(lib, k, stride, pad, dil, C, hw, threads):
    """cuvil_max_pool_bytes: each output pixel's C bytes the maximum over its window's taps inside the map,
    against numpy's maximum of the same bytes."""
    H, W = hw
    OH, OW = (H + 2 * pad - dil * (k - 1) - 1) // stride + 1, (W + 2 * pad - dil * (k - 1) - 1) // stride + 1
    x = np.random.default_rng(k * 100 + C).integers(0, 256, (2, H, W, C)).astype(np.uint8)
    y = np.full((2, OH, OW, C), 7, np.uint8)
    s = Shape(2, C, H, W, C, k, k, OH, OW, stride, stride, pad, pad, dil, dil, 1)
    lib.cuvil_max_pool_bytes(ctypes.byref(s), _ptr(x), _ptr(y), threads)
    want = np.zeros_like(y)
    for kh in range(k):
        for kw in range(k):
            ih, iw = np.arange(OH) * stride - pad + kh * dil, np.arange(OW) * stride - pad + kw * dil
            ok_h, ok_w = (ih >= 0) & (ih < H), (iw >= 0) & (iw < W)
            tap = x[:, np.clip(ih, 0, H - 1)][:, :, np.clip(iw, 0, W - 1)]
            tap = np.where(ok_h[None, :, None, None] & ok_w[None, None, :, None], tap, 0)
            want = np.maximum(want, tap)
    np.testing.assert_array_equal(y, want)


def test_stem_pool_passes_bytes(tmp_path, monkeypatch):
    """A calibrated stem -> max pool -> 1x1 convs (ResNet's, the projection strided): the stem writes
    bytes, the pool takes their maximum (int8_in on the pool), the convs read its bytes; equal to the
    model without the links (the maximum of the bytes is the bytes of the maximum) but for the stem's
    folded byte map at a tie, and within int8's error of torch."""
    import torch

    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    if not int8_conv_kind("native"):
        pytest.skip("no integer convs on this CPU")
    torch.manual_seed(11)

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 32, 7, 2, 3)
            self.pool = torch.nn.MaxPool2d(3, 2, 1)
            self.a, self.b = torch.nn.Conv2d(32, 32, 1), torch.nn.Conv2d(32, 64, 1, 2)

        def forward(self, x):
            h = self.pool(torch.relu(self.stem(x)))
            return torch.relu(self.a(h)).mean((2, 3)) + self.b(h).mean((2, 3))[:, :32]
    m = Stem().eval()
    calib = [torch.randn(1, 3, 45, 43) for _ in range(4)]
    x = torch.randn(1, 3, 45, 43)
    kw = dict(precision="int8", layout="blocked", calibration_data=calib, num_threads=2)
    cm, plain = compile_linked_and_plain(m, (x,), tmp_path, monkeypatch, **kw)
    pool = [n for n in cm.graph.nodes if n.op == "max_pool"]
    assert len(pool) == 1 and pool[0].attrs["int8_in"] == 1 and "cuvil_max_pool_bytes" in cm.c_source
    assert "cuvil_max_pool_bytes" not in plain.c_source
    want = m(x).detach().numpy()
    got, ref = cm(x).numpy(), plain(x).numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=0.01 * np.abs(ref).max())
    assert np.abs(got - want).max() <= 0.04 * np.abs(want).max()


def _bottlenecks():
    """Three ResNet bottlenecks (the second strided, with a projection): block outputs read by the next
    block's first conv, its projection and its last conv's residual."""
    import torch
    from torch import nn

    def block(cin, mid, cout, stride):
        return nn.ModuleList([nn.Conv2d(cin, mid, 1), nn.Conv2d(mid, mid, 3, stride, 1), nn.Conv2d(mid, cout, 1)])

    def run(b, x, res):
        return torch.relu(b[2](torch.relu(b[1](torch.relu(b[0](x))))) + res)

    class Bottlenecks(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.proj = nn.Conv2d(16, 64, 1), nn.Conv2d(64, 128, 1, 2)
            self.b1, self.b2, self.b3 = block(64, 32, 64, 1), block(64, 32, 128, 2), block(128, 32, 128, 1)

        def forward(self, x):
            h = torch.relu(self.stem(x))
            h = run(self.b1, h, h)
            h = run(self.b2, h, self.proj(h))
            return run(self.b3, h, h)
    return Bottlenecks().eval()


@pytest.mark.parametrize("target,threads,batch", [("native", 1, 1), ("native", 2, 1), ("native", 2, 3),
                                                  ("x86_64-avx2", 2, 1)])
def test_block_outputs_pass_as_bytes(target, threads, batch, tmp_path, monkeypatch):
    """Calibrated ResNet bottlenecks: each block's output is stored once as bytes that the next block's
    first conv and projection read as input and its last conv widens as its residual (int8_res_range;
    passes/quantize.link_int8_convs), and the projection's output, which only b2's last conv reads (as
    its residual), as bytes over the range calibration saw there (int8_res_seen); within int8's error of
    torch, and of the same model with no links, at
    1 and 2 threads and a batch (image by image, passes/batch_map.py). With VNNI every conv after the
    stem reads bytes; built for AVX2 the stride-1 3x3 convs keep fp32 Winograd and link nowhere."""
    import torch

    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    from cuvil.ir.graph import nodes_within
    from cuvil.target import has_features
    kind = int8_conv_kind(target)
    if not kind or (target != "native" and not has_features("native", ("avx2", "fma"))):
        pytest.skip(f"this CPU runs no integer convs for {target}")
    torch.manual_seed(7)
    m = _bottlenecks()
    calib = [torch.randn(batch, 16, 14, 14) for _ in range(4)]
    x = torch.randn(batch, 16, 14, 14)
    kw = dict(precision="int8", layout="blocked", calibration_data=calib, num_threads=threads, target=target)
    cm, plain = compile_linked_and_plain(m, (x,), tmp_path, monkeypatch, **kw)
    convs = [n for n in nodes_within(cm.graph) if n.op == "conv"]
    assert sum(n.attrs.get("int8_res_range") is not None for n in convs) == 3        # b1's, b2's and b3's last
    widened = {id(n.inputs[3].producer): n for n in convs if n.attrs.get("int8_res_range") is not None}
    proj = [n for n in convs if id(n) in widened and n.attrs.get("act") == "none"]   # the one conv with no ReLU
    assert len(proj) == 1 and proj[0].attrs["int8_out"] is not None
    assert proj[0].attrs["int8_out_range"] == widened[id(proj[0])].attrs["int8_res_seen"]
    # AVX2: the stride-1 3x3 convs are Winograd's, outside the chain of bytes (b2's strided one is in it)
    assert sum(n.attrs.get("int8_in") == 1 for n in convs) == (10 if kind == 2 else 6)
    want = m(x).detach().numpy()
    got, ref = cm(x).numpy(), plain(x).numpy()
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 0.04 * scale and np.abs(ref - want).max() <= 0.04 * scale
    assert np.abs(got - ref).max() <= 0.03 * scale and not np.array_equal(got, ref)   # the residuals' bytes: lossy


def test_a_conv_applied_twice_keeps_each_calibrated_range(tmp_path):
    """One conv module run twice (one filter constant, two conv nodes) on inputs of very different
    ranges: each node maps its input over its own calibrated range (the packed range had been keyed by
    the filter alone, so the second reused the first's and clipped)."""
    import torch

    import cuvil
    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    if not int8_conv_kind("native"):
        pytest.skip("no integer convs on this CPU (no calibrated ranges to keep apart)")

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(32, 32, 1)

        def forward(self, x):
            return self.c(torch.relu(self.c(x)) * 20.0)
    torch.manual_seed(2)
    m = Twice().eval()
    x = torch.randn(1, 32, 9, 9)
    cm = cuvil.compile(m, (x,), precision="int8", layout="blocked", calibration_data=[x],
                       cache_dir=tmp_path)
    assert cm.c_source.count("cuvil_conv_blocked_int8(") == 2
    want = m(x).detach().numpy()
    assert np.abs(cm(x).numpy() - want).max() <= 0.03 * np.abs(want).max()


def test_int8_link_attributes_fuzz():
    """Any value in the byte-link attributes is taken only in the checked form (four ints in [0, 2^20), a
    finite [lo, hi] beside them; int8_in 0 or 1 with a range; int8_res_range a finite [lo, hi] with a
    residual), else a ShapeError: nothing else gets to C."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cuvil.errors import ShapeError
    from cuvil.ir.ops import REGISTRY
    from cuvil.ir.types import TensorType

    op = REGISTRY["conv"]
    base = {**op.attrs, "strides": [1, 1], "pads": [[0, 0], [0, 0]], "dilations": [1, 1], "int8_act": 2}
    types = [TensorType((1, 16, 4, 4), "float32"), TensorType((16, 16, 1, 1), "float32")]
    anything = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=4),
                         st.lists(st.one_of(st.integers(-5, 2 ** 21), st.floats(), st.text(max_size=2)), max_size=5))

    @settings(max_examples=500, deadline=None, derandomize=True)        # reproducible in CI, as the other fuzzes
    @given(out=anything, rng=anything, inb=anything, r=anything, res=anything, with_res=st.booleans())
    def check(out, rng, inb, r, res, with_res):
        attrs = {**base, "int8_out": out, "int8_out_range": rng, "int8_in": inb, "int8_range": r, "int8_res_range": res}
        try:
            op.infer(types + [None, TensorType((1, 16, 4, 4), "float32")] if with_res else types, attrs, [None] * 4)
        except ShapeError:
            return
        if res is not None:
            assert with_res and all(isinstance(v, float) and np.isfinite(v) for v in res) and res[0] <= res[1]
        if out is not None:
            assert len(out) == 4 and all(type(v) is int and 0 <= v < 1 << 20 for v in out)
            assert all(isinstance(v, float) and np.isfinite(v) for v in rng) and rng[0] <= rng[1]
        assert inb in (0, 1) and (not inb or r is not None)
    check()


@pytest.mark.parametrize("cout,hw,kind", [(37, (9, 11), 0), (24, (7, 16), 2), (8, (5, 5), 0), (29, (6, 9), 1)])
def test_conv_into_nchw_output_matches_the_blocked_one(lib, cout, hw, kind):
    """An integer 1x1 conv writing NCHW (nchw_out: output channels that fill no block, passes/layout.py
    into_nchw) gives exactly the blocked output of the same conv with its filters padded to whole
    blocks by zero filters (to float rounding), residual and ReLU fused, from blocked floats, NCHW floats
    (conv_plan "int8_nchw") or the bytes before it."""
    B = lib.block
    C, N, (H, W) = 2 * B, 2, hw
    rng = np.random.default_rng(cout)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.standard_normal((cout, C, 1, 1)) * 0.2).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    res = rng.standard_normal((N, cout, H, W)).astype(np.float32)
    opad = -(-cout // B) * B
    wp, bp, rp = (np.concatenate([a, np.zeros((opad - cout, *a.shape[1:]), np.float32)]) for a in (w, bias, res.transpose(1, 0, 2, 3)))
    rp = np.ascontiguousarray(rp.transpose(1, 0, 2, 3))
    rng_ = np.array([-2.0, 2.5], np.float32)
    xin = x if kind == 1 else _blocked(x, B)
    if kind == 2:                        # the bytes a conv before it would write: the map, pixel-major
        q, _, _ = _byte_map(x, [-2.0, 2.5], lib.levels)
        xin = np.ascontiguousarray(q.transpose(0, 2, 3, 1)).astype(np.uint8)

    def run(wt, b, r, nchw_out, O):
        s = Shape(N, C, H, W, O, 1, 1, H, W, 1, 1, 0, 0, 1, 1, 1)
        scratch = np.zeros(lib.cuvil_conv_blocked_int8_scratch(ctypes.byref(s)) + 16, np.float32)
        y = np.full((N, O, H, W) if nchw_out else (N, O // B, H, W, B), np.nan, np.float32)
        assert lib.cuvil_conv_blocked_int8(ctypes.byref(s), _ptr(xin), _ptr(int8_filter_panels(wt)),
                                           _ptr(filter_terms(filters_as_b(wt))), _ptr(b), _ptr(r), None, _ptr(rng_), kind,
                                           _ptr(y), nchw_out, None, None, ACT_CODES["relu"], _ptr(scratch), 2) == 0
        return y
    got = run(w, bias, res, 1, cout)
    want = _unblocked(run(wp, bp, _blocked(rp, B), 0, opad), B)[:, :cout]
    assert not np.isnan(got).any()
    # equal but for the rounding of a panel's last columns (not a whole vector: scalar, unfused)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
