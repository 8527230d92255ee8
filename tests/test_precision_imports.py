"""Models quantized before they reach cuvil: ONNX QDQ (onnxruntime.quantization.quantize_static),
ONNX quantize_dynamic (MatMulInteger), PyTorch QAT (prepare_qat, fake quantization). At fp32 they run
as their framework defines them (checked against the ONNX reference evaluator / torch eager); at
precision="int8" their matmuls run on the integer kernels with the model's own int8 weights kept
exactly, within one output quantization step of the framework's quantized execution."""
import numpy as np
import pytest
import torch

import cuvil
from cuvil.ir.quant import int8_grid, quantize_int8
from cuvil.target import AMX_FEATURES, cpu_flags, has_features

onnx = pytest.importorskip("onnx", reason="the ONNX imports need the onnx package (dev requirements)")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime quantizes the models and is the oracle")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,  # noqa: E402
                                      quantize_static)

# precision="int8"'s linear layers: int8 blocks (qgemm.c), or on AMX tiles each row over its own range
INT8_DOT = ("matmul: int8 weights, uint8 activations, each row over its own range (AMX tdpbusd)"
            if has_features("native", AMX_FEATURES) else "matmul: int8 weights, int8 activations (integer dot)")
GRID_DOT = "matmul: int8 weights, uint8 activations on the model's grid (integer dot)"
# linear layers on a model's own activation grid multiply its bytes where the CPU has VNNI (all 256 levels);
# elsewhere they take dynamic int8 blocks as any other (passes/quantize.py)
VNNI = {"avx512_vnni", "avx512bw"} <= cpu_flags()


def _linear_formats(on_grid: int, other: int) -> dict:
    """The manifest's precision_ops for `on_grid` linear layers whose input is a model grid and `other` not."""
    counts = {GRID_DOT: on_grid, INT8_DOT: other} if VNNI else {INT8_DOT: on_grid + other}
    return {k: v for k, v in counts.items() if v}


def test_int8_grid_keeps_quantized_weights_and_rejects_float_ones():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 24)).astype(np.float32)
    q, s = quantize_int8(w)
    per_channel = q.astype(np.float32) * s
    got = int8_grid(per_channel)
    assert got is not None and np.array_equal(got[0].astype(np.float32) * got[1], per_channel)
    per_tensor = np.clip(np.rint(w / 0.01), -128, 127).astype(np.float32) * np.float32(0.01)
    got = int8_grid(per_tensor)
    assert got is not None and np.allclose(got[0] * got[1], per_tensor, rtol=2 ** -20, atol=0)
    assert got[0].min() == -128                      # the full signed range, as torch's qint8 uses it
    assert int8_grid(w) is None
    assert int8_grid(per_channel + np.float32(1e-3)) is None


