"""Squeeze-and-excitation blocks (passes/squeeze_excite.py): the squeeze's mean taken by the depthwise conv
before it, the gate folded into the 1x1 conv after it. Which nodes are rewritten, the graph's values through
the reference interpreter before and after, and nets of such blocks compiled channel-blocked against torch
eager: a batch whose images have gates of their own, projections into blocked output and into NCHW output
(24 channels), with a residual, depthwise convs that run a plane or a row at a time, at each vector width."""
from __future__ import annotations

import numpy as np
import pytest

from cuvil.errors import ShapeError
from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.ir.interpreter import run as run_graph
from cuvil.ir.ops import infer_types
from cuvil.passes import squeeze_excite, layout

from .util import skip_unless_host_runs

torch = pytest.importorskip("torch", reason="the end-to-end cases compile torch modules")


def _conv(g, x, o, k=1, groups=1, act="none"):
    rng = np.random.default_rng(len(g.nodes))
    w = g.const(rng.standard_normal((o, x.shape[1] // groups, k, k)).astype(np.float32))
    b = g.const(rng.standard_normal(o).astype(np.float32))
    return g.add("conv", [x, w, b], dict(pads=((k // 2, k // 2),) * 2, groups=groups, act=act))


def _se_graph(hw, c=32, out=32, batch=2, gated_also_out=False):
    """x -> 1x1 conv to c -> depthwise 3x3 -> gate (mean, two 1x1 convs, sigmoid) -> multiply -> 1x1 to out."""
    g = Graph()
    x = Value(TensorType((batch, 16, hw, hw), "float32"), "x")
    g.inputs = [x]
    d = _conv(g, _conv(g, x, c, act="relu"), c, 3, groups=c, act="relu")
    s = _conv(g, _conv(g, g.add("reduce_mean", [d], dict(axes=(2, 3), keepdims=True)), 8, act="relu"), c,
              act="sigmoid")
    gated = g.add("mul", [d, s])
    g.outputs = [_conv(g, gated, out)] + ([gated] if gated_also_out else [])
    return g


def _fold(g):
    return squeeze_excite.run(layout.run(g, "nchw16c"))


def test_the_mean_and_the_gate_are_taken_by_the_convs_and_compute_the_same():
    g = _se_graph(9)
    x = np.random.default_rng(0).standard_normal((2, 16, 9, 9)).astype(np.float32)
    want = run_graph(g, x)[0]
    _fold(g)
    g.verify()
    ops = [n.op for n in g.nodes]
    assert "mul" not in ops and "reduce_mean" not in ops
    dw = [n for n in g.nodes if n.op == "conv" and n.attrs["groups"] == 32][0]
    assert dw.attrs["mean_out"] == 1 and [v.shape for v in dw.outputs] == [(2, 32, 9, 9), (2, 32, 1, 1)]
    last = g.nodes[-2] if g.nodes[-1].op == "relayout" else g.nodes[-1]
    assert last.op == "conv" and len(last.inputs) == 5 and last.inputs[4].shape == (2, 32, 1, 1)
    np.testing.assert_allclose(run_graph(g, x)[0], want, rtol=1e-5, atol=1e-5)


def test_means_that_stay():
    """A mean over the channels too, one without keepdims, and one of a map no depthwise conv writes."""
    g = Graph()
    x = Value(TensorType((1, 16, 9, 9), "float32"), "x")
    g.inputs = [x]
    d = _conv(g, _conv(g, x, 32, act="relu"), 32, 3, groups=32)
    g.outputs = [g.add("reduce_mean", [d], dict(axes=(1, 2, 3), keepdims=True)),
                 g.add("reduce_mean", [d], dict(axes=(2, 3), keepdims=False)),
                 g.add("reduce_mean", [_conv(g, d, 32)], dict(axes=(2, 3), keepdims=True))]
    _fold(g)
    assert [n.op for n in g.nodes].count("reduce_mean") == 3
    assert all(len(n.outputs) == 1 for n in g.nodes if n.op == "conv")


@pytest.mark.parametrize("case", ["small map", "gated map used twice", "not per channel"])
def test_multiplies_that_stay(case):
    """A 5x5 map into 32 channels (25 pixels, fewer than a panel of 32 filters: scaling them costs more than
    the multiply), a gated map that another node reads, a multiply of two maps."""
    if case == "not per channel":
        g = Graph()
        x = Value(TensorType((1, 16, 9, 9), "float32"), "x")
        g.inputs = [x]
        a = _conv(g, x, 32, act="relu")
        g.outputs = [_conv(g, g.add("mul", [a, _conv(g, a, 32, 3, groups=32)]), 32)]
    else:
        g = _se_graph(5 if case == "small map" else 9, gated_also_out=case == "gated map used twice")
    _fold(g)
    assert "mul" in [n.op for n in g.nodes]
    assert all(len(n.inputs) <= 4 for n in g.nodes if n.op == "conv")


def test_a_gate_of_the_wrong_shape_is_a_shape_error():
    x, w = TensorType((2, 32, 9, 9), "float32"), TensorType((16, 32, 1, 1), "float32")
    attrs = dict(strides=(1, 1), pads=((0, 0), (0, 0)), dilations=(1, 1), groups=1, act="none")
    infer_types("conv", [x, w, None, None, TensorType((2, 32, 1, 1), "float32")], attrs)
    for bad in [(2, 16, 1, 1), (3, 32, 1, 1), (2, 32, 9, 9), (2, 32)]:
        with pytest.raises(ShapeError, match="gate"):
            infer_types("conv", [x, w, None, None, TensorType(bad, "float32")], attrs)


class _SEBlock(torch.nn.Module):
    """EfficientNet's block: 1x1 expand with SiLU, depthwise 3x3 with SiLU, squeeze-and-excitation (sigmoid
    or MobileNetV3's hardsigmoid), 1x1 project, the input added back where the channels match."""

    def __init__(self, c, e, out, gate, stride=1):
        super().__init__()
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(c, e, 1), torch.nn.SiLU())
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(e, e, 3, stride, 1, groups=e), torch.nn.SiLU())
        self.se = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(e, 8, 1), torch.nn.SiLU(),
                                      torch.nn.Conv2d(8, e, 1), gate())
        self.project = torch.nn.Conv2d(e, out, 1)

    def forward(self, x):
        h = self.dw(self.expand(x))
        h = self.project(h * self.se(h))
        return x + h if h.shape == x.shape else h


@pytest.mark.parametrize("target, threads, out, gate, stride", [
    ("native", 2, 32, torch.nn.Sigmoid, 1), ("native", 2, 24, torch.nn.Sigmoid, 1),
    ("native", 2, 32, torch.nn.Hardsigmoid, 1), ("native", 2, 24, torch.nn.Sigmoid, 2),
    ("x86_64-avx2", 1, 24, torch.nn.Sigmoid, 2), ("x86_64-sse2", 3, 32, torch.nn.Hardsigmoid, 1)])
def test_squeeze_and_excitation_blocks_match_torch(tmp_path, target, threads, out, gate, stride):
    """Into 32 channels with the residual (blocked output) and into 24 (NCHW output: cuvil_conv_blocked_nchw_out
    with the scaled filters); the depthwise conv a plane at a time (stride 1) or a row at a time (a 3x3 stride
    2 on a larger map) with the rows' sums; natively with a dynamic batch, each image with its own gate."""
    import cuvil
    skip_unless_host_runs(target)
    torch.manual_seed(0)
    m = _SEBlock(32, 64, out, gate, stride).eval()
    hw = (15, 13) if stride == 1 else (37, 41)
    x = torch.randn(2, 32, *hw)
    dyn = {"x": {0: torch.export.Dim("batch", min=1, max=4)}} if target == "native" else None
    cm = cuvil.compile(m, (x,), layout="blocked", num_threads=threads, target=target, dynamic_shapes=dyn,
                       cache_dir=str(tmp_path))
    assert "cuvil_conv_blocked_gated(" in cm.c_source and "cuvil_depthwise_blocked_mean(" in cm.c_source
    for n in (1, 3) if dyn else (2,):
        xn = torch.randn(n, 32, *hw)
        with torch.no_grad():
            np.testing.assert_allclose(cm.run(xn.numpy())[0], m(xn).numpy(), rtol=1e-4, atol=1e-4)
