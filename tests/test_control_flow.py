"""Control flow decided at run time: torch.cond / torch.while_loop compile to C if / loops (IR regions),
and a forward written with plain `if` / `while` on tensor values (the seed's DynamicClassifier) is
rewritten into them; each compared with torch eager on inputs that take every branch."""
from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.errors import UnsupportedOpError

torch = pytest.importorskip("torch", reason="the oracle is torch eager (a dev requirement)")


class DynamicClassifier(torch.nn.Module):
    """The seed's example, as written: the branch depends on the input's values."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(10, 20)
        self.fc2 = torch.nn.Linear(20, 2)
        self.fc3 = torch.nn.Linear(20, 2)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        if x.sum() > 5:
            return self.fc2(x)
        else:
            return self.fc3(x) * 2


class Refine(torch.nn.Module):
    """if / elif / else assigning two variables, then a while loop whose trip count depends on the data."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.l(x)
        if y.mean() > 0:
            y = y * 2
            z = y + 1
        elif y.mean() < -0.1:
            y = -y
            z = y - 1
        else:
            z = y
        steps = torch.zeros((), dtype=torch.int64)
        while (y.abs().sum() < 100) & (steps < 40):      # the cap: a loop that could settle still ends
            y = y * 1.5 + 0.1 * self.l(y)
            steps = steps + 1
        return y, z, steps


