"""The layout pass (passes/layout.py): which convs and pools turn channel-blocked, where the relayouts
go, and whole nets compiled blocked against torch eager. The blocked kernels themselves are checked op
by op against the interpreter in test_ops.py ("relayout" case)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cuvil import api as cuvil_api
from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.passes import layout
from cuvil.target import resolve_target, vector_floats

from .util import skip_unless_host_runs

torch = pytest.importorskip("torch", reason="the end-to-end cases compile torch modules")


def _conv(g, x, o, k=1, **attrs):
    rng = np.random.default_rng(len(g.nodes))
    w = g.const(rng.standard_normal((o, x.shape[1], k, k)).astype(np.float32))
    return g.add("conv", [x, w], dict(attrs, pads=((k // 2, k // 2),) * 2))


def _ops(graph):
    return [(n.op, n.attrs.get("layout", n.attrs.get("to"))) for n in graph.nodes]


def test_chain_turns_blocked_with_relayouts_only_at_its_ends():
    g = Graph()
    x = Value(TensorType((1, 16, 8, 8), "float32"), "x")
    g.inputs = [x]
    a = _conv(g, x, 32)
    b = g.add("max_pool", [_conv(g, a, 32, 3)], {"kernel": (2, 2)})
    y = g.add("relu", [_conv(g, b, 48)])
    g.outputs = [y]
    ops = _ops(layout.run(g, "nchw16c"))
    assert ops == [("relayout", "nchw16c"), ("conv", "nchw16c"), ("conv", "nchw16c"), ("max_pool", "nchw16c"),
                   ("conv", "nchw16c"), ("relu", None), ("relayout", "nchw")]     # the relu runs blocked


def test_lone_and_unblockable_convs_stay_nchw():
    g = Graph()
    x = Value(TensorType((1, 3, 8, 8), "float32"), "x")
    g.inputs = [x]
    stem = _conv(g, x, 16, 3)                        # 3 input channels: not a multiple of 16
    odd = _conv(g, g.add("relu", [stem]), 24)        # 24 filters
    lone = _conv(g, g.add("relu", [odd]), 32)        # blockable, but no blocked neighbour
    g.outputs = [lone]
    assert all(lay in ("nchw", None) for _, lay in _ops(layout.run(g, "nchw16c")))


def test_blocks_of_eight_take_channel_counts_that_sixteen_does_not():
    """On AVX2 (nchw8c) a MobileNet's 24- and 40-channel convs run blocked; in blocks of 16 they stay NCHW."""
    def graph():
        g = Graph()
        x = Value(TensorType((1, 24, 8, 8), "float32"), "x")
        g.inputs = [x]
        g.outputs = [_conv(g, g.add("relu", [_conv(g, x, 40)]), 24, 3)]
        return g
    assert _ops(layout.run(graph(), "nchw8c")) == [("relayout", "nchw8c"), ("conv", "nchw8c"), ("relu", None),
                                                   ("conv", "nchw8c"), ("relayout", "nchw")]
    assert all(lay in ("nchw", None) for _, lay in _ops(layout.run(graph(), "nchw16c")))


def test_blocked_output_and_shared_value_get_one_relayout_each():
    g = Graph()
    x = Value(TensorType((2, 16, 6, 6), "float32"), "x")
    g.inputs = [x]
    a = _conv(g, x, 16)
    b = _conv(g, a, 16, 3)
    pooled = g.add("softmax", [a], {"axis": 3})                                 # two NCHW readers of a
    pooled2 = g.add("log_softmax", [a], {"axis": 2})
    mean = g.add("reduce_mean", [a], {"axes": (2, 3), "keepdims": True})       # reads a where it lies
    g.outputs = [b, mean, pooled, pooled2]
    out = layout.run(g, "nchw16c")
    relayouts = [n for n in out.nodes if n.op == "relayout"]
    assert [n.attrs["to"] for n in relayouts] == ["nchw16c", "nchw", "nchw"]
    assert relayouts[1].inputs[0] is a and pooled.producer.inputs[0] is pooled2.producer.inputs[0] is relayouts[1].outputs[0]
    assert mean.producer.inputs[0] is a
    assert out.outputs[0].producer is relayouts[2]


def test_pointwise_between_convs_runs_blocked_unless_it_broadcasts_over_space():
    g = Graph()
    x = Value(TensorType((1, 16, 6, 6), "float32"), "x")
    g.inputs = [x]
    a = _conv(g, x, 32)
    clipped = g.add("clip", [a], {"min": 0.0, "max": 6.0})
    dw = g.add("conv", [clipped, g.const(np.ones((32, 1, 3, 3), np.float32))], {"groups": 32, "pads": ((1, 1),) * 2})
    scaled = g.add("mul", [dw, g.const(np.ones((1, 32, 1, 1), np.float32))])       # per channel: read in place
    shifted = g.add("add", [scaled, g.const(np.float32(1))])        # a scalar operand: either layout
    rows = g.add("mul", [shifted, g.const(np.ones((1, 1, 6, 1), np.float32))])     # per row: NCHW only
    g.outputs = [_conv(g, rows, 16)]
    out = layout.run(g, "nchw16c")
    assert _ops(out) == [("relayout", "nchw16c"), ("conv", "nchw16c"), ("clip", None), ("conv", "nchw16c"),
                         ("mul", None), ("add", None), ("relayout", "nchw"), ("mul", None), ("conv", "nchw")]
    assert [n.outputs[0].layout for n in out.nodes] == ["nchw16c"] * 6 + ["nchw"] * 3


def test_squeeze_excitation_stays_blocked():
    """Global mean, the gate's 1x1 convs on [N, C, 1, 1] and the per-channel scaling of the map: the map
    is read where it lies, relayouts only at the ends."""
    g = Graph()
    x = Value(TensorType((2, 16, 6, 6), "float32"), "x")
    g.inputs = [x]
    a = _conv(g, x, 32)
    pooled = g.add("reduce_mean", [a], {"axes": (2, 3), "keepdims": True})
    gate = g.add("sigmoid", [_conv(g, g.add("relu", [_conv(g, pooled, 8)]), 32)])
    g.outputs = [_conv(g, g.add("mul", [a, gate]), 16)]
    ops = _ops(layout.run(g, "nchw16c"))
    assert ops.count(("relayout", "nchw")) == 1 and ("reduce_mean", None) in ops and ("mul", None) in ops
    assert [o for o in ops if o[0] == "conv"][-1] == ("conv", "nchw16c")


