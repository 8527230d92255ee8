"""The layout pass (passes/layout.py): which convs and pools turn channel-blocked, where the relayouts
go, and whole nets compiled blocked against torch eager. The blocked kernels themselves are checked op
by op against the interpreter in test_ops.py ("relayout" case)."""
from __future__ import annotations

import numpy as np
import pytest

from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.passes import layout

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
    ops = _ops(layout.run(g))
    assert ops == [("relayout", "nchw16c"), ("conv", "nchw16c"), ("conv", "nchw16c"), ("max_pool", "nchw16c"),
                   ("conv", "nchw16c"), ("relayout", "nchw"), ("relu", None)]


def test_lone_and_unblockable_convs_stay_nchw():
    g = Graph()
    x = Value(TensorType((1, 3, 8, 8), "float32"), "x")
    g.inputs = [x]
    stem = _conv(g, x, 16, 3)                        # 3 input channels: not a multiple of 16
    odd = _conv(g, g.add("relu", [stem]), 24)        # 24 filters
    lone = _conv(g, g.add("relu", [odd]), 32)        # blockable, but no blocked neighbour
    g.outputs = [lone]
    assert all(lay in ("nchw", None) for _, lay in _ops(layout.run(g)))


def test_blocked_output_and_shared_value_get_one_relayout_each():
    g = Graph()
    x = Value(TensorType((2, 16, 6, 6), "float32"), "x")
    g.inputs = [x]
    a = _conv(g, x, 16)
    b = _conv(g, a, 16, 3)
    c = g.add("add", [a, b])                          # an NCHW consumer of two blocked values
    g.outputs = [b, c]
    out = layout.run(g)
    relayouts = [n for n in out.nodes if n.op == "relayout"]
    assert [n.attrs["to"] for n in relayouts] == ["nchw16c", "nchw", "nchw"]
    assert out.outputs[0].producer.op == "relayout" and out.nodes[-1].op == "add"


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


@pytest.mark.parametrize("threads, target", [(1, "native"), (2, "native"), (2, "x86_64-avx2")])
def test_small_resnet_blocked_matches_torch(tmp_path, threads, target):
    """On AVX2 the blocked kernels run 8-float vectors (two per block of 16) and 6-row tiles."""
    import cuvil
    from cuvil.build.toolchain import cpu_flags
    if target != "native" and "avx2" not in cpu_flags():
        pytest.skip(f"this CPU cannot run {target} code")
    torch.manual_seed(0)
    m = _Bottlenecks().eval()
    for mod in m.modules():                        # BN statistics away from identity, so folding matters
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 61, 58)
    cm = cuvil.compile(m, (x,), layout="nchw16c", num_threads=threads, target=target, cache_dir=str(tmp_path))
    text = cuvil.api.inspect_stages(m, (x,), stages=("passes",), layout="nchw16c")["passes"]
    assert text.count("layout=nchw16c") >= 10 and text.count("relayout(") == 2    # after the stem, at the end
    with torch.no_grad():
        ref = [t.numpy() for t in m(x)]
    for got, want in zip(cm.run(x.numpy()), ref):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_layout_option_is_checked():
    import cuvil
    with pytest.raises(ValueError, match="option layout='nhwc' is not one of auto, nchw, nchw16c"):
        cuvil.compile(torch.nn.Conv2d(16, 16, 1), (torch.randn(1, 16, 4, 4),), layout="nhwc")
