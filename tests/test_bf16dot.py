"""The bf16 dot-product GEMM (kernels/bf16dot.c) against numpy doing its arithmetic: A and B rounded
to bf16 (nearest even), each pair of products added to the fp32 sum odd first, as vdpbf16ps adds
them. Built with AVX512-BF16 where this CPU has it, and always as portable C (the x86-64 baseline),
which runs the same layouts, edges and epilogue on any host. Where the CPU has AMX, the native build
runs the tile kernel, whose sums of 32 products round otherwise: it is held to the exact products within
fp32's rounding of the sum, and a native build without AMX keeps vdpbf16ps's kernel tested."""
import ctypes
import platform

import numpy as np
import pytest

from cuvil.codegen.c.gen_activations import ACT_CODES
from cuvil.codegen.c.lower_bf16dot import bf16_dot_panels
from cuvil.ir.quant import to_bf16
from cuvil.target import cpu_flags

from .util import branching_conv_block, build_kernels

NO_AMX = ["-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"]
# build -> (flags, the cpuinfo flag it needs)
BUILDS = {"portable": (["-march=x86-64"], None), "avx512_bf16": (["-march=native", *NO_AMX], "avx512_bf16"),
          "amx": (["-march=native"], "amx_bf16")}


class Epilogue(ctypes.Structure):
    _fields_ = [("bias_row", ctypes.c_void_p), ("bias_col", ctypes.c_void_p), ("residual", ctypes.c_void_p),
                ("ldr", ctypes.c_int64), ("alpha", ctypes.c_float), ("act", ctypes.c_int)]


@pytest.fixture(scope="module", params=list(BUILDS))
def lib(request):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the builds' flags are x86 flags")
    flags, needs = BUILDS[request.param]
    if needs and needs not in cpu_flags():
        pytest.skip(f"this CPU has no {needs} (the portable build covers the kernel's C)")
    lib = build_kernels(("bf16dot.c", "gemm.c", "pool.c"), flags)
    lib.cuvil_sgemm_bf16dot.restype = ctypes.c_int
    lib.build = request.param
    return lib


def _as_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _expected(a, w, bias, res, act, build="portable"):
    """The kernel's sums in its own order, in float32; for the AMX build the exact sums (float64)."""
    ab, wb = _as_float(to_bf16(a)), _as_float(to_bf16(w))
    K = a.shape[1]
    if build == "amx":
        y = ab.astype(np.float64) @ wb.astype(np.float64) + bias + res
        return {"none": y, "relu": np.maximum(y, 0), "gelu": None}[act]
    acc = np.zeros((a.shape[0], w.shape[1]), np.float32)
    for k in range(0, K, 2):
        if k + 1 < K:
            acc = acc + np.outer(ab[:, k + 1], wb[k + 1])
        acc = acc + np.outer(ab[:, k], wb[k])
    y = acc + bias + res
    return {"none": y, "relu": np.maximum(y, 0), "gelu": None}[act]


def _ptr(x):
    return x.ctypes.data_as(ctypes.c_void_p) if x is not None else None


@pytest.mark.parametrize("M,N,K,act", [(1, 64, 32, "none"), (7, 100, 33, "relu"), (53, 130, 96, "none"),
                                       (128, 384, 384, "relu"), (13, 5, 1, "none"), (49, 64, 257, "relu"),
                                       (400, 70, 45, "relu")])