class _Bottlenecks(torch.nn.Module):
    """A small ResNet: stem, max pool, bottleneck blocks with projection shortcuts, stride-2 3x3 convs,
    both Winograd tile sizes, global average pool and a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 7, 2, 3), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                                        torch.nn.MaxPool2d(3, 2, 1))
        blocks = []
        for cin, mid, cout, stride in ((32, 16, 64, 1), (64, 32, 128, 2), (128, 32, 128, 1)):
            blocks.append(torch.nn.ModuleDict({
                "body": torch.nn.Sequential(
                    torch.nn.Conv2d(cin, mid, 1), torch.nn.BatchNorm2d(mid), torch.nn.ReLU(),
                    torch.nn.Conv2d(mid, mid, 3, stride, 1), torch.nn.BatchNorm2d(mid), torch.nn.ReLU(),
                    torch.nn.Conv2d(mid, cout, 1), torch.nn.BatchNorm2d(cout)),
                "short": torch.nn.Conv2d(cin, cout, 1, stride) if (cin, stride) != (cout, 1) else torch.nn.Identity()}))
        self.blocks = torch.nn.ModuleList(blocks)
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(b["body"](x) + b["short"](x))
        return x, self.fc(x.mean((2, 3)))


class _DeepChannels(torch.nn.Module):
    """Convs deep enough in channels for several K blocks of the wide tile (tuning.h
    CUVIL_BLOCKED_WIDE_KB: 8 or 32 blocks of 16 channels): a 1x1 conv of 1040 channels into 80 (a pair of
    panels and half of one: the one-vector tile over a long K) with a residual and ReLU, a 3x3 stride-2
    conv gathered over 9 x 80 channels into 96 (a pair of panels and one); the stem into 1040 channels
    from NCHW (wide and one-vector NCHW tiles)."""

    def __init__(self):
        super().__init__()
        self.a, self.r = torch.nn.Conv2d(3, 1040, 1), torch.nn.Conv2d(3, 80, 1)
        self.b, self.c = torch.nn.Conv2d(1040, 80, 1), torch.nn.Conv2d(80, 96, 3, 2, 1)

    def forward(self, x):
        y = torch.relu(self.b(torch.relu(self.a(x))) + self.r(x))
        return y, self.c(y)


@pytest.mark.parametrize("threads, target", [(1, "native"), (2, "native"), (1, "x86_64-avx512")])
def test_deep_k_blocks_of_the_wide_tile_match_torch(tmp_path, threads, target):
    """Partial sums carried from K block to K block (the first adds nothing, the last the epilogue),
    at this CPU's K block and, where the CPU runs AVX-512, at the generic x86_64-avx512 build's."""
    import cuvil
    from cuvil.target import cpu_flags
    if target == "x86_64-avx512" and "avx512f" not in cpu_flags():
        pytest.skip(f"this CPU cannot run {target} code")
    torch.manual_seed(0)
    m = _DeepChannels().eval()
    x = torch.randn(1, 3, 13, 11)
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, target=target, cache_dir=str(tmp_path))
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


class _PointwiseStack(torch.nn.Module):
    """1x1 convs of 512 and 96 channels (the wide tile's two panels, and one pair plus one panel) with a
    residual and ReLU, between two 3x3 convs so the map stays blocked."""

    def __init__(self):
        super().__init__()
        self.stem, self.a = torch.nn.Conv2d(3, 96, 3, padding=1), torch.nn.Conv2d(96, 512, 1)
        self.b, self.c = torch.nn.Conv2d(512, 96, 1), torch.nn.Conv2d(96, 32, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        return self.c(torch.relu(self.b(torch.relu(self.a(y))) + y))


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("hw", [(14, 14), (7, 7), (9, 11)])
def test_m_blocks_in_wide_tile_rows_match_torch(tmp_path, threads, hw):
    """M blocks a multiple of the wide tile's 6 rows on AVX-512 (blocked.c rows_unit; 196 pixels on 2
    threads: 66, 66 and 64, of which 4 in an edge tile; 49: 30 and 19; 99), 8 elsewhere, on 2 and 3
    threads."""
    import cuvil
    torch.manual_seed(1)
    m = _PointwiseStack().eval()
    x = torch.randn(1, 3, *hw)
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, cache_dir=str(tmp_path))
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads, target", [(1, "native"), (2, "native"), (2, "x86_64-avx2"), (2, "x86_64-sse2")])
def test_small_resnet_blocked_matches_torch(tmp_path, threads, target):
    """layout="blocked": blocks of the target's vector width (nchw8c and 6-row tiles on AVX2, nchw4c with
    SSE2, the width of NEON and the portable kernels)."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    m = _Bottlenecks().eval()
    for mod in m.modules():                        # BN statistics away from identity, so folding matters
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 61, 58)
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, target=target, cache_dir=str(tmp_path))
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked", target=target)["passes"]
    blocked = f"nchw{vector_floats(resolve_target(target))}c"
    assert text.count(f"layout={blocked}") >= 10 and text.count("relayout(") == 1    # at the end: the stem writes blocked
    assert f"layout={blocked}, in_layout=nchw" in text
    with torch.no_grad():
        ref = [t.numpy() for t in m(x)]
    for got, want in zip(cm.run(x.numpy()), ref):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_pointwise_convs_from_nchw_into_blocks_match_torch(tmp_path, target):
    """1x1 convs whose input has channels no 16-float block holds (24, 40: NCHW) into blocked outputs, read in place:
    output channels of two whole panels (the wide tiles on AVX-512), one and a half, pixel counts with
    every row remainder; then a padded 3x3 one from NCHW (the copy)."""
    import cuvil
    skip_unless_host_runs(target)

    class Net(torch.nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.a = torch.nn.Conv2d(cin, cout, 1)
            self.d = torch.nn.Conv2d(cout, cout, 3, padding=1, groups=cout)
            self.b = torch.nn.Conv2d(cout, 32, 1)
            self.s = torch.nn.Conv2d(cin, 32, 3, padding=1)

        def forward(self, x):
            return self.b(self.d(torch.relu(self.a(x)))) + self.s(x)

    torch.manual_seed(0)
    for cin, cout, hw in [(24, 144, (13, 11)), (40, 128, (7, 9)), (24, 48, (5, 5))]:
        m = Net(cin, cout).eval()
        x = torch.randn(2, cin, *hw)
        cm = cuvil.compile(m, (x,), layout="blocked", num_threads=2, target=target, cache_dir=str(tmp_path))
        # 8- and 4-float blocks hold 24 and 40 channels: there the input is blocked
        assert ("cuvil_conv_nchw_blocked(" in cm.c_source) == (cin % vector_floats(resolve_target(target)) != 0)
        with torch.no_grad():
            np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


def test_dynamic_batch_stays_blocked(tmp_path):
    import cuvil
    torch.manual_seed(0)
    m = _Bottlenecks().eval()
    x = torch.randn(2, 3, 33, 35)
    dyn = {"x": {0: torch.export.Dim("batch", min=1, max=5)}}
    cm = cuvil.compile(m, (x,), layout="blocked", dynamic_shapes=dyn, cache_dir=str(tmp_path))
    assert "cuvil_conv3x3_winograd_blocked" in cm.c_source and cm.c_source.count("cuvil_relayout(") == 1
    for n in (1, 5):
        xn = torch.randn(n, 3, 33, 35)
        with torch.no_grad():
            ref = [t.numpy() for t in m(xn)]
        for got, want in zip(cm.run(xn.numpy()), ref):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_small_mobilenet_blocked_matches_torch(tmp_path):
    """Inverted residuals: 1x1 expand, ReLU6 (a clip between convs), depthwise 3x3 (stride 1 and 2), 1x1
    project, residual adds as separate ops."""
    import cuvil

    def block(cin, cout, stride):
        h = cin * 4
        return torch.nn.Sequential(torch.nn.Conv2d(cin, h, 1), torch.nn.ReLU6(), torch.nn.Conv2d(h, h, 3, stride, 1, groups=h),
                                   torch.nn.BatchNorm2d(h), torch.nn.ReLU6(), torch.nn.Conv2d(h, cout, 1))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.a, self.b, self.c = torch.nn.Conv2d(3, 16, 3, 2, 1), block(16, 16, 1), block(16, 32, 2), block(32, 32, 1)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            x = x + self.a(x)
            x = self.b(x)
            return x + self.c(x)

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 3, 29, 30)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked")["passes"]
    assert text.count("relayout(") == 1 and f"groups=64, act=relu6, layout=nchw{vector_floats()}c" in text   # BN, ReLU6 fused
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=2, cache_dir=str(tmp_path))
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


