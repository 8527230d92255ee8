"""The ONNX frontend: torch -> ONNX -> cuvil agrees with torch -> cuvil, ONNX-Runtime-style sessions,
dynamic dims, external data, unsupported-op reports, and hostile / malformed files."""
from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.frontend import onnx as fo

RTOL = ATOL = 1e-4


def export(model, args, path=None, opset=17, dynamic_axes=None, names=None, dynamo=False):
    buf = io.BytesIO()
    in_names = names or [f"in{i}" for i in range(len(args))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:      # the torch.export-based exporter (onnxscript): models the TorchScript one cannot trace
            prog = torch.onnx.export(model.eval(), tuple(args), dynamo=True, opset_version=18, input_names=in_names,
                                     verbose=False)
            buf.write(prog.model_proto.SerializeToString())
        else:
            torch.onnx.export(model.eval(), tuple(args), buf, dynamo=False, opset_version=opset,
                              input_names=in_names, dynamic_axes=dynamic_axes)
    data = buf.getvalue()
    if path is not None:
        path.write_bytes(data)
        return path
    return data


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2, groups=2)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        x = torch.nn.functional.hardswish(self.c2(x))
        x = self.pool(x)
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return torch.softmax(self.fc(x), -1)


class Block(torch.nn.Module):
    """A pre-norm transformer block with a causal mask."""

    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.reshape(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-1, -2) / (C // self.h) ** 0.5
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.ff(self.ln2(x))


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("make,shape", [(SmallCNN, (2, 3, 16, 16)), (Block, (2, 6, 32))], ids=["cnn", "block"])
def test_onnx_matches_torch_frontend(tmp_path, make, shape):
    torch.manual_seed(0)
    m = make().eval()
    if isinstance(m, SmallCNN):     # non-trivial batch norm statistics
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(*shape)
    path = export(m, (x,), tmp_path / "m.onnx")
    from_onnx = cuvil.compile(str(path), verify=True)
    from_torch = cuvil.compile(m, (x,))
    with torch.no_grad():
        ref = m(x).numpy()
    got = from_onnx(x.numpy())
    _close(got, ref)
    _close(got, from_torch(x.numpy()))
    assert from_onnx.report["verify"][0][0] < 1e-4


def test_bert_small_from_transformers(tmp_path):
    transformers = pytest.importorskip("transformers", reason="the BERT model comes from its config")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    m = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    class Wrap(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    try:
        data = export(Wrap(m), (ids, mask), names=["input_ids", "attention_mask"], opset=17)
    except Exception as e:  # noqa: BLE001 - exporter limitations are not cuvil's
        pytest.skip(f"torch.onnx.export cannot export BertModel here: {e}")
    cm = cuvil.compile(data)
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=mask)
    got = cm.run(ids.numpy(), mask.numpy())
    _close(got[0], ref.last_hidden_state.numpy())
    _close(got[1], ref.pooler_output.numpy())


def _mlp_model(batch="N"):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 3)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["logits"], name="mm2"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="sm")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3]),
                           helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, feed):
    ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def test_inference_session_api(tmp_path):
    model = _mlp_model()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    sess = cuvil.InferenceSession(str(path), dynamic_shapes={"x": {0: ("N", 1, 64)}})
    ins, outs = sess.get_inputs(), sess.get_outputs()
    assert [(i.name, i.shape, i.type) for i in ins] == [("x", ["N", 8], "tensor(float)")]
    assert [o.name for o in outs] == ["probs", "logits"]
    assert outs[0].type == "tensor(float)" and outs[0].shape == ["N", 3]
    for n in (1, 5):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        ref = _ort(model, {"x": x})
        got = sess.run(None, {"x": x})
        for a, b in zip(got, ref):
            _close(a, b)
        (only,) = sess.run(["logits"], {"x": x})
        _close(only, ref[1])
    with pytest.raises(cuvil.ShapeError, match="missing input"):
        sess.run(None, {})
    with pytest.raises(cuvil.ShapeError, match="unknown output"):
        sess.run(["nope"], {"x": x})
    with pytest.raises(cuvil.ShapeError, match="outside"):
        sess.run(None, {"x": np.zeros((65, 8), np.float32)})