# ---- ONNX -----------------------------------------------------------------------------------------
def _float_mlp(path, rng):
    w1 = (rng.standard_normal((64, 96)) * 0.2).astype(np.float32)
    b1 = (rng.standard_normal(96) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((96, 10)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "W2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 10])],
                          [numpy_helper.from_array(a, n) for a, n in ((w1, "W1"), (b1, "b1"), (w2, "W2"))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


class _Calibration(CalibrationDataReader):
    def __init__(self, rng):
        self.batches = iter([{"x": rng.standard_normal((8, 64)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


def _reference(path, x):
    """The ONNX reference evaluator (its DequantizeLinear needs opset 19 or later)."""
    from onnx.reference import ReferenceEvaluator
    m = onnx.load(path)
    m.opset_import[0].version = 21
    return ReferenceEvaluator(m).run(None, {"x": x})[0]


@pytest.mark.parametrize("per_channel", [False, True])
def test_onnx_qdq_model(tmp_path, per_channel):
    rng = np.random.default_rng(1)
    fp, qp = str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx")
    _float_mlp(fp, rng)
    quantize_static(fp, qp, _Calibration(rng), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    want = _reference(qp, x)
    step = float(numpy_helper.to_array(next(t for t in onnx.load(qp).graph.initializer if t.name == "y_scale")))
    np.testing.assert_allclose(cuvil.compile(qp).run(x)[0], want, rtol=0, atol=1e-6)   # exact emulation at fp32
    cm = cuvil.compile(qp, precision="int8")
    assert cuvil.load(cm.path).manifest["precision_ops"] == _linear_formats(2, 0)
    assert cm.c_source.count("cuvil_matmul_int8(") == (2 if VNNI else 0)
    # VNNI: both layers multiply the model's own activation bytes (exact integer sums), and what is left is
    # the float scaling's rounding, which moves a value across a rounding boundary of the next
    # QuantizeLinear at most once: within one output step. Elsewhere the kernels quantize the activations
    # again (per block, dynamically): each of the two quantized layers can add one output step
    steps = 1 if VNNI else 2
    got = cm.run(x)[0]
    assert np.abs(got - want).max() <= steps * step * 1.001
    if not per_channel:       # ORT agrees with the reference here (on per-channel weights it does not)
        assert np.abs(got - ort.InferenceSession(qp).run(None, {"x": x})[0]).max() <= steps * step * 1.001


class _Images(CalibrationDataReader):
    def __init__(self, rng, shape):
        self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


@pytest.mark.parametrize("per_channel", [False, True])
def test_onnx_qdq_cnn_on_integer_convs(tmp_path, per_channel):
    """quantize_static's QDQ CNN at precision="int8": on a CPU with AVX-512 VNNI every conv runs on the
    integer kernels, its input mapped onto bytes over the grid of the DequantizeLinear before it (the
    model's own quantized values, not a range of cuvil's), its filters the model's int8 values; the
    output within one quantization step of the ONNX reference evaluator and of ONNX Runtime."""
    from cuvil.target import has_features
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 32, 1), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 16, 3, stride=2, padding=1)).eval()
    shape = (1, 16, 12, 12)
    fp, qp = str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx")
    torch.onnx.export(net, (torch.randn(shape),), fp, input_names=["x"], output_names=["y"], dynamo=False,
                      opset_version=17)
    rng = np.random.default_rng(3)
    quantize_static(fp, qp, _Images(rng, shape), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    x = rng.standard_normal(shape).astype(np.float32)
    want = _reference(qp, x)
    model = onnx.load(qp)
    step = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name.endswith("_scale")
                                            and t.name.startswith(model.graph.output[0].name))))
    cm = cuvil.compile(qp, precision="int8")
    integer = has_features("native", ("avx512_vnni", "avx512bw"))
    assert cm.c_source.count("cuvil_conv_blocked_int8(") == (3 if integer else 0)
    got = cm.run(x)[0]
    assert np.abs(got - want).max() <= step * 1.001
    if not per_channel:       # ORT agrees with the reference here (on per-channel weights it does not)
        assert np.abs(got - ort.InferenceSession(qp).run(None, {"x": x})[0]).max() <= step * 1.001


def test_onnx_quantize_dynamic_model(tmp_path):
    rng = np.random.default_rng(2)
    fp, dp = str(tmp_path / "f.onnx"), str(tmp_path / "d.onnx")
    _float_mlp(fp, rng)
    quantize_dynamic(fp, dp, weight_type=QuantType.QInt8)
    assert "MatMulInteger" in [n.op_type for n in onnx.load(dp).graph.node]
    x = rng.standard_normal((8, 64)).astype(np.float32)
    # the reference, not ORT: on AVX2 ORT's u8 x s8 maddubs saturates (0.36 off the reference on this
    # model's second row; the reference itself is 0.09 off fp32)
    want = _reference(dp, x)
    fp32 = ort.InferenceSession(fp).run(None, {"x": x})[0]
    np.testing.assert_allclose(cuvil.compile(dp).run(x)[0], want, rtol=0, atol=1e-5)  # the int32 emulation
    cm = cuvil.compile(dp, precision="int8")
    assert cuvil.load(cm.path).manifest["precision_ops"] == {INT8_DOT: 2}
    got = cm.run(x)[0]
    # the model rounds x per tensor to uint8 (255 levels over [min, max]), the kernels per block to int8
    # (127 over [0, amax] for ReLU's outputs): each is near fp32, neither always nearer
    spec_err = np.abs(want - fp32).max()
    assert np.abs(got - want).max() <= 2 * spec_err


# ---- PyTorch QAT -----------------------------------------------------------------------------------
class _QatMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        tq = torch.ao.quantization
        self.q, self.dq = tq.QuantStub(), tq.DeQuantStub()
        self.fc1, self.relu, self.fc2 = torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10)

    def forward(self, x):
        return self.dq(self.fc2(self.relu(self.fc1(self.q(x)))))


def _qat_model():
    tq = torch.ao.quantization
    torch.manual_seed(0)
    m = _QatMlp().train()
    m.qconfig = tq.get_default_qat_qconfig("x86")
    m = tq.prepare_qat(m)
    opt = torch.optim.SGD(m.parameters(), 0.05)
    for _ in range(20):
        x = torch.randn(32, 64)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), x[:, :10]).backward()
        opt.step()
    return m.eval()