def test_layout_option_is_checked():
    import cuvil
    conv, x = torch.nn.Conv2d(16, 16, 1), (torch.randn(1, 16, 4, 4),)
    with pytest.raises(ValueError, match="option layout='nhwc' is not one of auto, blocked, nchw, nchw4c, nchw8c, nchw16c"):
        cuvil.compile(conv, x, layout="nhwc")
    with pytest.raises(ValueError, match="option layout='nchw16c' needs vectors of 16 floats; target 'x86_64-avx2' has 8: "
                                         "use layout='blocked' \\(nchw8c here\\)"):
        cuvil.compile(conv, x, layout="nchw16c", target="x86_64-avx2")


class _MBConvSE(torch.nn.Module):
    """EfficientNet's / MobileNetV3's block: 1x1 expand, activation, depthwise, activation, squeeze and
    excitation (global mean, two 1x1 convs, a sigmoid or hardsigmoid gate, the map scaled per channel),
    1x1 project, residual; the network ends in a global pool and a classifier."""

    def __init__(self, act, gate):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.BatchNorm2d(16), act())
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(16, 48, 1), torch.nn.BatchNorm2d(48), act())
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(48, 48, 5, 1, 2, groups=48), torch.nn.BatchNorm2d(48), act())
        self.se = torch.nn.Sequential(torch.nn.Conv2d(48, 8, 1), torch.nn.SiLU(), torch.nn.Conv2d(8, 48, 1), gate())
        self.project = torch.nn.Sequential(torch.nn.Conv2d(48, 16, 1), torch.nn.BatchNorm2d(16))
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        h = self.dw(self.expand(x))
        h = h * self.se(h.mean((2, 3), keepdim=True))
        x = x + self.project(h)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


@pytest.mark.parametrize("act, gate, target", [(torch.nn.SiLU, torch.nn.Sigmoid, "native"),
                                               (torch.nn.Hardswish, torch.nn.Hardsigmoid, "native"),
                                               (torch.nn.SiLU, torch.nn.Sigmoid, "x86_64-sse2"),
                                               (torch.nn.Hardswish, torch.nn.Hardsigmoid, "x86_64-sse2")])
def test_squeeze_excitation_block_blocked_matches_torch(tmp_path, act, gate, target):
    import platform

    import cuvil
    if target == "x86_64-sse2" and platform.machine() != "x86_64":
        pytest.skip("x86_64-sse2 code runs on x86-64 hosts only")
    torch.manual_seed(0)
    m = _MBConvSE(act, gate).eval()
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 27, 30)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked", target=target)["passes"]
    blocked = f"nchw{vector_floats(resolve_target(target))}c"
    # the stem writes blocked; the SE's pool, its gate's scaling and the final pool read the map in place
    assert text.count("relayout(") == 0 and text.count(f"layout={blocked}") >= 4, text
    assert f"act={act.__name__.lower()}, layout={blocked}" in text           # the activations fused
    cm = cuvil.compile(m, (x,), layout="blocked", target=target, num_threads=2, cache_dir=str(tmp_path))
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pool", [torch.nn.AvgPool2d(1280, ceil_mode=True), torch.nn.AvgPool2d((7, 9)),
                                  torch.nn.AdaptiveAvgPool2d(1)])
