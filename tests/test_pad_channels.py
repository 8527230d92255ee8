"""Channels padded to whole blocks (passes/pad_channels.py): which maps are widened, what each node around
them becomes, and nets of such channel counts compiled blocked against torch eager, infinities included."""
from __future__ import annotations

import numpy as np
import pytest

from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.ir.interpreter import run as run_graph
from cuvil.passes import layout, pad_channels

from .util import skip_unless_host_runs

torch = pytest.importorskip("torch", reason="the end-to-end cases compile torch modules")


def _conv(g, x, o, k=1, groups=1, act="none", residual=None):
    rng = np.random.default_rng(len(g.nodes))
    w = g.const(rng.standard_normal((o, x.shape[1] // groups, k, k)).astype(np.float32))
    b = g.const(rng.standard_normal(o).astype(np.float32))
    inputs = [x, w, b] + ([residual] if residual is not None else [])
    return g.add("conv", inputs, dict(pads=((k // 2, k // 2),) * 2, groups=groups, act=act))


def _se_block(g, x, c):
    """1x1 expand to c, depthwise 3x3, squeeze-and-excitation gate, 1x1 project back to x's channels."""
    e = _conv(g, x, c, act="hardswish")
    d = _conv(g, e, c, 3, groups=c, act="hardswish")
    s = _conv(g, _conv(g, g.add("reduce_mean", [d], dict(axes=(2, 3), keepdims=True)), 8, act="relu"), c)
    return _conv(g, g.add("mul", [d, g.add("hardsigmoid", [s])]), x.shape[1], residual=x)


def _graph(c, tail=None):
    g = Graph()
    x = Value(TensorType((1, 16, 9, 7), "float32"), "x")
    g.inputs = [x]
    y = _se_block(g, x, c)
    g.outputs = [tail(g, y) if tail else y]
    return g


def test_a_block_of_72_channels_is_widened_to_80_and_computes_the_same():
    g = _graph(72)
    x = np.random.default_rng(0).standard_normal((1, 16, 9, 7)).astype(np.float32)
    want = run_graph(g, x)[0]
    pad_channels.run(g, 16)
    g.verify()
    convs = [n for n in g.nodes if n.op == "conv"]
    assert [n.outputs[0].shape[1] for n in convs] == [80, 80, 8, 80, 16]
    assert [n.attrs.get("live_channels", 0) for n in convs] == [72, 0, 0, 72, 0]      # the two that write C
    assert convs[1].attrs["groups"] == 80 and convs[4].inputs[1].shape == (16, 80, 1, 1)
    np.testing.assert_allclose(run_graph(g, x)[0], want, rtol=1e-5, atol=1e-5)
    # and the layout pass now blocks the whole block: no relayout but at the graph's two ends
    ops = [n.op for n in layout.run(g, "nchw16c").nodes]
    assert ops.count("relayout") == 2


@pytest.mark.parametrize("c, block, widened", [(72, 16, True), (120, 16, True), (24, 16, False), (72, 8, False),
                                              (58, 4, True), (8, 16, False)])
def test_only_channel_counts_worth_padding_are_widened(c, block, widened):
    """24 -> 32 (a third more work) and 8 -> 16 are not worth it; 72 at blocks of 8 needs no padding."""
    g = pad_channels.run(_graph(c), block)
    assert (g.nodes[0].outputs[0].shape[1] != c) == widened


@pytest.mark.parametrize("tail", [
    lambda g, y: g.add("reshape", [y], dict(shape=(1, 72 * 30))),                   # a reshape reads the channels
    lambda g, y: g.add("reduce_sum", [y], dict(axes=(1,), keepdims=True)),     # a sum over them
    lambda g, y: g.add("div", [y, y]),                                         # 0 / 0 in the padding
])
def test_a_region_that_reaches_another_op_is_left_as_it_is(tail):
    """A region of 72-channel maps that reaches an op which would see the padding stays 72 wide."""
    g = Graph()
    x = Value(TensorType((1, 72, 6, 5), "float32"), "x")
    g.inputs = [x]
    y = _conv(g, _conv(g, x, 32, act="relu"), 72, 3, act="relu")
    g.outputs = [tail(g, y)]
    pad_channels.run(g, 16)
    assert all(n.outputs[0].shape[1] == 72 for n in g.nodes if n.op == "conv" and n.outputs[0].shape[1] != 32)


def test_a_depthwise_residual_from_outside_the_region_keeps_it_as_it_is():
    """A depthwise conv's fused residual is widened with its output or the region fails: here it is the
    graph's input, which cannot be."""
    g = Graph()
    x = Value(TensorType((1, 72, 6, 5), "float32"), "x")
    g.inputs = [x]
    d = _conv(g, _conv(g, x, 72, act="relu"), 72, 3, groups=72, residual=x)
    g.outputs = [_conv(g, d, 16)]
    pad_channels.run(g, 16)
    g.verify()
    assert [n.outputs[0].shape[1] for n in g.nodes] == [72, 72, 16]


def test_a_per_channel_constant_is_padded_only_where_the_region_reads_it():
    """One [1, 72, 1, 1] constant (cleanup merges equal small ones) scales a map inside a region and the
    graph's other input outside it: only the region's use takes the padded copy."""
    g = Graph()
    x, z = Value(TensorType((1, 16, 6, 5), "float32"), "x"), Value(TensorType((1, 72, 6, 5), "float32"), "z")
    g.inputs = [x, z]
    scale = g.const(np.linspace(0.5, 2, 72, dtype=np.float32).reshape(1, 72, 1, 1))
    e = g.add("mul", [_conv(g, _conv(g, x, 72, act="relu"), 72, 3, groups=72), scale])
    g.outputs = [_conv(g, e, 16), g.add("mul", [z, scale])]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    want = run_graph(g, *xs)
    pad_channels.run(g, 16)
    g.verify()
    assert [n.outputs[0].shape[1] for n in g.nodes] == [80, 80, 80, 16, 72]
    assert g.nodes[-1].inputs[1] is scale and g.nodes[2].inputs[1].shape == (1, 80, 1, 1)
    for got, w in zip(run_graph(g, *xs), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def test_graph_outputs_keep_their_channels():
    g = Graph()
    x = Value(TensorType((1, 16, 6, 5), "float32"), "x")
    g.inputs = [x]
    g.outputs = [_conv(g, _conv(g, x, 72, act="relu"), 72, 3, groups=72)]
    pad_channels.run(g, 16)
    assert [n.outputs[0].shape[1] for n in g.nodes] == [72, 72]


class _MBConv(torch.nn.Module):
    """MobileNetV3's block at channel counts no vector width holds whole (58, 90): expand, hardswish,
    depthwise (stride 1 or 2, 3x3 or 5x5), squeeze-and-excitation, project, residual; then again."""

    def __init__(self, cin=16):
        super().__init__()

        def block(c, e, k, s):
            return torch.nn.ModuleDict(dict(
                expand=torch.nn.Sequential(torch.nn.Conv2d(c, e, 1), torch.nn.Hardswish()),
                dw=torch.nn.Sequential(torch.nn.Conv2d(e, e, k, s, k // 2, groups=e), torch.nn.Hardswish()),
                se=torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(e, 8, 1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(8, e, 1), torch.nn.Hardsigmoid()),
                project=torch.nn.Conv2d(e, c, 1)))
        self.blocks = torch.nn.ModuleList([block(cin, 58, 3, 1), block(cin, 90, 5, 2)])

    def forward(self, x):
        for b in self.blocks:
            h = b["dw"](b["expand"](x))
            h = b["project"](h * b["se"](h))
            x = x + h if h.shape == x.shape else h
        return x


@pytest.mark.parametrize("target,threads", [("native", 2), ("x86_64-avx2", 1), ("x86_64-sse2", 3)])
def test_padded_blocks_match_torch(tmp_path, target, threads):
    """The widened blocks at each vector width (58 and 90 fill no block of 16, 8 or 4 but 90 -> 92 at 4),
    with the padding's zeroing in the blocked layout (the maps) and in NCHW (the gates), against torch;
    natively with a dynamic batch, run at 1 and 3 images."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    m = _MBConv().eval()
    x = torch.randn(2, 16, 13, 11)
    dyn = {"x": {0: torch.export.Dim("batch", min=1, max=4)}} if target == "native" else None
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, target=target, dynamic_shapes=dyn,
                       cache_dir=str(tmp_path))
    assert "cuvil_zero_channels(" in cm.c_source and "cuvil_depthwise_blocked" in cm.c_source
    for n in (1, 3) if dyn else (2,):
        xn = torch.randn(n, 16, 13, 11)
        with torch.no_grad():
            np.testing.assert_allclose(cm.run(xn.numpy())[0], m(xn).numpy(), rtol=1e-4, atol=1e-4)


def test_infinities_do_not_reach_real_channels_through_the_padding(tmp_path):
    """An input of -inf: the widened conv's zero filters make NaN of it in the padded channels (0 x -inf),
    which the zero weights after them would add to every real channel; zeroed as the conv writes them,
    the net's outputs are torch's (ReLU takes the real channels' -inf to 0)."""
    import cuvil

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(16, 72, 1)
            self.d = torch.nn.Conv2d(72, 72, 3, padding=1, groups=72)
            self.b = torch.nn.Conv2d(72, 16, 1)

        def forward(self, x):
            return self.b(torch.relu(self.d(torch.relu(self.a(x)))))

    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():
        m.a.weight.abs_()                   # -inf in every input channel: -inf in every real one
    x = torch.randn(1, 16, 9, 10)
    x[0, :, 2:4, 3:6] = -float("inf")
    cm = cuvil.compile(m, (x,), layout="blocked", cache_dir=str(tmp_path))
    assert "cuvil_zero_channels(" in cm.c_source
    with torch.no_grad():
        want = m(x).numpy()
    assert np.isfinite(want).all()
    np.testing.assert_allclose(cm.run(x.numpy())[0], want, rtol=1e-4, atol=1e-4)
