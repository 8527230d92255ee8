"""Depthwise convs on the byte image of the integer conv before them (kernels/depthwise_bytes.c,
precision="int8" with calibrated ranges): the kernel against numpy on the same bytes (the input's
dequantized values convolved in float64), with float and byte output, every filter width it tiles and
the generic path, in the portable (4-float), AVX2 (8) and AVX-512 (16) builds; then compiled
MobileNet-style blocks against torch and against the same model compiled without the byte links."""
import ctypes

import numpy as np
import pytest

from cuvil.codegen.c.gen_activations import ACT_CODES

from .test_int8dot import Shape, _byte_map, _ptr, lib  # noqa: F401  (lib: the kernel builds, a fixture)
from .util import compile_linked_and_plain


def _act(y, act):
    import torch
    t = torch.from_numpy(y)
    return {"none": t, "relu6": torch.nn.functional.relu6(t), "silu": torch.nn.functional.silu(t)}[act].numpy()


def _image(q, zero, k, stride, pad, dil, OH, OW):
    """The byte image a depthwise conv reads (lower_int8dot.int8_input_image): the padded extent of every
    window, the map at (pad, pad), the rest at the zero point; the map itself where no window passes it."""
    C, H, W = q.shape
    hp, wp = (OH - 1) * stride + (k - 1) * dil + 1, (OW - 1) * stride + (k - 1) * dil + 1
    if pad == 0 and hp <= H and wp <= W:
        return np.ascontiguousarray(q.transpose(1, 2, 0)).astype(np.uint8)
    img = np.full((hp, wp, C), zero, np.uint8)
    h, w = min(H, hp - pad), min(W, wp - pad)
    img[pad:pad + h, pad:pad + w] = q.transpose(1, 2, 0)[:h, :w]
    return img