def test_global_average_pool_reads_the_blocked_map(tmp_path, pool):
    """A pool whose one window covers the map (EfficientNet's 1280 x 1280 ceil-mode kernel) is a mean
    over (H, W), read from the blocked map without a relayout."""
    import cuvil
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1), torch.nn.SiLU(), torch.nn.Conv2d(32, 32, 3, padding=1), pool).eval()
    x = torch.randn(2, 16, 7, 9)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked")["passes"]
    assert "avg_pool" not in text and "reduce_mean" in text and text.count("relayout(") == 1, text   # the input's
    cm = cuvil.compile(m, (x,), layout="blocked", cache_dir=str(tmp_path))
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-5)


def test_grouped_convs_run_blocked_and_match_torch(tmp_path):
    """RegNet's / ResNeXt's grouped 3x3 convs (groups of 2 and 3 blocks, stride 1 and 2) run blocked, one
    GEMM per group, between dense 1x1 convs: no relayout inside the net."""
    import cuvil
    vf = vector_floats()
    torch.manual_seed(0)

    def unit(cin, cout, groups, stride):
        return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1), torch.nn.ReLU(),
                                   torch.nn.Conv2d(cout, cout, 3, stride, 1, groups=groups), torch.nn.ReLU(),
                                   torch.nn.Conv2d(cout, cout, 1))
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4 * vf, 3, 2, 1), unit(4 * vf, 4 * vf, 2, 1),
                            unit(4 * vf, 6 * vf, 3, 2), torch.nn.AdaptiveAvgPool2d(1)).eval()
    x = torch.randn(2, 3, 30, 27)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked")["passes"]
    assert "relayout(" not in text and text.count(f"layout=nchw{vf}c") == 7, text
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=2, cache_dir=str(tmp_path))
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


class _NarrowGroups(torch.nn.Module):
    """Grouped convs whose groups are narrower than a block (ResNeXt's 32 groups of 4 and 8 channels) between
    dense 1x1 convs: 3x3 at stride 1 and 2 (the 3-wide tiles), 3x3 dilated, 5x3 with uneven pads and a
    stride of 3 (the general tile), a residual and activations fused."""

    CASES = [(2, (3, 3), 1, 1, 1), (4, (3, 3), 1, 1, 1), (8, (3, 3), 2, 1, 1), (4, (3, 3), 1, 2, 2),
             (2, (5, 3), (3, 1), (2, 0), 1), (8, (3, 3), 2, 0, 1), (16, (3, 3), 1, 1, 1)]

    def __init__(self, c=32):
        super().__init__()
        self.inp = torch.nn.Conv2d(3, c, 1)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, c, k, s, p, d, groups=c // w) for w, k, s, p, d in self.CASES)
        self.outs = torch.nn.ModuleList(torch.nn.Conv2d(c, c, 1) for _ in self.CASES)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        ys = [o(torch.nn.functional.silu(conv(h)) if i % 2 else torch.relu(conv(h)))
              for i, (conv, o) in enumerate(zip(self.convs, self.outs))]
        return (*ys, self.outs[0](torch.relu(self.convs[1](h) + h)))


@pytest.mark.parametrize("hw", [(13, 29), (6, 7)])
@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
@pytest.mark.parametrize("whole_min_w", [0, 12])
def test_narrow_groups_run_blocked_and_match_torch(tmp_path, monkeypatch, target, hw, whole_min_w):
    """Groups narrower than a block (2, 4 and 8 channels) run blocked by lane permutes
    (kernels/grouped_blocked.c) at every vector width that has such groups, with no relayout inside the
    net; at odd maps (13 x 29: 8- and 4-pixel tiles, remainders and edges; 6 x 7: narrower than a tile).
    With the plan's grouped_direct_block_min_width set (whole_min_w), groups of exactly one block whose
    output rows are that wide take it too, each input channel broadcast."""
    import cuvil
    from cuvil.codegen.c import tuning
    skip_unless_host_runs(target)
    monkeypatch.setattr(tuning, "PLAN_TUNING", ())
    monkeypatch.setitem(tuning.PLAN_DEFAULTS, "grouped_direct_block_min_width", whole_min_w)
    torch.manual_seed(0)
    m = _NarrowGroups().eval()
    x = 3 * torch.randn(1, 3, *hw)
    block = vector_floats(target)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked", target=target)["passes"]
    assert text.count("relayout(") == len(m.CASES) + 1, text           # each output's only
    cm = cuvil.compile(m, (x,), layout="blocked", target=target, num_threads=2, cache_dir=str(tmp_path))
    def out_w(k, st, p, d):
        st, p = (st, st) if isinstance(st, int) else st, (p, p) if isinstance(p, int) else p
        return (hw[1] + 2 * p[1] - d * (k[1] - 1) - 1) // st[1] + 1

    # (the residual branch's conv is convs[1]'s, computed once)
    narrow = sum(w < block or (w == block and 0 < whole_min_w <= out_w(*case)) for w, *case in m.CASES)
    assert cm.c_source.count("cuvil_conv_grouped_blocked(") == narrow
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