def test_bf16dot_matches_its_arithmetic(lib, M, N, K, act):
    """Row counts of every tile edge (1-6 rows, several row blocks), panels cut short (N not a multiple
    of 64), odd K (a half-empty last pair), K = 1; bias, residual and ReLU in the epilogue. 400 rows: row
    blocks enough for tasks by row block, each rounded by its own thread."""
    rng = np.random.default_rng(M * 31 + K)
    a = rng.standard_normal((M, K), np.float32)
    w = rng.standard_normal((K, N), np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N), np.float32)
    bp = bf16_dot_panels(to_bf16(w))
    c = np.full((M, N), np.nan, np.float32)
    ep = Epilogue(None, bias.ctypes.data, res.ctypes.data, N, 1.0, ACT_CODES[act])
    assert lib.cuvil_sgemm_bf16dot(ctypes.c_int64(M), ctypes.c_int64(N), ctypes.c_int64(K), _ptr(a),
                                   ctypes.c_int64(K), _ptr(bp), _ptr(c), ctypes.c_int64(N), ctypes.byref(ep), 2) == 0
    want = _expected(a, w, bias, res, act, lib.build)
    if lib.build == "amx":     # fp32 sums of K products: within K roundings of the largest partial sum
        bound = np.abs(_as_float(to_bf16(a))).astype(np.float64) @ np.abs(_as_float(to_bf16(w))) + np.abs(bias) + np.abs(res)
        assert np.all(np.abs(c - want) <= K * 2.0 ** -23 * bound + 1e-6)
    else:
        np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    # and against the float32 product: bf16's rounding, not a layout slip
    exact = a.astype(np.float64) @ w.astype(np.float64) + bias + res
    exact = np.maximum(exact, 0) if act == "relu" else exact
    assert np.abs(c - exact).max() <= 0.02 * np.sqrt(K) + 1e-6


def test_bf16dot_gelu_epilogue_and_alpha(lib):
    """Activations past ReLU run over the stored tile; alpha scales the sums before the bias."""
    import math
    rng = np.random.default_rng(5)
    M, N, K = 20, 70, 48
    a, w = rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    c = np.empty((M, N), np.float32)
    ep = Epilogue(None, bias.ctypes.data, None, N, 0.5, ACT_CODES["gelu"])
    lib.cuvil_sgemm_bf16dot(ctypes.c_int64(M), ctypes.c_int64(N), ctypes.c_int64(K), _ptr(a), ctypes.c_int64(K),
                            _ptr(bf16_dot_panels(to_bf16(w))), _ptr(c), ctypes.c_int64(N), ctypes.byref(ep), 1)
    y = 0.5 * _expected(a, w, 0, 0, "none", lib.build) + bias
    want = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)


def test_panels_layout():
    """Word (p, k2, j): rows 2 k2 (low half) and 2 k2 + 1 (high half) of column 64 p + j."""
    w = np.arange(5 * 70, dtype=np.uint16).reshape(5, 70)
    p = bf16_dot_panels(w)
    assert p.shape == (2, 3, 64) and p.dtype == np.uint32
    assert p[1, 1, 3] == int(w[2, 67]) | (int(w[3, 67]) << 16)
    assert p[0, 2, 0] == w[4, 0]                      # K odd: the last pair's high half is 0
    assert (p[1, :, 6:] == 0).all()                   # past N