@pytest.mark.parametrize("k,stride,pad,dil,cb,hw,act,residual,out_bytes", [
    (3, 1, 1, 1, 3, (9, 11), "relu6", False, True),     # tiles of 8, 4 and 1; bytes with the map folded in
    (3, 1, 1, 1, 2, (7, 13), "relu6", False, False),    # floats, the activation a clamp
    (3, 2, (0, 1), 1, 2, (12, 13), "relu6", False, True),  # MobileNetV2's strided pads (0, 1)
    (3, 2, 1, 1, 1, (10, 9), "none", True, False),      # a residual: the general store
    (5, 1, 2, 1, 2, (8, 9), "silu", False, True),       # an activation that is no clamp: bytes the long way
    (5, 2, 2, 1, 1, (11, 10), "relu6", False, True),
    (7, 1, 3, 1, 1, (9, 8), "none", False, False),
    (3, 1, 2, 2, 2, (9, 10), "relu6", False, True),     # dilated: the generic path
    (1, 1, 0, 1, 1, (5, 6), "relu6", False, True),      # 1x1, read in place
    (3, 1, 0, 1, 1, (8, 8), "relu6", True, True),       # unpadded, read in place; residual into bytes
])
def test_depthwise_on_bytes_matches_float_arithmetic(lib, k, stride, pad, dil, cb, hw, act, residual, out_bytes):  # noqa: F811
    B, levels = lib.block, lib.levels
    C, (H, W), N = cb * B, hw, 2
    pads = pad if isinstance(pad, tuple) else (pad, pad)        # (start, end) of both H and W
    OH = (H + pads[0] + pads[1] - dil * (k - 1) - 1) // stride + 1
    OW = (W + pads[0] + pads[1] - dil * (k - 1) - 1) // stride + 1
    rng = np.random.default_rng(k * 10 + stride + cb)
    x = np.maximum(rng.standard_normal((N, C, H, W)), -0.5).astype(np.float32)
    w = (rng.standard_normal((C, 1, k, k)) * 0.3).astype(np.float32)
    bias = rng.standard_normal(C).astype(np.float32)
    res = rng.standard_normal((N, C, OH, OW)).astype(np.float32) if residual else None
    in_range, out_range = [-0.5, 3.0], [-1.0, 2.5]           # the output's clips on both sides
    images, hats = [], []
    for n in range(N):
        q, scale, zero = _byte_map(x[n], in_range, levels)
        images.append(_image(q, zero, k, stride, pads[0], dil, OH, OW))
        hats.append((q - zero) * scale)                       # the values the bytes stand for
    s = Shape(N, C, H, W, C, k, k, OH, OW, stride, stride, pads[0], pads[0], dil, dil, C)
    scratch = np.zeros(lib.cuvil_depthwise_bytes_scratch(ctypes.byref(s)) + 16, np.float32)
    wt = np.ascontiguousarray(w.reshape(C, -1).T)             # [taps][C], as the lowering packs it
    blocked = lambda a: np.ascontiguousarray(a.reshape(N, C // B, B, *a.shape[2:]).transpose(0, 1, 3, 4, 2))  # noqa: E731
    out_image = [OH + 1, OW + 2, 1, 1] if out_bytes else None   # the next conv pads by 1 (3x3)
    y = (np.full((N, out_image[0], out_image[1], C), 0xcd, np.uint8) if out_bytes
         else np.full((N, C // B, OH, OW, B), np.nan, np.float32))
    lib.cuvil_depthwise_bytes(ctypes.byref(s), _ptr(np.stack(images)), _ptr(wt), _ptr(bias),
                              _ptr(np.array(in_range, np.float32)), _ptr(None if res is None else blocked(res)), _ptr(y),
                              _ptr(None if out_image is None else np.array(out_image, np.int64)),
                              _ptr(np.array(out_range, np.float32)), ACT_CODES[act], _ptr(scratch), 2)

    import torch
    for n in range(N):
        conv = torch.nn.functional.conv2d(torch.nn.functional.pad(torch.from_numpy(hats[n][None].astype(np.float64)),
                                                                  (pads[0], pads[1], pads[0], pads[1])),
                                          torch.from_numpy(w.astype(np.float64)), torch.from_numpy(bias.astype(np.float64)),
                                          stride, 0, dil, C)[0, :, :OH, :OW].numpy()
        want = _act(conv + (res[n] if residual else 0), act)
        if not out_bytes:
            got = y[n].transpose(0, 3, 1, 2).reshape(C, OH, OW)
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-5
            continue
        qwant, _, ozero = _byte_map(want.astype(np.float32), out_range, levels)
        got = y[n][1:1 + OH, 1:1 + OW].transpose(2, 0, 1).astype(np.int64)
        # the folded map rounds elsewhere than the float steps: a byte may differ at an exact tie
        diff = np.abs(got - qwant)
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
        border = np.ones(y[n].shape[:2], bool)
        border[1:1 + OH, 1:1 + OW] = False
        assert (y[n][border] == ozero).all()


def _inverted_residual(cin, expand, k, stride):
    """MobileNetV2's block: 1x1 expand (ReLU6) -> k x k depthwise (ReLU6) -> 1x1 project (+ input)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            e = cin * expand
            self.a = torch.nn.Conv2d(cin, e, 1)
            kk = k if isinstance(k, tuple) else (k, k)
            self.d = torch.nn.Conv2d(e, e, kk, stride, (kk[0] // 2, kk[1] // 2), groups=e)
            self.p = torch.nn.Conv2d(e, cin, 1)
            self.q = torch.nn.Conv2d(cin, e, 1)       # and the next block's expand: the project writes bytes

        def forward(self, x):
            h = torch.nn.functional.relu6(self.d(torch.nn.functional.relu6(self.a(x))))
            y = self.p(h)
            y = y + x if stride == 1 else y
            return torch.nn.functional.relu6(self.q(y))
    return Block().eval()


@pytest.mark.parametrize("k,stride,hw,cin", [(3, 1, (14, 13), 32), (3, 2, (15, 16), 32), (5, 1, (9, 11), 32),
                                             (5, 2, (12, 12), 32), (3, 1, (12, 10), 24), (3, 2, (11, 12), 24),
                                             # 3 wide but not 3 tall: not the 3x3 rows' kernel
                                             ((1, 3), 1, (12, 13), 32), ((5, 3), 2, (13, 12), 32)])
@pytest.mark.parametrize("target", ["native", "x86_64-avx2"])
def test_compiled_depthwise_reads_and_writes_bytes(k, stride, hw, cin, target, tmp_path, monkeypatch):
    """Calibrated int8 inverted-residual blocks: the depthwise conv reads the expand conv's bytes and
    writes the project conv's (cuvil_depthwise_bytes); within int8's error of torch and of the same model
    compiled without the links (where the depthwise conv runs on floats), on every target with integer
    convs; without them no conv is linked. 24 channels on a 16-float target: the project conv reads the
    blocked bytes into NCHW output (conv_plan "blocked_to_nchw"); with the block's input, NCHW floats, as
    its residual it writes NCHW that the next expand conv reads, without (stride 2) that conv's bytes."""
    import torch

    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    from cuvil.target import has_features
    if target != "native" and not has_features("native", ("avx2", "fma")):
        pytest.skip("this CPU runs no AVX2 build")
    torch.manual_seed(sum(k) if isinstance(k, tuple) else k * 10 + stride)
    m = _inverted_residual(cin, 4, k, stride)
    calib = [torch.randn(1, cin, *hw) for _ in range(4)]
    x = torch.randn(1, cin, *hw)
    kw = dict(precision="int8", layout="blocked", target=target, calibration_data=calib)
    cm, plain = compile_linked_and_plain(m, (x,), tmp_path, monkeypatch, **kw)
    assert cm.c_source.count("cuvil_depthwise_bytes(") == (1 if int8_conv_kind(target) else 0)
    assert "cuvil_depthwise_bytes(" not in plain.c_source
    from cuvil.codegen.c.conv_plan import conv_plan
    from cuvil.target import vector_floats
    into_nchw = [n for n in cm.graph.nodes if n.op == "conv" and conv_plan(n).kind == "blocked_to_nchw"]
    assert len(into_nchw) == (1 if int8_conv_kind(target) and cin % vector_floats(target) else 0)
    want = m(x).detach().numpy()
    got = cm(x).numpy()
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 0.04 * np.abs(want).max()
    assert np.abs(got - plain(x).numpy()).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("target", ["native", "x86_64-avx2"])
def test_nchw_convs_run_in_integer_products(target, tmp_path):
    """int8 convs whose channels fill no block either side (ShuffleNet's) run on the integer kernel from
    NCHW floats into NCHW floats (conv_plan "int8_nchw"): 1x1 ones, and a 3x3 stride-2 one that gathers;
    a 3x3 stride-1 one too on VNNI, while AVX2 keeps it in fp32 Winograd; within int8's error of torch."""
    import torch

    import cuvil
    from cuvil.codegen.c.conv_plan import conv_plan
    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    from cuvil.target import has_features
    if target != "native" and not has_features("native", ("avx2", "fma")):
        pytest.skip("this CPU runs no AVX2 build")

    class Branch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(29, 58, 3, 2, 1), torch.nn.Conv2d(58, 58, 1)
            self.c, self.d = torch.nn.Conv2d(58, 58, 3, 1, 1), torch.nn.Conv2d(58, 29, 1)

        def forward(self, x):
            h = torch.relu(self.b(torch.relu(self.a(x))))
            return self.d(torch.relu(self.c(h)) + h)
    torch.manual_seed(4)
    m = Branch().eval()
    x = torch.randn(2, 29, 15, 13)
    calib = [torch.randn(2, 29, 15, 13) for _ in range(3)]
    for cal in (None, calib):
        cm = cuvil.compile(m, (x,), precision="int8", target=target, calibration_data=cal, cache_dir=tmp_path / str(cal is None))
        kinds = [conv_plan(n).kind for n in cm.graph.nodes if n.op == "conv"]
        kind = int8_conv_kind(target)
        assert kinds.count("int8_nchw") == (4 if kind == 2 else 3 if kind == 1 else 0), kinds
        want = m(x).detach().numpy()
        got = cm(x).numpy()
        assert np.abs(got - want).max() <= 0.04 * np.abs(want).max()


@pytest.mark.parametrize("stride,hw,batch,threads", [(1, (23, 21), 2, 2), (2, (24, 25), 1, 2), (1, (12, 13), 1, 1)])
@pytest.mark.parametrize("target", ["native", "x86_64-avx2"])
def test_float_depthwise_writes_the_next_convs_bytes(stride, hw, batch, threads, target, tmp_path, monkeypatch):
    """A MobileNet's first depthwise conv reads the float stem's output and, calibrated, writes the 1x1
    conv's input bytes itself (kernels/blocked.c cuvil_depthwise_blocked_to_bytes); the bytes are those
    the 1x1 conv makes of the floats unlinked, so the outputs equal the unlinked model's to the bit, on
    one thread and split over two (tasks by rows of whole pixels), one image and two; and within int8's
    error of torch."""
    import torch

    from cuvil.codegen.c.lower_int8dot import int8_conv_kind
    from cuvil.target import has_features
    if target != "native" and not has_features("native", ("avx2", "fma")):
        pytest.skip("this CPU runs no AVX2 build")
    torch.manual_seed(stride * 7 + batch)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, 2, 1), torch.nn.ReLU6(),
                            torch.nn.Conv2d(32, 32, 3, stride, 1, groups=32), torch.nn.ReLU6(),
                            torch.nn.Conv2d(32, 16, 1), torch.nn.Conv2d(16, 48, 1), torch.nn.ReLU6()).eval()
    calib = [torch.randn(batch, 3, *hw) for _ in range(4)]
    x = torch.randn(batch, 3, *hw)
    kw = dict(precision="int8", layout="blocked", target=target, calibration_data=calib, num_threads=threads)
    cm, plain = compile_linked_and_plain(m, (x,), tmp_path, monkeypatch, **kw)
    assert cm.c_source.count("cuvil_depthwise_blocked_to_bytes(&s") == (1 if int8_conv_kind(target) else 0)
    got = cm(x).numpy()
    assert np.array_equal(got, plain(x).numpy())
    want = m(x).detach().numpy()       # three chained int8 convs on a small random map: up to 6.3% here
    assert np.abs(got - want).max() <= 0.08 * np.abs(want).max()