class _GroupNorms(torch.nn.Module):
    """BiT's pre-activation unit: group norms (affine) of groups narrower than a block, one block and
    several blocks wide, between convs, with ReLU and a residual."""

    def __init__(self, c=32, groups=(16, 2, 1)):
        super().__init__()
        self.inp = torch.nn.Conv2d(3, c, 3, 1, 1)
        self.norms = torch.nn.ModuleList(torch.nn.GroupNorm(g, c) for g in groups)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, c, 3, 1, 1) for _ in groups)
        with torch.no_grad():
            for n in self.norms:
                n.weight.normal_()
                n.bias.normal_()

    def forward(self, x):
        h = self.inp(x)
        for norm, conv in zip(self.norms, self.convs):
            h = h + conv(torch.relu(norm(h)))
        return h


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_group_norms_stay_blocked_and_match_torch(tmp_path, target):
    """A group norm (the frontends' reshape -> layer_norm -> reshape, passes/simplify.group_norms) reads and
    writes the blocked map where its groups are whole blocks or divide one (kernels/norm.c
    cuvil_group_norm_blocked), so the convs around it stay blocked: 2, 16 and 32 channels a group at
    every vector width, batch 2, maps off the vector's multiples, means far from 0."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    m = _GroupNorms().eval()
    x = 4 + torch.randn(2, 3, 9, 11)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked", target=target)["passes"]
    assert text.count("group_norm(") == 3 and "layer_norm(" not in text and text.count("relayout(") == 1, text
    cm = cuvil.compile(m, (x,), layout="blocked", target=target, num_threads=2, cache_dir=str(tmp_path))
    assert cm.c_source.count("cuvil_group_norm_blocked(") == 3
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


class _GroupedWinograd(torch.nn.Module):
    """Grouped 3x3 stride-1 convs whose groups are whole channel blocks at 4, 8 and 16 floats (32, 48 and
    16 channels a group, 3 / 2 / 4 groups, outputs of 32 and 16 a group), with a residual and activations."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 96, 3, 1, 1)
        self.g3 = torch.nn.Conv2d(96, 96, 3, 1, 1, groups=3)
        self.g2 = torch.nn.Conv2d(96, 64, 3, 1, 1, groups=2)
        self.g4 = torch.nn.Conv2d(64, 64, 3, 1, 1, groups=4)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        y = torch.relu(self.g3(y) + y)
        return self.g4(torch.nn.functional.silu(self.g2(y)))


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
@pytest.mark.parametrize("hw,threads", [((13, 14), 2), ((7, 9), 2), ((7, 9), 3), ((13, 14), 1)])
def test_grouped_winograd_matches_torch(tmp_path, monkeypatch, target, hw, threads):
    """Grouped 3x3 convs run as Winograd products, one per group (kernels/winograd_blocked.c), F(4x4) on the
    13x14 map (partial tiles both ways; F(2x2) where the CPU's PLAN_TUNING row asks for more outputs) and
    F(2x2) on the 7x9 one, at every vector width. More than one
    thread takes whole groups, split into parts of tile rows where they do not share out evenly (3 groups
    on 2 threads, 2 and 4 on 3); one thread runs the products of every group after all the transforms.
    (Groups of one block keep Winograd here: the CPU's row of grouped_direct_block_min_width is left out.)"""
    import cuvil
    from cuvil.codegen.c import tuning
    skip_unless_host_runs(target)
    monkeypatch.setattr(tuning, "PLAN_TUNING",
                        tuple(r for r in tuning.PLAN_TUNING if r.knob != "grouped_direct_block_min_width"))
    torch.manual_seed(0)
    m = _GroupedWinograd().eval()
    x = torch.randn(2, 3, *hw)
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, target=target, cache_dir=str(tmp_path))
    from cuvil.codegen.c.tuning import plan_value
    m_tile = 4 if hw[0] * hw[1] >= plan_value("blocked_winograd4_min_outputs", target) else 2
    assert cm.c_source.count(f"cuvil_conv3x3_winograd_blocked(&s, {m_tile},") == 3
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-3, atol=1e-3)


