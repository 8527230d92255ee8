"""Batched CNNs run image by image (passes/batch_map.py, codegen/c/lower_batch_map.py): which prefix the
pass takes, and the compiled network against torch eager and the reference interpreter at batch sizes
and thread counts that take each of the C code's two ways (one image a thread; one image at a time
with every thread inside each layer), plus a fuzz of graphs that mix per-image ops with ops coupling
the images."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import cuvil
from cuvil.ir import interpreter
from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.passes import batch_map

from .util import check_graph


@pytest.fixture(autouse=True)
def small_batches_too(monkeypatch):
    """These graphs are small: split them whatever the size of their maps (MIN_BYTES is tested below)."""
    monkeypatch.setattr(batch_map, "MIN_BYTES", 0)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv(g, rng, x, cout, k=1, act="relu"):
    y = g.add("conv", [x, g.const(f32(rng, cout, x.type.shape[1], k, k) * 0.3), g.const(f32(rng, cout))],
              {"strides": [1, 1], "pads": [(k // 2, k // 2), (k // 2, k // 2)]})
    return g.add(act, [y]) if act else y


def cnn_graph(batch, tail="classifier"):
    rng = np.random.default_rng(batch)
    g = Graph()
    x = Value(TensorType((batch, 8, 10, 10), "float32"), "x")
    g.inputs = [x]
    y = conv(g, rng, conv(g, rng, x, 16, 3), 16)
    pooled = g.add("reduce_mean", [y], {"axes": [2, 3], "keepdims": False})
    if tail == "classifier":
        out = g.add("matmul", [pooled, g.const(f32(rng, 16, 5))])
    else:                                                    # couples the images: a mean over the batch
        out = g.add("reduce_mean", [pooled], {"axes": [0], "keepdims": True})
    g.outputs = [out]
    return g, [f32(rng, batch, 8, 10, 10)]


def test_the_prefix_stops_at_the_classifier():
    g, inputs = cnn_graph(3)
    expected = interpreter.run(copy.deepcopy(g), *inputs)
    out = batch_map.run(g)
    assert [n.op for n in out.nodes] == ["batch_map", "matmul"]
    body = out.nodes[0].attrs["body_graph"]
    assert [n.op for n in body.nodes] == ["conv", "relu", "conv", "relu", "reduce_mean"]
    assert body.inputs[0].type.shape == (1, 8, 10, 10) and out.nodes[0].outputs[0].type.shape == (3, 16)
    out.verify()
    np.testing.assert_allclose(interpreter.run(out, *inputs)[0], expected[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["one image", "small maps", "no conv", "batch mean"])
def test_graphs_left_batched(case, monkeypatch):
    """Batch 1; maps under MIN_BYTES (3 x 16 x 10 x 10 floats: 19 KB); a graph whose prefix has no conv;
    a conv net whose every node but the last is per image takes the prefix, and the mean over dim 0
    stays outside."""
    if case == "small maps":
        monkeypatch.setattr(batch_map, "MIN_BYTES", 19201)
        g, _ = cnn_graph(3)
        assert [n.op for n in batch_map.run(g).nodes][0] == "conv"
        monkeypatch.setattr(batch_map, "MIN_BYTES", 19200)
        assert [n.op for n in batch_map.run(g).nodes][0] == "batch_map"
    elif case == "one image":
        g, _ = cnn_graph(1)
        assert [n.op for n in batch_map.run(g).nodes][0] == "conv"
    elif case == "no conv":
        g = Graph()
        x = Value(TensorType((4, 6), "float32"), "x")
        g.inputs = [x]
        g.outputs = [g.add("relu", [g.add("matmul", [x, g.const(np.ones((6, 3), np.float32))])])]
        assert [n.op for n in batch_map.run(g).nodes] == ["matmul", "relu"]
    else:
        g, inputs = cnn_graph(4, tail="batch mean")
        cm = check_graph(g, inputs)
        assert cm.module.manifest["node_ops"] == ["batch_map", "reduce_mean"]


@pytest.mark.parametrize("coupling", ["transpose", "softmax"])
def test_ops_over_dim_0_keep_their_batch_shape_and_stay_out(coupling):
    """A transpose of images and channels when there are as many of each, and a softmax over the images:
    their outputs look batched ([4, ...]) but mix the images, so the prefix ends before them."""
    rng = np.random.default_rng(7)
    g = Graph()
    x = Value(TensorType((4, 3, 5, 5), "float32"), "x")
    g.inputs = [x]
    y = conv(g, rng, x, 4, 3)
    z = g.add("transpose", [y], {"perm": [1, 0, 2, 3]}) if coupling == "transpose" else \
        g.add("softmax", [y], {"axis": 0})
    g.outputs = [conv(g, rng, z, 4)]
    cm = check_graph(g, [f32(rng, 4, 3, 5, 5)])
    assert cm.module.manifest["node_ops"][:2] == ["batch_map", coupling]


class Block(nn.Module):
    """Stem, max pool, a residual block with squeeze-and-excitation, a channel shuffle, a concat,
    a channels-last layer norm and a classifier: each kind of node the pass takes."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.conv1 = nn.Conv2d(16, 16, 3, 1, 1)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), nn.ReLU(), nn.Conv2d(4, 16, 1),
                                nn.Hardsigmoid())
        self.branch = nn.Conv2d(16, 8, 1)
        self.norm = nn.LayerNorm(24)
        self.head = nn.Linear(24, 10)

    def forward(self, x):
        x = self.stem(x)
        y = torch.relu(self.conv1(x))
        x = x + y * self.se(y)
        n, c, h, w = x.shape
        x = x.reshape(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)      # channel shuffle
        x = torch.cat([x, torch.relu(self.branch(x))], 1)
        x = self.norm(x.permute(0, 2, 3, 1)).mean((1, 2))
        return self.head(x)