@pytest.mark.parametrize("k,stride,pad,dil,cin,cout,hw", [
    (1, 1, 0, 1, 32, 48, (9, 11)),        # in place, a panel cut short (48 of 64)
    (1, 2, 0, 1, 32, 80, (13, 10)),       # gathered in place, the second panel 16 of 64
    (3, 2, 1, 1, 32, 64, (15, 14)),       # gathered from a padded copy
    (3, 1, 2, 2, 16, 48, (12, 12)),       # dilated (no Winograd)
    (5, 1, 2, 1, 16, 64, (7, 9)),
    (3, 2, 1, 1, 32, 144, (17, 19)),      # few M blocks, 3 panels: on threads, all rows rounded first
])
def test_blocked_conv_in_bf16(k, stride, pad, dil, cin, cout, hw):
    """precision="bf16" on a channel-blocked conv (with bias, residual and ReLU fused) against torch:
    within bf16's rounding of the input and filters; on a CPU with AVX512-BF16 the generated C calls
    cuvil_conv_blocked_bf16 (every source kind above), elsewhere the fp32 conv."""
    import torch

    import cuvil
    from cuvil.target import has_features

    torch.manual_seed(k * 10 + stride)
    m = branching_conv_block(cin, cout, k, stride, pad, dil)
    x = torch.randn(2, cin, *hw)
    cm = cuvil.compile(m, (x,), precision="bf16", layout="blocked", num_threads=3)
    want = m(x).detach().numpy()
    got = cm(x).numpy()
    assert np.array_equal(cuvil.load(cm.path, num_threads=1).run(x.numpy())[0], got)   # the rows' split changes no sum
    assert ("cuvil_conv_blocked_bf16" in cm.c_source) == has_features("native", ("avx512_bf16",))
    # bf16 keeps 8 bits: each product off by ~2^-8 relative, their sum's error a few 2^-8 of the
    # output's scale; a slip in the layout or the gather is off by the scale itself
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("width,groups,stride,bf16_groups", [
    (128, 2, 2, True),      # RegNet's 64-channel groups, a stride-2 3x3 conv (no Winograd)
    (144, 3, 2, True),      # 48 filters a group: each group's panel cut short
    (192, 3, 1, True),      # stride 1, dilated: no Winograd either
    (128, 4, 2, False),     # 32 filters a group: fp32 (BF16_MIN_FILTERS)
])
def test_grouped_blocked_conv_in_bf16(width, groups, stride, bf16_groups):
    """precision="bf16" on a RegNet-style block whose grouped 3x3 conv has whole channel blocks a group:
    where the CPU multiplies in bf16 it runs cuvil_conv_blocked_bf16 a group at a time, reading and writing
    the bf16 maps of the 1x1 convs around it; within bf16's error of torch, 1 and 2 threads the same bits,
    2 images."""
    import torch

    import cuvil
    from cuvil.target import has_features

    dil = 2 if stride == 1 else 1

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(64, width, 1)
            self.b = torch.nn.Conv2d(width, width, 3, stride, dil, dilation=dil, groups=groups)
            self.c = torch.nn.Conv2d(width, 64, 1)

        def forward(self, x):
            return torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))))

    torch.manual_seed(width + groups)
    m = Block().eval()
    x = torch.randn(2, 64, 15, 13)
    cm = cuvil.compile(m, (x,), precision="bf16", layout="blocked", num_threads=2)
    native = has_features("native", ("avx512_bf16",))
    grouped = [n for n in cm.graph.nodes if n.op == "conv" and n.attrs.get("groups", 1) > 1]
    assert len(grouped) == 1 and grouped[0].attrs.get("layout") == "nchw16c" or not native
    assert cm.c_source.count("cuvil_conv_blocked_bf16(&s") == (3 if bf16_groups else 2) * native
    if native:
        assert [grouped[0].attrs.get(k, 0) for k in ("bf16_in", "bf16_out")] == [int(bf16_groups)] * 2
    want = m(x).detach().numpy()
    got = cm(x).numpy()
    assert np.array_equal(cuvil.load(cm.path, num_threads=1).run(x.numpy())[0], got)
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("limit", [0, 196])
def test_small_grouped_3x3_convs_take_direct_bf16_products(monkeypatch, tmp_path, limit):
    """With the plan's limit for grouped convs (tuning.PLAN_TUNING bf16_direct_grouped_3x3_max_outputs), a
    stride-1 3x3 conv in 64-channel groups on a 14x14 map runs direct bf16 products instead of Winograd
    (where the CPU has them); within bf16's error of torch either way."""
    import torch

    import cuvil
    from cuvil.codegen.c import tuning
    from cuvil.target import has_features
    monkeypatch.setattr(tuning, "plan_value", lambda knob, target: limit if "grouped" in knob else 0)
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Conv2d(64, 128, 1), torch.nn.ReLU(), torch.nn.Conv2d(128, 128, 3, padding=1, groups=2),
                            torch.nn.ReLU(), torch.nn.Conv2d(128, 64, 1)).eval()
    x = torch.randn(1, 64, 14, 14)
    cm = cuvil.compile(m, (x,), precision="bf16", layout="blocked", cache_dir=tmp_path)
    grouped = [n for n in cm.graph.nodes if n.op == "conv" and n.attrs.get("groups", 1) > 1]
    assert [n.attrs["bf16_act"] for n in grouped] == [2 if limit else 1]
    native = has_features("native", ("avx512_bf16",))
    assert cm.c_source.count("cuvil_conv3x3_winograd_blocked(&s") == (0 if limit and native else 1)
    assert cm.c_source.count("cuvil_conv_blocked_bf16(&s") == (3 if limit else 2) * native
    want = m(x).detach().numpy()
    assert np.abs(cm(x).numpy() - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("cin,cout", [(32, 16), (64, 32), (16, 96)])
def test_narrow_blocked_conv_stays_fp32(cin, cout):
    """A blocked conv of at most 32 filters (a 64-wide panel mostly zeros) or of 16 products an output
    (its time its stores) keeps fp32 products under precision="bf16" (lower_bf16dot.BF16_MIN_FILTERS,
    BF16_MIN_K), its weights in bf16: within their rounding of torch; a wide conv behind it takes bf16."""
    import torch

    import cuvil
    from cuvil.target import has_features

    torch.manual_seed(cin + cout)
    m = torch.nn.Sequential(torch.nn.Conv2d(8, cin, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(cin, cout, 1)).eval()
    x = torch.randn(1, 8, 20, 20)
    cm = cuvil.compile(m, (x,), precision="bf16", layout="blocked", num_threads=1)
    assert "cuvil_conv_blocked_bf16" not in cm.c_source
    want = m(x).detach().numpy()
    assert np.abs(cm(x).numpy() - want).max() <= 0.02 * np.abs(want).max()
    if has_features("native", ("avx512_bf16",)):      # a wide conv behind it does take bf16
        wide = torch.nn.Sequential(m, torch.nn.ReLU(), torch.nn.Conv2d(cout, 64, 3, 2, 1)).eval()
        assert "cuvil_conv_blocked_bf16" in cuvil.compile(wide, (x,), precision="bf16", layout="blocked").c_source


@pytest.mark.parametrize("knob,flags,vendor,want", [
    ("bf16_direct_3x3_max_outputs", {"avx512f", "avx512_bf16", "avx_vnni"}, "AuthenticAMD", 196),     # Zen 5
    ("bf16_direct_3x3_max_outputs", {"avx512f", "avx512_bf16"}, "AuthenticAMD", 49),   # Zen 4: 7x7 maps
    ("bf16_direct_3x3_max_outputs", {"avx512f", "avx512_bf16", "avx_vnni"}, "GenuineIntel", 0),
    ("bf16_direct_3x3_max_outputs", {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, "GenuineIntel", 1 << 30),
    ("bf16_direct_grouped_3x3_max_outputs", {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, "GenuineIntel", 1 << 30),
    ("bf16_direct_3x3_max_outputs", {"avx2", "fma"}, "AuthenticAMD", 0),
    ("bf16_direct_grouped_3x3_max_outputs", {"avx512f", "avx512_bf16"}, "AuthenticAMD", 196),      # Zen 4
    ("bf16_direct_grouped_3x3_max_outputs", {"avx512f", "avx512_bf16", "avx_vnni"}, "AuthenticAMD", 0),
    ("blocked_winograd4_min_outputs", {"avx512f", "avx512_vnni"}, "GenuineIntel", 225),      # F(2x2) at 14x14
    ("blocked_winograd4_min_outputs", {"avx512f", "avx512_bf16", "avx_vnni"}, "AuthenticAMD", 144),
    ("blocked_winograd4_min_outputs", {"avx2", "fma"}, "GenuineIntel", 144),
])
def test_plan_tuning_picks_the_cpu_row(monkeypatch, knob, flags, vendor, want):
    """codegen/c/tuning.plan_value: the first PLAN_TUNING row whose CPU test holds for a native target,
    else the default; a portable target always gets the default."""
    from cuvil import target
    from cuvil.codegen.c.tuning import PLAN_DEFAULTS, plan_value
    monkeypatch.setattr(target, "cpu_flags", lambda: set(flags))
    monkeypatch.setattr(target, "cpu_vendor", lambda: vendor)
    assert plan_value(knob, "native") == want
    assert plan_value(knob, "x86_64-avx512") == PLAN_DEFAULTS[knob]


@pytest.mark.parametrize("limit,ch", [(0, 64), (49, 64), (49, 32)])
def test_small_3x3_convs_take_direct_bf16_products(monkeypatch, tmp_path, limit, ch):
    """With the plan's limit (tuning.PLAN_TUNING bf16_direct_3x3_max_outputs), a 3x3 conv on a 7x7 map is
    marked bf16_act 2 and runs direct (no Winograd: cuvil_conv_blocked_bf16 where the CPU has AVX512-BF16,
    the fp32 direct conv elsewhere, though the plan names it only for a CPU that has it), the one on a
    14x14 map keeps Winograd; a conv of 32 filters keeps Winograd at 7x7 too (conv_plan.BF16_MIN_FILTERS:
    bf16's panels would be half zeros); within bf16's error of torch either way."""
    import torch

    import cuvil
    from cuvil.codegen.c import tuning
    from cuvil.target import has_features
    monkeypatch.setattr(tuning, "plan_value", lambda knob, target: limit)
    torch.manual_seed(4)
    m = torch.nn.Sequential(torch.nn.Conv2d(ch, ch, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                            torch.nn.Conv2d(ch, ch, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, ch, 14, 14)
    cm = cuvil.compile(m, (x,), precision="bf16", layout="blocked", cache_dir=tmp_path)
    marks = [n.attrs["bf16_act"] for n in cm.graph.nodes if n.op == "conv"]
    assert marks == ([1, 2] if limit else [1, 1])
    direct = bool(limit) and ch >= 48
    assert cm.c_source.count("cuvil_conv3x3_winograd_blocked(&s") == (1 if direct else 2)
    assert ("cuvil_conv_blocked_bf16" in cm.c_source) == (direct and has_features("native", ("avx512_bf16",)))
    want = m(x).detach().numpy()
    assert np.abs(cm(x).numpy() - want).max() <= 0.03 * np.abs(want).max()


# ---- bf16 maps between bf16 convs (passes/quantize.link_bf16_convs) ----
CONV_BUILDS = {"portable": (["-march=x86-64"], 4, None), "avx2": (["-mavx2", "-mfma", "-mf16c"], 8, "avx2"),
               "native": (["-march=native"], 16, "avx512f"), "native_no_amx": (["-march=native", *NO_AMX], 16, "avx512f")}
_conv_libs = {}


def _conv_lib(build):
    flags, _, needs = CONV_BUILDS[build]
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the builds' flags are x86 flags")
    if needs and needs not in cpu_flags():
        pytest.skip(f"this CPU has no {needs} (the portable build covers the kernel's C)")
    if build not in _conv_libs:
        lib = build_kernels(("blocked_dot.c", "bf16dot.c", "int8dot.c", "blocked.c", "pool.c"), flags)
        lib.cuvil_conv_blocked_bf16.restype = ctypes.c_int
        lib.cuvil_conv_blocked_scratch.restype = ctypes.c_int64
        _conv_libs[build] = lib
    return _conv_libs[build]


def _blocked(x, B):
    """[C, H, W] -> the channel-blocked layout [C / B][H][W][B]."""
    C, H, W = x.shape
    return np.ascontiguousarray(x.reshape(C // B, B, H, W).transpose(0, 2, 3, 1))


@pytest.mark.parametrize("build", list(CONV_BUILDS))
@pytest.mark.parametrize("k,stride,pad,hw", [(1, 1, 0, (5, 7)), (3, 1, 1, (6, 5)), (1, 2, 0, (7, 9)), (3, 2, 1, (9, 8))])
def test_conv_reads_and_writes_bf16_maps(build, k, stride, pad, hw):
    """cuvil_conv_blocked_bf16 with its input, residual and output as bf16 maps (CUVIL_BF16_IN | RES | OUT)
    against the same conv on floats, given the floats of the maps' bf16 bits: the very bits of its output
    rounded (a reader's rounding of its input is the writer's; a bf16 residual widens exactly). Every
    source kind (in place, padded copy, gathered) at every block width, two panels, the second cut short
    (80 channels: on 2 threads split by panels, all rows taken once beforehand), two images (each where
    its floats' image would start)."""
    from cuvil.codegen.c.lower_blocked import bf16_filter_panels
    lib = _conv_lib(build)
    B = CONV_BUILDS[build][1]
    rng = np.random.default_rng(k * 7 + stride)
    N, C, O, (H, W) = 2, 32, 80, hw
    OH, OW = (H + 2 * pad - k) // stride + 1, (W + 2 * pad - k) // stride + 1
    shape = (ctypes.c_int64 * 16)(N, C, H, W, O, k, k, OH, OW, stride, stride, pad, pad, 1, 1, 1)
    widen = lambda bits: _as_float(bits)
    xb = to_bf16(rng.standard_normal((N, C, H, W), np.float32))
    rb = to_bf16(rng.standard_normal((N, O, OH, OW), np.float32))
    wb = bf16_filter_panels(rng.standard_normal((O, C, k, k), np.float32))
    bias = rng.standard_normal(O).astype(np.float32)
    scratch = np.zeros(lib.cuvil_conv_blocked_scratch(shape) + 64, np.float32)

    def blocked_images(imgs, dtype):       # image n's map where its floats' image would start
        per = imgs[0].size
        buf = np.zeros(len(imgs) * per * (4 // np.dtype(dtype).itemsize), dtype)
        for n, im in enumerate(imgs):
            buf[n * per * (4 // np.dtype(dtype).itemsize):][:per] = _blocked(im, B).ravel()
        return buf

    def conv(x, res, y, links):
        assert lib.cuvil_conv_blocked_bf16(shape, _ptr(x), _ptr(wb), _ptr(bias), _ptr(res), _ptr(y),
                                           ACT_CODES["relu"], links, _ptr(scratch), 2) == 0
    floats = np.full(N * O * OH * OW, np.nan, np.float32)
    conv(blocked_images(widen(xb), np.float32), blocked_images(widen(rb), np.float32), floats, 0)
    maps = np.full(N * O * OH * OW * 2, 0xFFFF, np.uint16)
    conv(blocked_images(xb, np.uint16), blocked_images(rb, np.uint16), maps, 1 | 2 | 4)
    per = O * OH * OW
    for n in range(N):
        got, want = maps[2 * n * per:][:per], to_bf16(floats[n * per:][:per])
        assert np.array_equal(got, want), f"image {n}: {np.count_nonzero(got != want)} of {per} differ"


def _convs(graph):
    """The graph's convs in order, those in a batch_map's body included."""
    out = []
    for n in graph.nodes:
        if n.op == "batch_map":
            out += _convs(n.attrs["body_graph"])
        elif n.op == "conv":
            out.append(n)
    return out


@pytest.mark.parametrize("hw", [14, 64])
def test_bf16_convs_pass_bf16_maps(hw, tmp_path, monkeypatch):
    """precision="bf16" on two bottleneck blocks and a max pool: where the CPU multiplies in bf16, each conv
    whose output only bf16 convs read stores it in bf16 for them (as input, or as the second block's
    residual); the first conv reads the graph's input and the last writes the pool's floats. At 64 px
    the images run one by one (batch_map), the links inside its body. Linked against unlinked: within
    bf16's rounding of the residual; both within bf16's error of torch; 1 and 2 threads the same bits.
    A CPU without bf16 products links nothing."""
    import torch

    import cuvil
    from cuvil.target import has_features

    from .util import compile_linked_and_plain

    class Bottleneck(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(64, 48, 1), torch.nn.Conv2d(48, 48, 3, padding=2, dilation=2)
            self.c = torch.nn.Conv2d(48, 64, 1)

        def forward(self, x):
            return torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))) + x)

    torch.manual_seed(hw)
    m = torch.nn.Sequential(Bottleneck(), Bottleneck(), torch.nn.MaxPool2d(2)).eval()
    x = torch.randn(2, 64, hw, hw)
    linked, plain = compile_linked_and_plain(m, (x,), tmp_path, monkeypatch, precision="bf16", layout="blocked",
                                             num_threads=2)
    marks = [[n.attrs.get(k, 0) for n in _convs(linked.graph)] for k in ("bf16_in", "bf16_res", "bf16_out")]
    if has_features("native", ("avx512_bf16",)):
        assert marks == [[0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 0]]
        assert "CUVIL_BF16_IN | CUVIL_BF16_RES" in linked.c_source
    else:
        assert marks == [[0] * 6] * 3
    assert (hw == 64) == any(n.op == "batch_map" for n in linked.graph.nodes)
    got, base, want = linked(x).numpy(), plain(x).numpy(), m(x).detach().numpy()
    assert np.array_equal(cuvil.load(linked.path, num_threads=1).run(x.numpy())[0], got)
    scale = np.abs(want).max()
    assert np.abs(got - base).max() <= 2 ** -7 * scale        # the residual's rounding, carried one block
    assert np.abs(got - want).max() <= 0.03 * scale and np.abs(base - want).max() <= 0.03 * scale


@pytest.mark.parametrize("build", list(CONV_BUILDS))
@pytest.mark.parametrize("C,k,stride,pad,dil,hw", [(3, 7, 2, 3, 1, (23, 19)), (8, 3, 2, 1, 1, (9, 10)),
                                                   (8, 5, 1, 2, 1, (9, 10)), (4, 5, 1, 2, 2, (11, 8)),
                                                   (3, 4, 4, 0, 1, (16, 12))])
def test_stem_conv_in_bf16(build, C, k, stride, pad, dil, hw):
    """cuvil_conv_nchw_blocked_bf16 (a stem: NCHW input, channel-blocked output) against numpy on the same
    bf16 operands: the 7x7 stride-2 stem's short runs, runs of 24 values (still short) and of 40 (copied
    whole), a dilated conv (a run a tap), an unpadded patchify conv; 80 output channels (a panel cut
    short), bias, residual and ReLU, two images;
    its output also as a bf16 map with a bf16 residual (CUVIL_BF16_RES | OUT): the rounded bits of the
    float run's."""
    from cuvil.codegen.c.lower_blocked import bf16_filter_panels
    lib = _conv_lib(build)
    lib.cuvil_conv_nchw_blocked_scratch.restype = ctypes.c_int64
    B = CONV_BUILDS[build][1]
    rng = np.random.default_rng(C * k + stride)
    N, O, (H, W) = 2, 80 // B * B, hw
    OH, OW = (H + 2 * pad - dil * (k - 1) - 1) // stride + 1, (W + 2 * pad - dil * (k - 1) - 1) // stride + 1
    shape = (ctypes.c_int64 * 16)(N, C, H, W, O, k, k, OH, OW, stride, stride, pad, pad, dil, dil, 1)
    x = rng.standard_normal((N, C, H, W), np.float32)
    w = rng.standard_normal((O, C, k, k), np.float32)
    bias, res = rng.standard_normal(O).astype(np.float32), rng.standard_normal((N, O, OH, OW), np.float32)
    scratch = np.zeros(lib.cuvil_conv_nchw_blocked_scratch(shape) + 64, np.float32)
    y = np.full((N, O // B, OH, OW, B), np.nan, np.float32)
    res_b = np.stack([_blocked(r, B) for r in res])
    assert lib.cuvil_conv_nchw_blocked_bf16(shape, _ptr(x), _ptr(bf16_filter_panels(w)), _ptr(bias), _ptr(res_b),
                                            _ptr(y), ACT_CODES["relu"], 0, _ptr(scratch), 2) == 0
    xr = torch_free_conv(_as_float(to_bf16(x)), _as_float(to_bf16(w)), stride, pad, dil)
    want = np.maximum(xr + bias[:, None, None] + res, 0)
    got = y.transpose(0, 1, 4, 2, 3).reshape(N, O, OH, OW)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    rb = to_bf16(res)
    maps = np.full(y.size * 2, 0xFFFF, np.uint16)
    res16 = np.zeros(res.size * 2, np.uint16)
    per = O * OH * OW
    for n in range(N):
        res16[2 * n * per:][:per] = _blocked(rb[n], B).ravel()
        res_b[n] = _blocked(_as_float(rb[n]), B)
    assert lib.cuvil_conv_nchw_blocked_bf16(shape, _ptr(x), _ptr(bf16_filter_panels(w)), _ptr(bias), _ptr(res_b),
                                            _ptr(y), ACT_CODES["relu"], 0, _ptr(scratch), 2) == 0
    assert lib.cuvil_conv_nchw_blocked_bf16(shape, _ptr(x), _ptr(bf16_filter_panels(w)), _ptr(bias), _ptr(res16),
                                            _ptr(maps), ACT_CODES["relu"], 2 | 4, _ptr(scratch), 2) == 0
    for n in range(N):
        assert np.array_equal(maps[2 * n * per:][:per], to_bf16(y[n].ravel()))


def torch_free_conv(x, w, stride, pad, dil):
    """A plain float64 conv (N, C, H, W) x (O, C, k, k): the oracle of the stem test."""
    N, C, H, W = x.shape
    O, _, k, _ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    OH, OW = (H + 2 * pad - dil * (k - 1) - 1) // stride + 1, (W + 2 * pad - dil * (k - 1) - 1) // stride + 1
    out = np.zeros((N, O, OH, OW))
    for kh in range(k):
        for kw in range(k):
            patch = xp[:, :, kh * dil:kh * dil + stride * (OH - 1) + 1:stride, kw * dil:kw * dil + stride * (OW - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, kh, kw].astype(np.float64))
    return out


@pytest.mark.parametrize("k,stride,pad,takes", [(7, 2, 3, True), (3, 2, 1, False)])
def test_stem_takes_bf16_products_from_64_products(k, stride, pad, takes, tmp_path):
    """precision="bf16": a stem (NCHW input) of 147 products an output runs cuvil_conv_nchw_blocked_bf16
    where the CPU has AVX512-BF16 and passes the 1x1 conv after it a bf16 map; one of 27 (MobileNet's
    3x3) stays fp32 (lower_bf16dot.BF16_MIN_NCHW_K). Within bf16's error of torch either way."""
    import torch

    import cuvil
    from cuvil.target import has_features
    torch.manual_seed(k)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 64, k, stride, pad), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 1),
                            torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 40, 36)
    cm = cuvil.compile(m, (x,), precision="bf16", layout="blocked", cache_dir=tmp_path)
    native = has_features("native", ("avx512_bf16",))
    assert ("cuvil_conv_nchw_blocked_bf16(&s" in cm.c_source) == (takes and native)
    assert [n.attrs.get("bf16_out", 0) for n in _convs(cm.graph)] == [int(takes and native), 0]
    want = m(x).detach().numpy()
    assert np.abs(cm(x).numpy() - want).max() <= 0.03 * np.abs(want).max()