class Gate(torch.nn.Module):
    """torch.cond written out: a conv branch and a pooling branch of the same shape."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return torch.cond(x.mean() > 0, lambda t: torch.relu(self.conv(t)), lambda t: torch.nn.functional.avg_pool2d(
            t, 3, stride=1, padding=1), (x,))


class Newton(torch.nn.Module):
    """torch.while_loop written out: Newton steps for sqrt(a) until they converge, the tolerance an input."""

    def forward(self, a, tol):
        def cond(i, x):
            return (x * x - a).abs().max() > tol

        def body(i, x):
            return i + 1, 0.5 * (x + a / x)
        return torch.while_loop(cond, body, (torch.zeros((), dtype=torch.int64), a.clone()))


def _close(got, want):
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_dynamic_classifier_compiles_unchanged_and_takes_both_branches():
    m = DynamicClassifier().eval()
    x = torch.randn(3, 10)
    cm = cuvil.compile(m, (x,))
    taken = set()
    for scale in (0.05, 0.2, 1.0, 5.0):
        xx = x.abs() * scale
        taken.add(bool(torch.relu(m.fc1(xx)).sum() > 5))
        _close(cm(xx), m(xx))
    assert taken == {True, False}
    assert "cond" in cm.module.manifest["node_ops"]


def test_if_elif_and_while_on_tensors_are_rewritten():
    m = Refine().eval()
    cm = cuvil.compile(m, (torch.randn(2, 4),))
    trips = set()
    for seed, scale in ((0, 1.0), (1, -1.0), (2, 0.01), (3, 3.0)):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(seed)) * scale
        want = m(x)
        trips.add(int(want[2]))
        _close(cm(x), want)
    assert len(trips) > 1


def test_torch_cond_with_conv_branch():
    m = Gate().eval()
    x = torch.randn(1, 3, 8, 8)
    cm = cuvil.compile(m, (x,), verify=True)
    for sign in (1, -1):
        _close(cm(x.abs() * sign), m(x.abs() * sign))


def test_torch_while_loop_with_invariant_input():
    m = Newton()
    a = torch.rand(5) * 10 + 0.5
    cm = cuvil.compile(m, (a, torch.tensor(1e-3)))
    for tol in (1.0, 1e-2, 1e-4):
        got, want = cm(a, torch.tensor(tol)), m(a, torch.tensor(tol))
        assert int(got[0]) == int(want[0])
        _close(got[1], want[1])


def test_what_cannot_be_rewritten_names_the_line():
    class EarlyReturn(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            y = x - 1
            return y
    with pytest.raises(UnsupportedOpError, match=r"returns in one branch only.*test_control_flow.py:\d+"):
        cuvil.compile(EarlyReturn(), (torch.randn(3),))


def test_python_conditions_keep_their_meaning():
    """A test on a Python value (a flag, a shape) stays an ordinary if after the rewrite."""
    class Mixed(torch.nn.Module):
        def __init__(self, double):
            super().__init__()
            self.double = double

        def forward(self, x):
            if self.double:
                x = x * 2
            if x.shape[0] > 1:
                x = x + 1
            if x.max() > 3:            # the data-dependent one
                x = x - 10
            return x
    for flag in (True, False):
        m = Mixed(flag)
        cm = cuvil.compile(m, (torch.randn(2, 3),))
        for scale in (0.1, 10.0):
            x = torch.ones(2, 3) * scale
            _close(cm(x), m(x))


def test_onnx_if_with_a_run_time_condition():
    """An ONNX If whose condition is computed from the input becomes a cond region (not one artifact
    per condition value); its branches read outer values and a weight."""
    onnx = pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    from onnx import TensorProto as T
    from onnx import helper as h
    f = lambda name, shape: h.make_tensor_value_info(name, T.FLOAT, shape)  # noqa: E731
    then_g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["t1"]), h.make_node("Relu", ["t1"], ["t2"]),
                           h.make_node("Identity", ["x"], ["t3"])], "then", [], [f("t2", [2, 3]), f("t3", [2, 3])])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["e1"]), h.make_node("Add", ["x", "x"], ["e2"])], "else", [],
                          [f("e1", [2, 3]), f("e2", [2, 3])])
    w = np.random.default_rng(0).standard_normal((3, 3)).astype(np.float32)
    g = h.make_graph([h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
                      h.make_node("If", ["c"], ["a", "b"], then_branch=then_g, else_branch=else_g)], "m",
                     [f("x", [2, 3])], [f("a", [2, 3]), f("b", [2, 3])],
                     initializer=[h.make_tensor("zero", T.FLOAT, [], [0.0]), onnx.numpy_helper.from_array(w, "w")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    cm = cuvil.compile(model)
    assert "cond" in cm.module.manifest["node_ops"]
    sess = ort.InferenceSession(model)
    for sign in (1, -1):
        x = np.abs(np.random.default_rng(1).standard_normal((2, 3))).astype(np.float32) * sign
        for got, want in zip(cm.run(x), sess.run(None, {"x": x})):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_onnx_loop_with_a_run_time_trip_count_and_condition():
    """An ONNX Loop whose trip count M and condition are inputs and whose body computes its own
    condition becomes a while_loop region: every (M, cond, limit) gives ONNX Runtime's answer,
    including zero trips, a false start and a stop by the body's condition before M."""
    onnx = pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    from onnx import TensorProto as T
    from onnx import helper as h
    v = h.make_tensor_value_info
    body = h.make_graph(
        [h.make_node("Mul", ["acc", "k"], ["t"]), h.make_node("Add", ["t", "x"], ["acc2"]),
         h.make_node("ReduceSum", ["acc2"], ["s"], keepdims=0), h.make_node("Less", ["s", "limit"], ["c2"])],
        "body", [v("i", T.INT64, []), v("c", T.BOOL, []), v("acc", T.FLOAT, [4])],
        [v("c2", T.BOOL, []), v("acc2", T.FLOAT, [4])], [h.make_tensor("k", T.FLOAT, [], [1.5])])
    g = h.make_graph([h.make_node("Loop", ["M", "c0", "a0"], ["out"], body=body)], "g",
                     [v("M", T.INT64, []), v("c0", T.BOOL, []), v("a0", T.FLOAT, [4]), v("x", T.FLOAT, [4]),
                      v("limit", T.FLOAT, [])], [v("out", T.FLOAT, [4])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    cm = cuvil.compile(model)
    assert cm.module.manifest["node_ops"] == ["while_loop"]
    sess = ort.InferenceSession(model)
    rng = np.random.default_rng(0)
    for trips, go, limit in [(5, True, 1e9), (100, True, 30.0), (0, True, 1e9), (7, False, 1e9), (3, True, -1.0)]:
        feed = {"M": np.array(trips, np.int64), "c0": np.array(go), "a0": rng.standard_normal(4).astype(np.float32),
                "x": rng.random(4).astype(np.float32), "limit": np.array(limit, np.float32)}
        np.testing.assert_allclose(cm.run(*feed.values())[0], sess.run(None, feed)[0], rtol=1e-5, atol=1e-5)


def test_onnx_loop_whose_body_reads_its_trip_count():
    """M is both the loop's bound and a value the body reads: one input of the region, not two."""
    onnx = pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    from onnx import TensorProto as T
    from onnx import helper as h
    v = h.make_tensor_value_info
    body = h.make_graph([h.make_node("Cast", ["M"], ["mf"], to=T.FLOAT), h.make_node("Add", ["acc", "mf"], ["acc2"]),
                         h.make_node("Identity", ["c"], ["c2"])], "body",
                        [v("i", T.INT64, []), v("c", T.BOOL, []), v("acc", T.FLOAT, [2])],
                        [v("c2", T.BOOL, []), v("acc2", T.FLOAT, [2])])
    g = h.make_graph([h.make_node("Loop", ["M", "", "a0"], ["out"], body=body)], "g",
                     [v("M", T.INT64, []), v("a0", T.FLOAT, [2])], [v("out", T.FLOAT, [2])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    cm, sess = cuvil.compile(model), ort.InferenceSession(model)
    for trips in (0, 1, 4):
        feed = {"M": np.array(trips, np.int64), "a0": np.array([1.0, -2.0], np.float32)}
        np.testing.assert_allclose(cm.run(*feed.values())[0], sess.run(None, feed)[0])


def test_onnx_loop_with_run_time_trips_and_scan_outputs_asks_for_the_trip_count():
    """Scan outputs' length is the trip count: a Loop that has them and a run-time M is not a region;
    compile() names M as the input to fix (cuvil.InferenceSession specializes on it)."""
    onnx = pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    from onnx import TensorProto as T
    from onnx import helper as h
    v = h.make_tensor_value_info
    body = h.make_graph([h.make_node("Identity", ["c"], ["c2"]), h.make_node("Identity", ["acc"], ["acc2"]),
                         h.make_node("Identity", ["acc"], ["scan"])], "body",
                        [v("i", T.INT64, []), v("c", T.BOOL, []), v("acc", T.FLOAT, [2])],
                        [v("c2", T.BOOL, []), v("acc2", T.FLOAT, [2]), v("scan", T.FLOAT, [2])])
    g = h.make_graph([h.make_node("Loop", ["M", "", "a0"], ["out", "ys"], body=body)], "g",
                     [v("M", T.INT64, []), v("a0", T.FLOAT, [2])], [v("out", T.FLOAT, [2]), v("ys", T.FLOAT, None)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(cuvil.CuvilError, match="'M'"):
        cuvil.compile(model)
    fixed = cuvil.compile(model, constant_inputs={"M": np.array(3, np.int64)})
    out, ys = fixed.run(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(ys, np.array([[1, 2]] * 3, np.float32))


def _onnx_model(nodes, inputs, outputs, opset=17, initializer=()):
    from onnx import helper as h
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=list(initializer))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)]).SerializeToString()


def test_onnx_scan_over_a_run_time_length():
    """A Scan over a symbolic dim becomes a while_loop: a running sum and product carried, one input read
    backwards, one scan output written backwards and one stacked along axis 1; ONNX Runtime's answer
    at every length in the dim's bounds, 1 included (a length past MAX_UNROLL steps too)."""
    pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    from onnx import TensorProto as T
    from onnx import helper as h
    v = h.make_tensor_value_info
    f = lambda name, shape: v(name, T.FLOAT, shape)  # noqa: E731
    body = h.make_graph(
        [h.make_node("Add", ["s", "a"], ["s2"]), h.make_node("Mul", ["p", "b"], ["p2"]),
         h.make_node("Tanh", ["p2"], ["p3"]), h.make_node("Sub", ["s2", "b"], ["y1"]), h.make_node("Identity", ["p3"], ["y2"])],
        "body", [f("s", [3]), f("p", [3]), f("a", [3]), f("b", [3])], [f("s2", [3]), f("p3", [3]), f("y1", [3]), f("y2", [3])])
    scan = h.make_node("Scan", ["s0", "p0", "xa", "xb"], ["s", "p", "ya", "yb"], body=body, num_scan_inputs=2,
                       scan_input_directions=[0, 1], scan_output_directions=[1, 0], scan_output_axes=[0, -1])
    model = _onnx_model([scan], [f("s0", [3]), f("p0", [3]), f("xa", ["T", 3]), f("xb", ["T", 3])],
                        [f("s", [3]), f("p", [3]), f("ya", ["T", 3]), f("yb", [3, "T"])])
    cm = cuvil.compile(model, dynamic_shapes={"xa": {0: ("T", 1, 80)}, "xb": {0: ("T", 1, 80)}})
    assert "while_loop" in cm.module.manifest["node_ops"]
    sess, rng = ort.InferenceSession(model), np.random.default_rng(0)
    for n in (1, 2, 7, 80):
        feed = {"s0": rng.standard_normal(3).astype(np.float32), "p0": rng.standard_normal(3).astype(np.float32),
                "xa": rng.standard_normal((n, 3)).astype(np.float32), "xb": rng.standard_normal((n, 3)).astype(np.float32)}
        got, want = cm.run(*feed.values()), sess.run(None, feed)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_onnx_scan8_batched():
    """Scan-8 (a batch axis before the scan axis, sequence_lens absent or the full length): each batch
    entry scanned on its own, as ONNX Runtime does; per-entry lengths are refused by name."""
    onnx = pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    from onnx import TensorProto as T
    from onnx import helper as h
    f = lambda name, shape: h.make_tensor_value_info(name, T.FLOAT, shape)  # noqa: E731
    body = h.make_graph([h.make_node("Mul", ["s", "x"], ["s2"]), h.make_node("Add", ["s2", "x"], ["y"])], "body",
                        [f("s", [2]), f("x", [2])], [f("s2", [2]), f("y", [2])])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    s0 = rng.standard_normal((3, 2)).astype(np.float32)
    for lens in (None, np.array([4, 4, 4], np.int64), np.array([4, 2, 4], np.int64)):
        init = [onnx.numpy_helper.from_array(lens, "lens")] if lens is not None else []
        node = h.make_node("Scan", ["lens" if lens is not None else "", "s0", "x"], ["s", "y"], body=body,
                           num_scan_inputs=1, directions=[1])
        model = _onnx_model([node], [f("s0", [3, 2]), f("x", [3, 4, 2])], [f("s", [3, 2]), f("y", [3, 4, 2])],
                            opset=8, initializer=init)
        if lens is not None and (lens != 4).any():
            with pytest.raises(UnsupportedOpError, match="per-entry sequence lengths"):
                cuvil.compile(model)
            continue
        want = ort.InferenceSession(model).run(None, {"s0": s0, "x": x})
        for a, b in zip(cuvil.compile(model).run(s0, x), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _loop_with_scan_outputs(declared_rows):
    """Loop(M, cond) carrying acc [2]; the body stops once acc's sum passes `limit`, and its scan
    outputs are acc and a window x[i:i+2] of a weight (an exporter's run-time Slice)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    v = h.make_tensor_value_info
    w = np.arange(20, dtype=np.float32) * 0.5
    body = h.make_graph(
        [h.make_node("Unsqueeze", ["i", "zero"], ["st"]), h.make_node("Add", ["st", "two"], ["en"]),
         h.make_node("Slice", ["w", "st", "en"], ["win"]), h.make_node("Add", ["acc", "win"], ["acc2"]),
         h.make_node("ReduceSum", ["acc2"], ["tot"], keepdims=0), h.make_node("Less", ["tot", "limit"], ["c2"]),
         h.make_node("Identity", ["acc2"], ["row"]), h.make_node("Identity", ["win"], ["wrow"])],
        "body", [v("i", T.INT64, []), v("c", T.BOOL, []), v("acc", T.FLOAT, [2])],
        [v("c2", T.BOOL, []), v("acc2", T.FLOAT, [2]), v("row", T.FLOAT, [2]), v("wrow", T.FLOAT, [2])],
        [h.make_tensor("zero", T.INT64, [1], [0]), h.make_tensor("two", T.INT64, [1], [2])])
    loop = h.make_node("Loop", ["M", "", "a0"], ["out", "rows", "wrows"], body=body)
    return _onnx_model([loop], [v("M", T.INT64, []), v("a0", T.FLOAT, [2]), v("limit", T.FLOAT, [])],
                       [v("out", T.FLOAT, [2]), v("rows", T.FLOAT, [declared_rows, 2]), v("wrows", T.FLOAT, [declared_rows, 2])],
                       initializer=[onnx.numpy_helper.from_array(w, "w")])


def test_onnx_loop_with_run_time_trips_and_scan_outputs():
    """A Loop with scan outputs and a run-time trip count is a while_loop when the model declares the
    outputs' length: their rows are the iterations run (the body's condition can stop it early, M can
    be 0), as ONNX Runtime gives; more iterations than declared, or a window past the weight's end,
    fail the run with the reason instead of writing past a buffer."""
    pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    model = _loop_with_scan_outputs(12)
    cm = cuvil.compile(model)
    assert "while_loop" in cm.module.manifest["node_ops"]
    sess = ort.InferenceSession(model)
    for trips, limit in [(0, 1e9), (1, 1e9), (5, 1e9), (12, 30.0), (12, 1e9), (9, -1.0)]:
        feed = {"M": np.array(trips, np.int64), "a0": np.array([0.5, -1.0], np.float32), "limit": np.array(limit, np.float32)}
        got, want = cm.run(*feed.values()), sess.run(None, feed)
        for a, b in zip(got, want):
            assert a.shape == b.shape, (trips, limit)
            np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(cuvil.CuvilError, match="outside"):
        cm.run(np.array(13, np.int64), np.zeros(2, np.float32), np.array(1e9, np.float32))
    wide = cuvil.compile(_loop_with_scan_outputs(40))
    with pytest.raises(cuvil.CuvilError, match="out of range"):    # x[19:21] of a 20-entry weight
        wide.run(np.array(25, np.int64), np.zeros(2, np.float32), np.array(1e9, np.float32))


def test_onnx_loop_bounds_and_nesting_fall_back_to_specializing():
    """Review cases: a negative declared length is no bound (the trip count is asked for, never a buffer
    of negative size); a Loop with scan outputs inside an If cannot cut its rows there, so its run-time
    condition is asked for and InferenceSession specializes on it, matching ONNX Runtime."""
    pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    with pytest.raises(cuvil.CuvilError, match="'M'"):
        cuvil.compile(_loop_with_scan_outputs(-3))
    from onnx import TensorProto as T
    from onnx import helper as h
    v = h.make_tensor_value_info
    body = h.make_graph([h.make_node("Identity", ["c"], ["c2"]), h.make_node("Add", ["acc", "x"], ["acc2"]),
                         h.make_node("Identity", ["acc2"], ["row"])], "body",
                        [v("i", T.INT64, []), v("c", T.BOOL, []), v("acc", T.FLOAT, [2])],
                        [v("c2", T.BOOL, []), v("acc2", T.FLOAT, [2]), v("row", T.FLOAT, [2])])
    loop = h.make_node("Loop", ["four", "b", "x"], ["last", "rows"], body=body)
    then_g = h.make_graph([h.make_node("Constant", [], ["four"], value=h.make_tensor("k", T.INT64, [], [4])),
                           loop], "then", [], [v("rows", T.FLOAT, None)])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["n"]), h.make_node("Unsqueeze", ["n", "zero"], ["rows2"])],
                          "else", [], [v("rows2", T.FLOAT, None)])
    model = _onnx_model([h.make_node("If", ["b"], ["out"], then_branch=then_g, else_branch=else_g)],
                        [v("b", T.BOOL, []), v("x", T.FLOAT, [2])], [v("out", T.FLOAT, None)],
                        initializer=[h.make_tensor("zero", T.INT64, [1], [0])])
    with pytest.raises(cuvil.CuvilError, match="'b'"):
        cuvil.compile(model)
    sess, oracle = cuvil.InferenceSession(model), ort.InferenceSession(model)
    for b in (True, False):
        feed = {"b": np.array(b), "x": np.array([1.0, -2.0], np.float32)}
        np.testing.assert_allclose(sess.run(None, feed)[0], oracle.run(None, feed)[0])


def test_onnx_long_static_scan_is_a_loop():
    """A Scan of a known length past the unrolling limit (1024 steps) runs as a while_loop: a running
    sum over 1500 rows equals numpy's cumsum."""
    pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    from onnx import TensorProto as T
    from onnx import helper as h
    f = lambda name, shape: h.make_tensor_value_info(name, T.FLOAT, shape)  # noqa: E731
    body = h.make_graph([h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])], "body",
                        [f("s", [2]), f("x", [2])], [f("s2", [2]), f("y", [2])])
    model = _onnx_model([h.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)],
                        [f("s0", [2]), f("xs", [1500, 2])], [f("s", [2]), f("ys", [1500, 2])])
    cm = cuvil.compile(model)
    assert "while_loop" in cm.module.manifest["node_ops"]
    xs = np.random.default_rng(3).standard_normal((1500, 2)).astype(np.float32)
    s, ys = cm.run(np.zeros(2, np.float32), xs)
    want = np.cumsum(xs.astype(np.float64), axis=0)
    np.testing.assert_allclose(ys, want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(s, want[-1], rtol=1e-4, atol=1e-3)