def test_session_on_saved_artifact_imports_only_numpy(tmp_path):
    model = _mlp_model(batch=4)
    cm = cuvil.compile(model)
    art = cm.save(tmp_path / "mlp.cuvil")
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    expect = _ort(model, {"x": x})
    np.save(tmp_path / "ref.npy", expect[0])
    code = textwrap.dedent(f"""
        import sys, numpy as np, cuvil
        sess = cuvil.InferenceSession({str(art)!r}, num_threads=1)
        out = sess.run(None, {{"x": np.load({str(tmp_path / 'x.npy')!r})}})
        assert [o.name for o in sess.get_outputs()] == ["probs", "logits"], sess.get_outputs()
        np.testing.assert_allclose(out[0], np.load({str(tmp_path / 'ref.npy')!r}), rtol=1e-4, atol=1e-4)
        bad = [m for m in sys.modules if m.split(".")[0] in ("torch", "onnx", "onnxruntime", "sympy")
               or m.startswith(("cuvil.frontend", "cuvil.api", "cuvil.ir", "cuvil.codegen"))]
        assert not bad, bad
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_dim_param_symbolic_and_shape_subgraph():
    """Shape->Gather->Unsqueeze->Concat->Reshape folds into a symbolic reshape."""
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([-1, 4], np.int64), "tail")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             helper.make_node("Concat", ["b1", "tail"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y0"]),
             helper.make_node("Tanh", ["y0"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [X], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                            inits), opset_imports=[helper.make_opsetid("", 17)])
    g = fo.to_graph(m, {"x": {1: ("seq", 1, 32)}})
    assert [n.op for n in g.nodes] == ["reshape", "tanh"]
    assert "batch" in g.symbols and g.symbols["seq"] == (1, 32)
    cm = cuvil.compile(m, dynamic_shapes={"x": {1: ("seq", 1, 32)}})
    for shape in ((1, 3, 8), (3, 5, 8)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        _close(cm.run(x)[0], np.tanh(x.reshape(shape[0], -1, 4)))


def _shape_input_model():
    """Relu -> Reshape(x, shape) -> Slice(starts): the shape and the slice start are graph inputs."""
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    S = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    B = helper.make_tensor_value_info("start", TensorProto.INT64, [1])
    inits = [numpy_helper.from_array(np.array([100], np.int64), "end"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y0"]),
             helper.make_node("Slice", ["y0", "start", "end", "axis"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "g", [X, S, B], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], inits), opset_imports=[helper.make_opsetid("", 17)])


def test_shape_deciding_inputs_need_values():
    m = _shape_input_model()
    with pytest.raises(cuvil.InputValuesNeededError, match="constant_inputs") as err:
        cuvil.compile(m)
    assert err.value.names == ["shape"]         # the Slice start shows up once the shape is known
    assert fo.specialize(m, {"shape": np.array([4, 6]), "start": np.array([2])})[1] == ["shape", "start"]
    consts = {"shape": np.array([6, 4]), "start": np.array([1])}
    cm = cuvil.compile(m, constant_inputs=consts, verify=True)
    assert [i["name"] for i in cm.module.manifest["inputs"]] == ["x"]
    assert cm.module.manifest["constant_inputs"]["shape"]["values"] == [6, 4]
    with pytest.raises(cuvil.ShapeError, match="dtype int32, expected int64"):
        cuvil.compile(m, constant_inputs={"shape": np.array([6, 4], np.int32), "start": np.array([1])})
    with pytest.raises(cuvil.ShapeError, match="not inputs of the model"):
        cuvil.compile(m, constant_inputs={"nope": np.array([1])})
    with pytest.raises(ValueError, match="ONNX models only"):
        cuvil.compile(torch.nn.ReLU(), (torch.ones(2),), constant_inputs=consts)


def test_session_specializes_on_shape_inputs():
    """ONNX Runtime runs such models as they are; the cuvil session compiles one artifact per value."""
    from onnx.reference import ReferenceEvaluator
    m = _shape_input_model()
    sess = cuvil.InferenceSession(m, num_threads=1)
    assert sess.specialized_inputs == ["shape"]   # "start" is found on the first run, once the shape is known
    assert [i.name for i in sess.get_inputs()] == ["x", "shape", "start"]
    ref = ReferenceEvaluator(m)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    for shape, start in (([6, 4], 1), ([4, -1], 0), ([6, 4], 1), ([3, 8], 5)):
        feed = {"x": x, "shape": np.array(shape, np.int64), "start": np.array([start], np.int64)}
        (got,) = sess.run(None, feed)
        (want,) = ref.run(None, feed)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert sess.specialized_inputs == ["shape", "start"]
    assert sess._special.compiles == 3          # the repeated value reuses its artifact
    with pytest.raises(cuvil.ShapeError, match="missing input"):
        sess.run(None, {"x": x})


def test_external_data(tmp_path):
    model = _mlp_model(batch=2)
    onnx.save_model(_mlp_model(batch=2), str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.data", size_threshold=0)
    assert (tmp_path / "weights.data").exists()
    x = np.ones((2, 8), np.float32)
    cm = cuvil.compile(str(tmp_path / "ext.onnx"))
    _close(cm.run(x)[0], _ort(model, {"x": x})[0])
    with pytest.raises(cuvil.CuvilError, match="external"):
        cuvil.compile(onnx.load(str(tmp_path / "ext.onnx"), load_external_data=False).SerializeToString())


def test_unsupported_ops_are_all_listed():
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("FancyOp", ["a"], ["b"], name="first_bad", domain="com.example"),
             helper.make_node("TfIdfVectorizer", ["b"], ["c"], name="second_bad"),
             helper.make_node("Multinomial", ["c"], ["d"], name="third_bad")]
    m = helper.make_model(helper.make_graph(nodes, "g", [X], [helper.make_tensor_value_info("d", TensorProto.FLOAT, None)]),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(cuvil.UnsupportedOpError) as ei:
        cuvil.compile(m)
    msg = str(ei.value)
    for name in ("first_bad", "second_bad", "third_bad"):
        assert name in msg
    assert "FancyOp" in msg and "TfIdfVectorizer (opset 17)" in msg and "Multinomial (opset 17)" in msg
    assert len(ei.value.ops) == 3


# ---- hostile and malformed files -------------------------------------------------------------
def _graph(nodes, inputs, outputs, inits=(), opset=17):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, t=TensorProto.FLOAT, shape=(2, 3)):
    return helper.make_tensor_value_info(name, t, shape)


def _raw_tensor(name, dims, raw):
    """A float tensor whose raw data need not match its dims (helper.make_tensor refuses that)."""
    t = TensorProto()
    t.name, t.data_type, t.raw_data = name, TensorProto.FLOAT, raw
    t.dims.extend(dims)
    return t


HOSTILE = 'x"\\); system("rm -rf /"); /*'

BAD_MODELS = {
    "garbage bytes": b"\x00\xffnot a model at all\x13\x37" * 10,
    "truncated": _mlp_model().SerializeToString()[:150],
    "cycle": _graph([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
                    [_vi("x")], [_vi("b")]),
    "missing initializer": _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")]),
    "string input": _graph([helper.make_node("Identity", ["x"], ["y"])], [_vi("x", TensorProto.STRING)],
                           [_vi("y", TensorProto.STRING)]),
    "wrong dtypes": _graph([helper.make_node("Add", ["x", "i"], ["y"])], [_vi("x"), _vi("i", TensorProto.INT64)],
                           [_vi("y")]),
    "absurd input shape": _graph([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", shape=(10**7, 10**7))],
                                 [_vi("y")]),
    "huge declared initializer": _graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")],
        [_raw_tensor("w", [1 << 20, 1 << 20], b"\x00" * 16)]),
    "initializer data short": _graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")],
        [_raw_tensor("w", [2, 3], b"\x00" * 8)]),
    "huge ConstantOfShape": _graph(
        [helper.make_node("ConstantOfShape", ["s"], ["y"])], [_vi("x")], [_vi("y")],
        [numpy_helper.from_array(np.array([1 << 30, 1 << 30], np.int64), "s")]),
    "shape mismatch": _graph([helper.make_node("MatMul", ["x", "x"], ["y"])], [_vi("x")], [_vi("y")]),
    "no outputs": _graph([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], []),
    "undefined output": _graph([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("zzz")]),
    "negative dim": _graph([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", shape=(-3, 2))], [_vi("y")]),
    "bad reshape": _graph([helper.make_node("Reshape", ["x", "s"], ["y"])], [_vi("x")], [_vi("y")],
                          [numpy_helper.from_array(np.array([5, 7], np.int64), "s")]),
    "hostile names": _graph([helper.make_node("Relu", [HOSTILE], ["y"])], [_vi(HOSTILE)], [_vi("y")]),
}


@pytest.mark.parametrize("name", sorted(BAD_MODELS))
def test_bad_models_raise_clear_errors(tmp_path, name):
    bad = BAD_MODELS[name]
    data = bad if isinstance(bad, bytes) else bad.SerializeToString()
    if name == "hostile names":            # legal, just nasty: must compile and run correctly
        cm = cuvil.compile(data)
        x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
        _close(cm.run(x)[0], np.maximum(x, 0))
        return
    with pytest.raises(cuvil.CuvilError) as ei:
        cuvil.compile(data)
    assert str(ei.value)
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    with pytest.raises(cuvil.CuvilError):
        cuvil.InferenceSession(str(path))


def test_missing_file():
    with pytest.raises(cuvil.CuvilError, match="does not exist"):
        cuvil.compile("/nonexistent/model.onnx")


_SEED = _mlp_model(batch=2).SerializeToString()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_loader_only_raises_cuvil_errors(data):
    """Random byte edits of a valid model: the frontend either converts it or raises a CuvilError."""
    buf = bytearray(_SEED)
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del buf[pos:pos + data.draw(st.integers(1, 16))]
        else:
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        fo.to_graph(bytes(buf))
    except cuvil.CuvilError:
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dims=st.lists(st.integers(-5, 1 << 40), min_size=0, max_size=5),
       op=st.sampled_from(["Relu", "Reshape", "Expand", "ConstantOfShape", "Tile", "Transpose"]),
       dtype=st.sampled_from([TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING, TensorProto.BFLOAT16,
                              TensorProto.BOOL]))
def test_fuzz_structured_hostile_graphs(dims, op, dtype):
    """Well-formed protobufs with hostile contents: absurd dims, wrong dtypes, odd shape vectors."""
    x = helper.make_tensor_value_info("x", dtype, dims)
    s = numpy_helper.from_array(np.array(dims, np.int64), "s")
    ins = {"Relu": ["x"], "Reshape": ["x", "s"], "Expand": ["x", "s"], "ConstantOfShape": ["s"],
           "Tile": ["x", "s"], "Transpose": ["x"]}[op]
    m = _graph([helper.make_node(op, ins, ["y"])], [x], [helper.make_tensor_value_info("y", dtype, None)], [s])
    try:
        fo.to_graph(m)
    except cuvil.CuvilError:
        pass


@pytest.mark.parametrize("name", ["resnet", "bert", "gpt2"])
def test_exported_model_matches_compiling_from_torch(name):
    """Issue 4's equivalence: torch.onnx.export -> cuvil equals torch -> cuvil (and eager)."""
    from . import models
    model, args = models.ALL[name]()

    class Flat(torch.nn.Module):          # plain tensor outputs for the exporter
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *a):
            out = self.m(*a)
            return out[0]
    flat = Flat(model).eval()
    data = export(flat, args, names=[f"in{i}" for i in range(len(args))], opset=17, dynamo=name == "gpt2")
    from_onnx = cuvil.compile(data)
    from_torch = cuvil.compile(flat, args)
    arrays = [a.numpy() for a in args]
    with torch.no_grad():
        ref = flat(*args).numpy()
    got_onnx, got_torch = from_onnx.run(*arrays)[0], from_torch.run(*arrays)[0]
    np.testing.assert_allclose(got_onnx, got_torch, rtol=2e-4, atol=2e-4)   # two graphs: fp32 reassociation
    np.testing.assert_allclose(got_onnx, ref, rtol=2e-4, atol=2e-4)