class _ConvNeXtish(torch.nn.Module):
    """ConvNeXt's block: a 7x7 depthwise conv, permuted to channels-last for LayerNorm and an MLP, permuted
    back into the residual; twice, then a 2x2 stride-2 downsampling conv, at 11x13 (pixels no block fills)."""

    def __init__(self, c):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, 1, 1)
        self.dw = torch.nn.ModuleList(torch.nn.Conv2d(c, c, 7, 1, 3, groups=c) for _ in range(2))
        self.norm = torch.nn.ModuleList(torch.nn.LayerNorm(c) for _ in range(2))
        self.mlp = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(c, 4 * c), torch.nn.GELU(),
                                                           torch.nn.Linear(4 * c, c)) for _ in range(2))
        self.down = torch.nn.Conv2d(c, 2 * c, 2, 2)

    def forward(self, x):
        x = self.stem(x)
        for dw, norm, mlp in zip(self.dw, self.norm, self.mlp):
            x = x + mlp(norm(dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return self.down(x)


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_channels_last_mlp_reads_and_writes_blocked_maps(tmp_path, target):
    """The permutes around ConvNeXt's channels-last LayerNorm and MLP read and write the blocked maps
    themselves (cuvil_blocked_nhwc): no relayout but the output's, and the result equals torch's, batch 2."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    vf = vector_floats(resolve_target(target))
    m = _ConvNeXtish(2 * vf).eval()
    x = torch.randn(2, 3, 11, 13)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked", target=target)["passes"]
    blocked = f"nchw{vf}c"
    assert text.count(f"in_layout={blocked}, layout=nchw") == 2 and text.count(f"in_layout=nchw, layout={blocked}") == 2
    assert text.count("relayout(") == 1, text                          # the output's
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=2, target=target, cache_dir=str(tmp_path))
    assert cm.c_source.count("cuvil_blocked_nhwc(") == 4
    with torch.no_grad():
        np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


def test_blocked_transpose_checks_its_perm_and_channels():
    """transpose's in_layout / layout: only the NCHW <-> NHWC perms, of channels that fill blocks."""
    from cuvil.errors import ShapeError
    g = Graph()
    x = Value(TensorType((1, 32, 5, 5), "float32"), "x")
    with pytest.raises(ShapeError, match="in_layout=nchw16c takes perm"):
        g.add("transpose", [x], {"perm": (0, 3, 1, 2), "in_layout": "nchw16c"})
    y = Value(TensorType((1, 5, 5, 24), "float32"), "y")
    with pytest.raises(ShapeError, match="layout=nchw16c takes perm"):
        g.add("transpose", [y], {"perm": (0, 3, 1, 2), "layout": "nchw16c"})        # 24 channels
    with pytest.raises(ShapeError, match="unknown layout"):
        g.add("transpose", [x], {"perm": (0, 2, 3, 1), "in_layout": "nchw7c"})
    assert g.add("transpose", [x], {"perm": (0, 2, 3, 1), "in_layout": "nchw16c"}).shape == (1, 5, 5, 32)


class _DepthwiseBranches(torch.nn.Module):
    """One blocked map into depthwise convs of every filter size and stride the kernel's tiles claim, and
    the shapes that go pixel by pixel (dilation, a stride it has no tile for), each then a 1x1 conv."""
    CASES = [(3, 1, 1, 1), (3, 2, 1, 1), (5, 1, 2, 1), (5, 2, 2, 1), (7, 1, 3, 1), (3, 1, 0, 1), (3, 1, 2, 2),
             (7, 2, 3, 1), (3, 3, 1, 1),                 # (kernel, stride, pad, dilation)
             (3, 1, (2, 1), (2, 1)), (5, 1, (4, 2), (2, 1))]  # dilated along H only: tiled, filter rows clipped
    # the fused activations, in turn: the tiles' own ReLU and ReLU6, none, and the table's (hardswish, SiLU)
    ACTS = [torch.nn.functional.hardswish, torch.nn.functional.relu6, lambda t: t, torch.relu, torch.nn.functional.silu]

    def __init__(self, c):
        super().__init__()
        self.inp = torch.nn.Conv2d(3, c, 1)
        self.dws = torch.nn.ModuleList(torch.nn.Conv2d(c, c, k, s, p, d, groups=c) for k, s, p, d in self.CASES)
        self.outs = torch.nn.ModuleList(torch.nn.Conv2d(c, c, 1) for _ in self.CASES)
        self.res = torch.nn.Conv2d(c, c, 3, 1, 1, groups=c)

    def forward(self, x):
        h = self.inp(x)
        ys = [o(self.ACTS[i % len(self.ACTS)](dw(h))) for i, (dw, o) in enumerate(zip(self.dws, self.outs))]
        return (*ys, self.outs[0](torch.relu(self.res(h) + h)))


@pytest.mark.parametrize("hw", [(13, 29), (40, 41)])
@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_depthwise_tiles_and_edges_match_torch(tmp_path, target, hw):
    """The blocked depthwise kernel at odd maps (rows of 8-, 4- and 1-pixel tiles) for each (kernel,
    stride, pad, dilation) case, with a fused activation and a fused residual; blocks of 8 and of 4
    (AVX2, SSE2) on any x86 host. 13 x 29: each plane from a zero-padded copy, every pixel in tiles;
    40 x 41 (too large for the copy at 16 channels): the top and bottom rows tiled over the filter rows
    inside the map, the edge columns one by one over their clipped windows."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    m = _DepthwiseBranches(16).eval()
    x = 5 * torch.randn(1, 3, *hw)                   # sums past ReLU6's 6
    cm = cuvil.compile(m, (x,), layout="blocked", target=target, num_threads=2, cache_dir=str(tmp_path))
    assert cm.c_source.count("cuvil_depthwise_blocked(") == len(m.CASES) + 1
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_channel_concat_and_slice_in_whole_blocks_stay_blocked(tmp_path):
    """SqueezeNet's fire module (two expand convs concatenated along channels) and a channel split in
    whole blocks run on the blocked maps; a split inside a block relayouts."""
    import cuvil
    vf = vector_floats()

    class Fire(torch.nn.Module):
        def __init__(self, split):
            super().__init__()
            self.squeeze, self.split = torch.nn.Conv2d(4 * vf, 2 * vf, 1), split
            self.e1, self.e3 = torch.nn.Conv2d(2 * vf, 2 * vf, 1), torch.nn.Conv2d(2 * vf, 3 * vf, 3, padding=1)
            self.out = torch.nn.Conv2d(3 * vf, 2 * vf, 1)

        def forward(self, x):
            s = torch.relu(self.squeeze(x))
            y = torch.cat([torch.relu(self.e1(s)), torch.relu(self.e3(s))], 1)      # 5 blocks
            a, b = y[:, :self.split], y[:, self.split:self.split + 3 * vf]
            return self.out(b) + a[:, :2 * vf].mean() if self.split % vf == 0 else self.out(b)

    torch.manual_seed(0)
    x = torch.randn(2, 4 * vf, 11, 9)
    for split in (2 * vf, vf // 2):
        m = Fire(split).eval()
        text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked")["passes"]
        concat = re.search(r"%(\w+):[^=]+= concat", text).group(1)
        assert (f"slice(%{concat};" in text) == (split % vf == 0), text       # a slice inside a block: NCHW
        assert text.count("relayout(") == 2, text        # in whole blocks: x and the result; else x and the concat
        cm = cuvil.compile(m, (x,), layout="blocked", cache_dir=str(tmp_path))
        with torch.no_grad():
            np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


def test_reductions_over_channels_read_the_blocked_map(tmp_path):
    """CBAM-style spatial attention pools over channels (mean and max, dim 1): read in place."""
    import cuvil
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(16, 32, 1), torch.nn.Conv2d(32, 32, 3, padding=1)

        def forward(self, x):
            y = self.b(torch.relu(self.a(x)))
            return torch.cat([y.mean(1, keepdim=True), y.amax(1, keepdim=True)], 1), y.sum((0, 2, 3))

    m = Net().eval()
    x = torch.randn(2, 16, 7, 10)
    text = cuvil_api.inspect_stages(m, (x,), stages=("passes",), layout="blocked")["passes"]
    assert text.count("relayout(") == 1, text                     # the input's only
    cm = cuvil.compile(m, (x,), layout="blocked", cache_dir=str(tmp_path))
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_avx512_blocked_build_on_any_x86_host(tmp_path):
    """The 16-float blocked kernels (wide tiles, nchw16c) and a blocked net built with explicit AVX-512
    flags: what an AVX2 host can check of them; run against torch where the CPU has AVX-512."""
    import platform

    from cuvil import driver
    from cuvil.frontend import torch as torch_frontend
    from cuvil.options import make_options
    from cuvil.runtime.module import Module
    from cuvil.target import cpu_flags
    if platform.machine() != "x86_64":
        pytest.skip("x86_64-avx512 code is built on x86-64 hosts only")
    torch.manual_seed(0)
    m = _MBConvSE(torch.nn.SiLU, torch.nn.Sigmoid).eval()
    x = torch.randn(1, 3, 27, 30)
    graph = torch_frontend.from_exported(torch_frontend.export(m, (x,), None, None), None)[0]
    opts = make_options(target="x86_64-avx512", layout="blocked", cache_dir=str(tmp_path))
    path = driver.build_graph(graph, opts, tmp_path, driver.Progress(False), load=False)
    source = (path / "model.c").read_text()
    assert (path / "model.so").exists() and "CUVIL_BLOCK == 16" in source and "cuvil_depthwise_blocked" in source
    if "avx512f" in cpu_flags():
        with torch.no_grad():
            np.testing.assert_allclose(Module(path).run(x.numpy())[0], m(x).numpy(), rtol=1e-4, atol=1e-4)


def test_only_known_layouts_reach_generated_c():
    """A layout's block is rendered into C (a _Static_assert): any name outside LAYOUTS is refused, and
    the options accept only their listed choices."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import cuvil
    from cuvil.errors import CuvilError
    from cuvil.ir.ops.movement import LAYOUTS, layout_block
    from cuvil.options import LAYOUT_CHOICES

    @settings(max_examples=200, deadline=None)
    @given(st.one_of(st.text(), st.sampled_from(sorted(LAYOUT_CHOICES))))
    def check(name):
        if name in LAYOUTS:
            assert layout_block(name) in (0, 4, 8, 16)
        else:
            with pytest.raises(CuvilError, match="unknown layout"):
                layout_block(name)
        # "auto" and "blocked" are options the layout pass resolves to a name in LAYOUTS
        if name not in LAYOUT_CHOICES:
            with pytest.raises(ValueError, match="option layout="):
                cuvil.compile(torch.nn.Conv2d(16, 16, 1), (torch.randn(1, 16, 4, 4),), layout=name)
    check()


class _AveragePools(torch.nn.Module):
    """Average pools between blocked convs: PoolFormer's 3x3 stride 1 (x - pool(x)), DenseNet's 2x2 stride 2,
    and 3x3 stride 2 with pads, count_include_pad either way, ceil_mode's overhang."""

    POOLS = [dict(kernel_size=3, stride=1, padding=1, count_include_pad=False), dict(kernel_size=2, stride=2),
             dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=True),
             dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)]

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.pools = torch.nn.ModuleList(torch.nn.AvgPool2d(**p) for p in self.POOLS)
        self.outs = torch.nn.ModuleList(torch.nn.Conv2d(32, 32, 1) for _ in self.POOLS)

    def forward(self, x):
        h = self.inp(x)
        return tuple(o(p(h) - h if p.stride == 1 else p(h)) for p, o in zip(self.pools, self.outs))


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
@pytest.mark.parametrize("hw", [(13, 29), (6, 7)])
def test_average_pools_run_blocked_and_match_torch(tmp_path, target, hw):
    """Average pools of a blocked map run blocked (kernels/avg_pool_blocked.c), no relayout around them, at
    every vector width and odd maps."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    m = _AveragePools().eval()
    x = torch.randn(2, 3, *hw)
    cm = cuvil.compile(m, (x,), layout="blocked", target=target, num_threads=2, cache_dir=str(tmp_path))
    assert cm.c_source.count("cuvil_avg_pool_blocked(") == len(m.POOLS)
    assert cm.c_source.count("cuvil_relayout(") == len(m.POOLS)          # each output's only
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_pools_over_pixels_of_a_blocked_map_in_lanes(tmp_path, target):
    """Means, maxima and minima of a blocked map over its pixels, and a sum over the batch too, a block's
    channels accumulated side by side in partial rows (lower_reduce._kept_lanes): 35 pixels (no whole
    number of partial rows), and a NaN in one image's input pixel, which the pools of that image carry
    (maxima included) and the other image's do not."""
    import cuvil
    skip_unless_host_runs(target)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(8, 32, 1), torch.nn.Conv2d(32, 32, 3, padding=1)

        def forward(self, x):
            y = self.b(self.a(x))        # no ReLU: a fused one's select would turn the NaN into 0
            return y.mean((2, 3)), y.amax((2, 3)), y.amin((2, 3), keepdim=True), y.sum((0, 2, 3))

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 8, 5, 7)
    cm = cuvil.compile(m, (x,), layout="blocked", target=target, cache_dir=str(tmp_path))
    assert cm.c_source.count("part_[") >= 4
    x[1, :, 2, 3] = float("nan")
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    assert np.isnan(cm.run(x.numpy())[1][1]).all() and not np.isnan(cm.run(x.numpy())[1][0]).any()