def test_qat_model_needs_its_observers_off():
    m = _qat_model()
    with pytest.raises(cuvil.UnsupportedOpError, match="disable_observer"):
        cuvil.compile(m, (torch.randn(4, 64),))


def test_qat_model_fp32_exact_and_int8_on_its_own_weights():
    m = _qat_model()
    m.apply(torch.ao.quantization.disable_observer)
    x = torch.randn(16, 64)
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(cuvil.compile(m, (x,))(x).numpy(), want, rtol=0, atol=1e-6)
    cm = cuvil.compile(m, (x,), precision="int8")
    # fc2 reads fc1's fake-quantized output: the model's own grid; fc1's input is no grid
    assert cuvil.load(cm.path).manifest["precision_ops"] == _linear_formats(1, 1)
    # the learned int8 weights, exactly: the compiled graph's weights dequantize to eager's fake-quantized ones
    mmq = [n for n in cm.graph.nodes if n.op == "matmul_q"]
    for node, fc in zip(mmq, (m.fc1, m.fc2)):
        with torch.no_grad():
            fq = fc.weight_fake_quant(fc.weight).numpy().T
        np.testing.assert_allclose(node.inputs[1].data.astype(np.float32) * node.inputs[2].data, fq, rtol=2 ** -20,
                                   atol=0)
    step = float(m.fc2.activation_post_process.scale)     # the output's fake-quant step
    assert np.abs(cm(x).numpy() - want).max() <= 2 * step


def test_converted_eager_quantized_model_gets_a_clear_error():
    tq = torch.ao.quantization
    m = _qat_model()
    m.apply(tq.disable_observer)
    converted = tq.convert(m)
    with pytest.raises(cuvil.QuantizationError, match="precision='int8'"):
        cuvil.compile(converted, (torch.randn(4, 64),))