@pytest.mark.parametrize("batch", [2, 3, 6])
def test_network_matches_torch_at_every_thread_count(batch):
    """Batch 2 and 6 take one image a thread at 2 threads (6 at 3 too); batch 3 runs two images side by
    side and then the third with both threads inside (2 at 3 threads: both side by side on two), and
    every batch at 1 thread one image at a time."""
    torch.manual_seed(batch)
    model = Block().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(batch, 3, 96, 96)          # a millisecond an image: the threads do run side by side
    with torch.no_grad():
        expected = model(x).numpy()
    cm = cuvil.compile(model, (x,), num_threads=1)
    assert cm.module.manifest["node_ops"][0] == "batch_map"
    for threads in (1, 2, 3):
        cm.set_num_threads(threads)
        for _ in range(3):                                   # the shared image counter starts again
            np.testing.assert_allclose(np.asarray(cm(x)), expected, rtol=1e-4, atol=1e-4)


def _random_node(g, rng, pool, batch):
    """One node on a random value: per-image ops, or ops that couple the images (an axis of 0)."""
    x = pool[int(rng.integers(len(pool)))]
    rank = len(x.type.shape)
    kind = rng.choice(["conv", "act", "add", "reduce", "softmax", "transpose", "concat", "reshape"])
    if kind == "conv" and rank == 4:
        return conv(g, rng, x, int(rng.choice([4, 8, 16])), int(rng.choice([1, 3])))
    if kind == "add":
        same = [v for v in pool if v.type.shape == x.type.shape]
        return g.add("add", [x, same[int(rng.integers(len(same)))]])
    if kind == "reduce" and rank == 4:
        return g.add("reduce_sum", [x], {"axes": [int(rng.integers(rank))], "keepdims": True})
    if kind == "softmax":
        return g.add("softmax", [x], {"axis": int(rng.integers(rank))})
    if kind == "transpose" and rank == 4:
        return g.add("transpose", [x], {"perm": [int(p) for p in rng.permutation(rank)]})
    if kind == "concat":
        return g.add("concat", [x, x], {"axis": int(rng.integers(rank))})
    if kind == "reshape" and rank == 4:
        n, c, h, w = x.type.shape
        shape = [n, c * h, w, 1] if rng.random() < 0.5 else [n * c, h, w, 1]
        return g.add("reshape", [x], {"shape": shape})
    return g.add("relu", [x])


@pytest.mark.parametrize("seed", range(10))
def test_fuzz_graphs_mixing_per_image_and_coupling_ops(seed):
    """Fuzz: random chains after a first conv (so the pass has a prefix to take), with reductions,
    softmaxes, concats, transposes and reshapes over any axis, dim 0 included: whatever prefix the
    pass takes, the compiled graph equals the reference interpreter's on the original."""
    rng = np.random.default_rng(200 + seed)
    batch = int(rng.choice([2, 3, 4, 6]))        # 4 and 6: as many as some values' channels or rows
    g = Graph()
    x = Value(TensorType((batch, 4, 6, 6), "float32"), "x")
    g.inputs = [x]
    pool = [conv(g, rng, x, 8, 3)]
    for _ in range(int(rng.integers(3, 9))):
        pool.append(_random_node(g, rng, pool, batch))
    read = {id(i) for n in g.nodes for i in n.inputs}
    g.outputs = [v for v in pool if id(v) not in read]      # every leaf: no node is dead code
    cm = check_graph(g, [f32(rng, batch, 4, 6, 6)], rtol=1e-4, atol=1e-4)
    cm.set_num_threads(2)
    expected = cm.run(f32(np.random.default_rng(seed), batch, 4, 6, 6))
    cm.set_num_threads(1)
    for e, got in zip(expected, cm.run(f32(np.random.default_rng(seed), batch, 4, 6, 6))):
        np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-5)