@pytest.mark.parametrize("layout", ["blocked", "nchw"])
@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_max_pools_match_torch_nan_and_inf_included(tmp_path, target, layout):
    """Max pools at odd maps, for 2x2 and 3x3 windows at strides 1 and 2, with pads and ceil mode, and a
    5x5 window, as torch: a NaN in an input pixel reaches every output whose window holds it, and an inf
    wins. Blocked (kernels/blocked.c: rows in tiles of 8, 4 and 1 pixels where the windows lie inside the
    input, the edges window by window; its selects had dropped the NaN: a wrong answer) and NCHW
    (kernels/conv.c pool_row_strip: vectors of outputs, the last ones of a row stored in part)."""
    import cuvil
    skip_unless_host_runs(target)
    POOLS = [(3, 2, 1, False), (3, 2, 0, True), (2, 2, 0, False), (3, 1, 1, False), (2, 1, 0, True), (5, 2, 2, False)]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 32, 1)

        def forward(self, x):
            y = self.c(x)
            return tuple(torch.nn.functional.max_pool2d(y, k, s, p, ceil_mode=c) for k, s, p, c in POOLS)

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(1, 3, 29, 37)
    cm = cuvil.compile(m, (x,), layout=layout, target=target, cache_dir=str(tmp_path))
    kernel = "cuvil_max_pool_blocked(" if layout == "blocked" else "cuvil_pool2d("
    assert cm.c_source.count(kernel) == len(POOLS)
    x[0, :, 5, 9] = float("nan")                 # inside the tiled columns
    x[0, :, 0, 0] = float("nan")                 # a corner: the edge path
    x[0, 1, 12, 20] = float("inf")
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            want = want.numpy()
            assert np.isnan(want).any()
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(np.nan_to_num(got, posinf=1e30), np.nan_to_num(want, posinf=1e30), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", [torch.relu, torch.nn.functional.relu6])
@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_fused_relu_keeps_nan_as_torch(tmp_path, target, act):
    """A NaN in one input pixel reaches the outputs through blocked convs with fused ReLUs or ReLU6s (the
    GEMM tile's, Winograd's, the depthwise conv's) as it does in torch (the tiles' selects had turned it
    into 0; vmath.h's max and min keep it by their operand order)."""
    import cuvil
    skip_unless_host_runs(target)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(8, 32, 1)
            self.w = torch.nn.Conv2d(32, 32, 3, padding=1)                   # Winograd
            self.d = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)        # depthwise

        def forward(self, x):
            return act(self.d(act(self.w(act(self.a(x)))))).mean((2, 3))

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 8, 9, 10)
    cm = cuvil.compile(m, (x,), layout="blocked", target=target, cache_dir=str(tmp_path))
    assert [n.attrs.get("act") for n in cm.graph.nodes if n.op == "conv"] == [act.__name__.split(".")[-1]] * 3
    x[1, :, 4, 5] = float("nan")
    with torch.no_grad():
        want = m(x).numpy()
    got = cm.run(x.numpy())[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.isnan(got[1]).all() and not np.isnan(got[0]).any()


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_blocked_convs_split_by_rows_between_threads_match_torch(tmp_path, threads):
    """With several threads a blocked conv's pixels are split into a multiple of that many M blocks (fewer
    where the map has fewer row tiles): 1x1 convs at 7x7 (one block on one thread), 5x5 (fewer tiles than
    4 threads), 14x14 with a residual and a 3x3 conv, at 2, 3 and 4 threads, against torch."""
    import cuvil

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(64, 320, 1)
            self.b = torch.nn.Conv2d(320, 64, 1)
            self.c = torch.nn.Conv2d(64, 96, 3, padding=1)

        def forward(self, x):
            y = x + self.b(torch.relu(self.a(x)))
            return self.c(y)

    torch.manual_seed(0)
    m = Net().eval()
    for hw in (7, 5, 14):
        x = torch.randn(1, 64, hw, hw)
        cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, cache_dir=str(tmp_path))
        with torch.no_grad():
            want = m(x).numpy()
        np.testing.assert_allclose(cm.run(x.numpy())[0], want, rtol=1e-3, atol=1e-3)