# ---- PyTorch PT2E (torchao) ------------------------------------------------------------------------
def test_pt2e_converted_model():
    """export -> prepare_pt2e (X86InductorQuantizer) -> calibrate -> convert_pt2e: quantize / dequantize
    pairs around each linear, the weights int8 per channel. fp32 runs the graph as torch does; int8 puts
    the linears on the integer kernels with the converted int8 weights exactly."""
    pytest.importorskip("torchao", reason="PT2E quantization lives in torchao (dev requirements)")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10)).eval()
    x = torch.randn(8, 64)
    prepared = prepare_pt2e(torch.export.export(m, (x,)).module(),
                            X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
    for _ in range(4):
        prepared(torch.randn(8, 64))
    converted = convert_pt2e(prepared)
    assert "quantized_decomposed" in converted.code
    with torch.no_grad():
        want = converted(x).numpy()
    np.testing.assert_allclose(cuvil.compile(converted, (x,))(x).numpy(), want, rtol=0, atol=1e-6)
    cm = cuvil.compile(converted, (x,), precision="int8")
    assert cuvil.load(cm.path).manifest["precision_ops"] == _linear_formats(2, 0)
    weights = [converted._frozen_param0, converted._frozen_param1]     # int8 [out, in], per output channel
    for node, q in zip([n for n in cm.graph.nodes if n.op == "matmul_q"], weights):
        np.testing.assert_array_equal(node.inputs[1].data, q.numpy().T)
    steps = [n.args[1] for n in converted.graph.nodes if "quantize_per_tensor" in str(n.target)]
    assert np.abs(cm(x).numpy() - want).max() <= 2 * max(steps)      # the activations' calibrated steps


def test_pt2e_converted_cnn_on_integer_convs():
    """A PT2E-converted CNN (X86InductorQuantizer) at precision="int8": on a CPU with AVX-512 VNNI its
    convs run on the integer kernels, each reading its input over the grid of the dequantize before it
    and the converted int8 filters; within one output step of the converted model's own execution."""
    pytest.importorskip("torchao", reason="PT2E quantization lives in torchao (dev requirements)")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    from cuvil.target import has_features
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 1),
                            torch.nn.ReLU(), torch.nn.Conv2d(32, 16, 3, stride=2, padding=1)).eval()
    x = torch.randn(1, 16, 12, 12)
    prepared = prepare_pt2e(torch.export.export(m, (x,)).module(),
                            X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
    for _ in range(4):
        prepared(torch.randn(1, 16, 12, 12))
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        want = converted(x).numpy()
    cm = cuvil.compile(converted, (x,), precision="int8", layout="blocked")
    integer = has_features("native", ("avx512_vnni", "avx512bw"))
    assert cm.c_source.count("cuvil_conv_blocked_int8(") == (3 if integer else 0)
    if cm.graph is not None:
        assert all(n.attrs["int8_range"] for n in cm.graph.nodes if n.op == "conv")     # every conv: its grid
    steps = [float(n.args[1]) for n in converted.graph.nodes if "quantize_per_tensor" in str(n.target)]
    # each conv reads exactly the model's bytes (its grid), and the last conv's output is not quantized
    # again: what is left is the float sums' rounding, far below a step (ranges of cuvil's own: ~a step)
    assert np.abs(cm(x).numpy() - want).max() <= 0.01 * min(steps)


def test_float_functional_is_no_quantized_module():
    """FloatFunctional lives under torch.ao.nn.quantized but is a float module (quantizable models
    use it before conversion): it compiles; only modules holding packed weights are refused."""
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.skip = torch.nn.Linear(8, 8), torch.ao.nn.quantized.FloatFunctional()

        def forward(self, x):
            return self.skip.add(self.fc(x), x)
    m, x = Residual().eval(), torch.randn(3, 8)
    np.testing.assert_allclose(cuvil.compile(m, (x,))(x).numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf"), 1e-45, 1e-30, 0.02, 1e30, 1e38])
@pytest.mark.parametrize("zero_point", [0, 200])
@pytest.mark.parametrize("layer", ["Conv", "MatMul"])
def test_dequantize_grid_from_a_hostile_file(tmp_path, scale, zero_point, layer):
    """A QDQ pair's scale and zero point come from the file and reach the generated code as the conv's or
    the matmul's int8_range: any value compiles (a grid outside what float32 holds, or not positive, is
    not taken) and the layer then computes what the ONNX reference evaluator does, within int8's error
    where that is finite; never a crash."""
    conv = layer == "Conv"
    w = np.random.default_rng(0).standard_normal((16, 16, 1, 1) if conv else (16, 16)).astype(np.float32) * 0.1
    shape = [1, 16, 5, 5] if conv else [5, 16]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node(layer, ["d", "W"], ["y"])]
    g = helper.make_graph(nodes, "qdq_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                          [numpy_helper.from_array(np.array(scale, np.float32), "s"),
                           numpy_helper.from_array(np.array(zero_point, np.uint8), "z"),
                           numpy_helper.from_array(w, "W")])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    with np.errstate(all="ignore"):
        want = _reference(path, x)
    cm = cuvil.compile(path, precision="int8", layout="blocked")
    got = cm.run(x)[0]
    ok = np.isfinite(want)
    if ok.any():
        # beyond int8's error, float32's in the zero point's share: the kernels add the integer sum's scaled
        # value and the zero point's (-scale * zero * column sum), which cancel where the grid lies far from
        # the data (scale 1e30, zero point 200: every value quantizes to 0 and the two terms are ~1e32)
        cancel = 1e-6 * (abs(scale) if np.isfinite(scale) else 0) * zero_point * np.abs(w).reshape(16, -1).sum()
        assert np.abs(got[ok] - want[ok]).max() <= 0.02 * np.abs(want[ok]).max() + cancel + 1e-20   # subnormal grids


@pytest.mark.parametrize("bad", ["0,1", [0.0], [1.0, 0.0], [0.0, float("nan")], [0.0, float("inf")], [0, 1],
                                 [-1e39, 1.0]])
def test_matmul_int8_range_is_checked(bad):
    """matmul / matmul_fused / matmul_q's int8_range reaches C as a packed constant: only [lo, hi], two
    floats within float32's range, lo <= hi; matmul_q takes it only with int8 weights and no int8 blocks."""
    from cuvil.errors import ShapeError
    from cuvil.ir.graph import Graph, TensorType, Value
    g = Graph()
    x = Value(TensorType((4, 8), "float32"), "x")
    w, q, s = g.const(np.ones((8, 3), np.float32)), g.const(np.ones((8, 3), np.int8)), g.const(np.ones((1, 3), np.float32))
    for op, ins, attrs in (("matmul", [x, w], {}), ("matmul_fused", [x, w], {}),
                           ("matmul_q", [x, q, s], {"bits": 8, "group": 8})):
        with pytest.raises(ShapeError, match="int8_range"):
            g.add(op, ins, {**attrs, "int8_range": bad})
        assert g.add(op, ins, {**attrs, "int8_range": [-1.0, 2.0]}).shape == (4, 3)
    with pytest.raises(ShapeError, match="int8_range takes int8 weights and act_block 0"):
        g.add("matmul_q", [x, g.const(np.ones((32, 3), np.int8)), g.const(np.ones((1, 3), np.float32))],
              {"bits": 8, "group": 32, "act_block": 32, "int8_range": [-1.0, 2.0]})