def test_dynamic_batch_runs_as_many_images_as_each_call_brings():
    """A batch dim of 1 .. 8: the body loops over the call's images (S_batch in C), one a thread where
    they divide among the threads, and a batch of 1 runs the body once."""
    torch.manual_seed(3)
    model = Block().eval()
    x = torch.randn(4, 3, 48, 48)
    cm = cuvil.compile(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    assert cm.module.manifest["node_ops"][0] == "batch_map"
    for threads in (1, 2):
        cm.set_num_threads(threads)
        for batch in (1, 2, 5, 8):
            xb = torch.randn(batch, 3, 48, 48)
            with torch.no_grad():
                expected = model(xb).numpy()
            np.testing.assert_allclose(np.asarray(cm(xb)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("calibrated", [True, False])
def test_int8_network_per_image_equals_batched(calibrated, monkeypatch, tmp_path):
    """precision="int8": calibrated, integer convs pass bytes to the next (int8_out / int8_in) and the
    prefix never ends between two of them; uncalibrated, each image takes its own range. Image by image
    and batched (MIN_BYTES out of reach) give the same outputs, and both stay within int8's error of
    torch."""
    torch.manual_seed(11)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(),
                          nn.Conv2d(32, 64, 1), nn.ReLU(), nn.Conv2d(64, 32, 3, 2, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    x = torch.randn(4, 3, 24, 24)
    with torch.no_grad():
        expected = model(x).numpy()
    calibration = [torch.randn(4, 3, 24, 24)] if calibrated else None
    outs = {}
    for split in (True, False):
        monkeypatch.setattr(batch_map, "MIN_BYTES", 0 if split else 1 << 62)
        cm = cuvil.compile(model, (x,), precision="int8", calibration_data=calibration,
                           cache_dir=tmp_path / str(split))         # (the source cache would give the first)
        assert (cm.module.manifest["node_ops"][0] == "batch_map") == split
        for threads in (1, 2):
            cm.set_num_threads(threads)
            outs[split, threads] = np.asarray(cm(x))
    scale = float(np.abs(expected).max())
    for key, got in outs.items():
        np.testing.assert_allclose(got, outs[False, 1], rtol=1e-5, atol=1e-5 * scale)
        assert float(np.abs(got - expected).max()) < 0.05 * scale, key


def test_prefix_never_ends_between_convs_that_pass_bytes():
    """conv1 stores its output as conv2's input bytes (calibrated int8), and a mean over the images sits
    between them in the node order, so the prefix would end after conv1 with its bytes as an output of
    the region: it ends before conv1 instead (here: nothing left to take)."""
    from .util import compile_graph
    rng = np.random.default_rng(5)
    g = Graph()
    x = Value(TensorType((3, 32, 24, 24), "float32"), "x")
    g.inputs = [x]
    y = conv(g, rng, x, 32)
    mean = g.add("reduce_mean", [x], {"axes": [0], "keepdims": True})
    g.outputs = [conv(g, rng, y, 32, 3), mean]
    inputs = [f32(rng, 3, 32, 24, 24)]
    expected = interpreter.run(copy.deepcopy(g), *inputs)
    cm = compile_graph(g, precision="int8", calibration_data=[[f32(rng, 3, 32, 24, 24)]])
    linked = "int8_out" in str(cm.graph) if cm.graph is not None else False
    if linked:
        assert cm.module.manifest["node_ops"][0] != "batch_map"
    got = cm.run(*inputs)
    scale = float(np.abs(expected[0]).max())
    assert float(np.abs(got[0] - expected[0]).max()) < 0.05 * scale
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)


def test_hostile_onnx_names_through_the_per_image_body(tmp_path):
    """Trust boundary: an ONNX conv net whose node, value and dynamic-dim names and doc strings are C
    attacks, split image by image (the body's comments carry its nodes' locations, the loop bound the
    batch's name): the attack reaches the C code only inside comments and literals, runs nothing, and
    the answer is ONNX Runtime's."""
    pytest.importorskip("onnx", reason="builds an ONNX model with hostile names")
    ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")
    from onnx import TensorProto, helper, numpy_helper

    from .test_codegen_escaping import _code_only
    canary = tmp_path / "pwned"
    attack = f'*/ system("touch {canary}"); /*'
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(f32(rng, 8, 3, 3, 3) * 0.3, name="w" + attack)
    nodes = [helper.make_node("Conv", ["x" + attack, w.name], ["c\n" + attack], name=attack, doc_string=attack,
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c\n" + attack], ["y%n" + attack], name="??/" + attack)]
    dim = 'b"' + attack
    g = helper.make_graph(nodes, attack, [helper.make_tensor_value_info("x" + attack, TensorProto.FLOAT, [dim, 3, 12, 12])],
                          [helper.make_tensor_value_info("y%n" + attack, TensorProto.FLOAT, [dim, 8, 12, 12])],
                          initializer=[w], doc_string=attack)
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    feed = f32(rng, 3, 3, 12, 12)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x" + attack: feed})[0]
    cm = cuvil.compile(data, dynamic_shapes={"x" + attack: {0: ("batch", 1, 4)}})
    assert "batch_map" in cm.module.manifest["node_ops"]
    assert "system" not in _code_only(cm.c_source)           # only ever inside comments and literals
    for threads in (1, 2):
        cm.set_num_threads(threads)
        np.testing.assert_allclose(cm.run(feed)[0], want, rtol=1e-4, atol=1e-4)
    assert not canary.exists()