def test_convs_into_channels_that_fill_no_block_end_the_blocked_region_in_nchw():
    """A conv of blocked input into channels that fill no block writes NCHW itself (into_nchw: 24 at
    blocks of 16, its padding to 32 a third more work) where its input is blocked; into 8 channels (twice
    the work at 16) it stays an NCHW conv after a relayout."""
    def graph(o):
        g = Graph()
        x = Value(TensorType((1, 16, 8, 8), "float32"), "x")
        g.inputs = [x]
        g.outputs = [_conv(g, g.add("relu", [_conv(g, _conv(g, x, 32), 32, 3)]), o)]
        return g
    g = layout.run(graph(24), "nchw16c")
    assert _ops(g) == [("relayout", "nchw16c"), ("conv", "nchw16c"), ("conv", "nchw16c"), ("relu", None), ("conv", "nchw")]
    assert g.nodes[-1].attrs["in_layout"] == "nchw16c"
    g = layout.run(graph(8), "nchw16c")
    assert _ops(g)[-2:] == [("relayout", "nchw"), ("conv", "nchw")] and g.nodes[-1].attrs.get("in_layout") in (None, "nchw")
    bf16 = graph(24)
    bf16.nodes[-1].attrs["bf16_act"] = 1                    # bf16 products write blocks only
    assert _ops(layout.run(bf16, "nchw16c"))[-2:] == [("relayout", "nchw"), ("conv", "nchw")]


class _IntoNchw(torch.nn.Module):
    """Convs of a blocked map (a chain of two blocked convs before them) into 37, 30 and 98 channels (no
    whole block of 16, 8 or 4 in any): a 1x1 one with a residual and ReLU6, a padded 3x3 stride-2 one
    (gathered) with SiLU (applied as the rows turn into NCHW), and a 1x1 one over 1040 channels (several K
    blocks) into 98 (at 16 floats, the wide tile's panel pair and a second panel group)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(32, 64, 1), torch.nn.Conv2d(64, 64, 3, padding=1)
        self.p, self.r = torch.nn.Conv2d(64, 37, 1), torch.nn.Conv2d(32, 37, 1)
        self.s, self.deep, self.d = torch.nn.Conv2d(64, 30, 3, 2, 1), torch.nn.Conv2d(64, 1040, 1), torch.nn.Conv2d(1040, 98, 1)

    def forward(self, x):
        a = torch.relu(self.a(x))
        b = torch.relu(self.b(a))
        return (torch.nn.functional.relu6(self.p(b) + self.r(x)), torch.nn.functional.silu(self.s(b)),
                self.d(torch.relu(self.deep(a))))


@pytest.mark.parametrize("target,hw,threads", [("native", (13, 11), 2), ("x86_64-avx512", (7, 9), 3), ("x86_64-avx2", (5, 6), 1),
                                               ("x86_64-sse2", (7, 9), 2)])
def test_convs_from_blocks_into_nchw_match_torch(tmp_path, target, hw, threads):
    """cuvil_conv_blocked_nchw_out against torch at each vector width, pixel counts with every row
    remainder, split between 1, 2 and 3 threads: the rows computed as whole blocks, then turned into NCHW
    with bias, residual and activation."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    m = _IntoNchw().eval()
    x = torch.randn(2, 32, *hw)
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, target=target, cache_dir=str(tmp_path))
    assert cm.c_source.count("cuvil_conv_blocked_nchw_out(") == 3
    with torch.no_grad():
        for got, want in zip(cm.run(x.numpy()), m(x)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