def test_qlinear_conv_per_channel_matches_onnxruntime():
    """Per-output-channel weight scales and zero points (the conformance suite has only per-tensor)."""
    ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (1, 3, 6, 6), dtype=np.uint8)
    consts = {"xs": np.array(0.02, np.float32), "xzp": np.array(128, np.uint8),
              "w": rng.integers(0, 255, (4, 3, 3, 3), dtype=np.uint8),
              "ws": np.array([0.01, 0.02, 0.03, 0.04], np.float32), "wzp": np.array([120, 128, 130, 127], np.uint8),
              "ys": np.array(0.5, np.float32), "yzp": np.array(10, np.uint8)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"], pads=[1, 1, 1, 1])
    m = _graph([node], [_vi("x", TensorProto.UINT8, x.shape)], [_vi("y", TensorProto.UINT8, None)],
               [numpy_helper.from_array(v, k) for k, v in consts.items()], opset=13).SerializeToString()
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cuvil.PrecisionWarning)
        got = cuvil.compile(m).run(x)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("weights", ["initializers", "inputs"])
def test_conv_transpose_by_patches_matches_onnxruntime(weights):
    """ConvTranspose whose kernel equals its strides (2x2 stride 2, and 3x2 stride (3, 2)) runs as a GEMM into
    patches (frontend/onnx/conv._patches_transposed), with its weight and bias as initializers or as graph
    inputs; against ONNX Runtime, batch 2."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    params = {"w1": rng.standard_normal((6, 4, 2, 2)).astype(np.float32), "b1": rng.standard_normal(4).astype(np.float32),
              "w2": rng.standard_normal((4, 3, 3, 2)).astype(np.float32)}
    nodes = [helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["h"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("ConvTranspose", ["h", "w2"], ["y"], kernel_shape=[3, 2], strides=[3, 2])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    if weights == "inputs":
        ins += [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in params.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()] if weights == "initializers" else []
    g = helper.make_graph(nodes, "up", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 30, 28])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feed = {"x": x, **(params if weights == "inputs" else {})}
    want = _ort(model, feed)[0]
    cm = cuvil.compile(model)
    assert not any(n.op == "conv" for n in cm.graph.nodes), [n.op for n in cm.graph.nodes]
    got = cm.run(*feed.values())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
