"""ONNX sequences and optionals (frontend/onnx/sequences.py): lengths known at compile time, sequence
outputs returned as lists by the session (manifest output_sequences), sequence and optional inputs fixed
per value by cuvil.InferenceSession. Oracle: ONNX Runtime."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuvil
from cuvil.runtime import artifact

onnx = pytest.importorskip("onnx", reason="the models are built with onnx (a dev requirement)")
ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

v = h.make_tensor_value_info


def _model(nodes, inputs, outputs, initializer=()):
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=list(initializer))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def _split_insert_concat():
    """x [3, 4] split into rows, y put in front, the rows returned as a sequence and stacked."""
    return _model([h.make_node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=0),
                   h.make_node("SequenceInsert", ["s", "y", "zero"], ["s2"]),
                   h.make_node("SequenceErase", ["s2"], ["s3"]),
                   h.make_node("ConcatFromSequence", ["s3"], ["c"], axis=0, new_axis=1),
                   h.make_node("SequenceLength", ["s2"], ["n"])],
                  [v("x", T.FLOAT, [3, 4]), v("y", T.FLOAT, [4])],
                  [h.make_tensor_sequence_value_info("s2", T.FLOAT, None), v("c", T.FLOAT, [3, 4]), v("n", T.INT64, [])],
                  [h.make_tensor("zero", T.INT64, [], [0])])


def _same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, list):
            assert isinstance(a, list) and len(a) == len(b)
            _same(a, b)
        else:
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_sequence_output_is_a_list_and_survives_save(tmp_path):
    model = _split_insert_concat()
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((3, 4)).astype(np.float32), "y": rng.standard_normal(4).astype(np.float32)}
    want = ort.InferenceSession(model).run(None, feed)
    sess = cuvil.InferenceSession(model)
    assert not sess.specialized_inputs                 # the sequence's length is fixed by the shapes
    _same(sess.run(None, feed), want)
    assert [(o.name, o.type) for o in sess.get_outputs()] == \
        [("s2", "seq(tensor(float))"), ("c", "tensor(float)"), ("n", "tensor(int64)")]
    _same(sess.run(["n", "s2"], feed), [want[2], want[0]])
    path = cuvil.compile(model).save(tmp_path / "seq")
    _same(cuvil.InferenceSession(str(path)).run(None, feed), want)


def _map_over_input():
    """SequenceMap over a sequence input: each element plus a tensor, then its sum."""
    body = h.make_graph([h.make_node("Add", ["e", "t"], ["a"]), h.make_node("ReduceSum", ["a"], ["r"], keepdims=0)],
                        "body", [v("e", T.FLOAT, ["n"]), v("t", T.FLOAT, [1])], [v("a", T.FLOAT, ["n"]), v("r", T.FLOAT, [])])
    seq_in = onnx.helper.make_tensor_sequence_value_info("xs", T.FLOAT, None)
    return _model([h.make_node("SequenceMap", ["xs", "t"], ["as", "rs"], body=body),
                   h.make_node("ConcatFromSequence", ["rs"], ["total"], axis=0, new_axis=1)],
                  [seq_in, v("t", T.FLOAT, [1])],
                  [h.make_tensor_sequence_value_info("as", T.FLOAT, None), v("total", T.FLOAT, None)])


def test_sequence_input_is_fixed_per_value():
    """A sequence input decides the graph (its length, its elements' shapes): compile() names it,
    constant_inputs fixes it, and the session compiles one artifact per value of it (its elements are
    compiled in as constants); ONNX Runtime's answer."""
    model = _map_over_input()
    with pytest.raises(cuvil.CuvilError, match="'xs'"):
        cuvil.compile(model)
    with pytest.raises(cuvil.CuvilError, match="expected a list of arrays"):
        cuvil.compile(model, constant_inputs={"xs": np.zeros(3, np.float32)})
    sess, oracle = cuvil.InferenceSession(model), ort.InferenceSession(model)
    assert sess.specialized_inputs == ["xs"]
    rng = np.random.default_rng(1)
    feeds = [{"xs": [rng.standard_normal(k).astype(np.float32) for k in sizes], "t": rng.standard_normal(1).astype(np.float32)}
             for sizes in ([2, 5], [3], [1, 1, 4])]
    for feed in feeds + [dict(feeds[0], t=np.ones(1, np.float32))]:   # the same sequence again: no new compile
        _same(sess.run(None, feed), oracle.run(None, feed))
    assert repr(sess).endswith("3 artifact(s) compiled>")


def test_if_returning_sequences_keeps_a_run_time_condition():
    """Branches that return sequences of the same length become one cond over their elements; an
    optional empty in one branch only makes the condition a compile-time value (one artifact each)."""
    x = v("x", T.FLOAT, [2])
    then_g = h.make_graph([h.make_node("Neg", ["x"], ["a"]), h.make_node("SequenceConstruct", ["a", "x"], ["s"])],
                          "then", [], [h.make_tensor_sequence_value_info("s", T.FLOAT, None)])
    else_g = h.make_graph([h.make_node("Abs", ["x"], ["b"]), h.make_node("SequenceConstruct", ["x", "b"], ["s"])],
                          "else", [], [h.make_tensor_sequence_value_info("s", T.FLOAT, None)])
    model = _model([h.make_node("ReduceSum", ["x"], ["r"], keepdims=0), h.make_node("Greater", ["r", "zero"], ["c"]),
                    h.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                   [x], [h.make_tensor_sequence_value_info("out", T.FLOAT, None)], [h.make_tensor("zero", T.FLOAT, [], [0.0])])
    cm = cuvil.compile(model)
    assert "cond" in cm.module.manifest["node_ops"]
    sess, oracle = cuvil.InferenceSession(model), ort.InferenceSession(model)
    for sign in (1.0, -1.0):
        feed = {"x": np.array([0.5, 2.0], np.float32) * sign}
        _same(sess.run(None, feed), oracle.run(None, feed))


@pytest.fixture(scope="module")
def built_sequences(tmp_path_factory):
    model = _split_insert_concat()
    rng = np.random.default_rng(2)
    feed = {"x": rng.standard_normal((3, 4)).astype(np.float32), "y": rng.standard_normal(4).astype(np.float32)}
    flat = [a for o in ort.InferenceSession(model).run(None, feed) for a in (o if isinstance(o, list) else [o])]
    return cuvil.compile(model).save(tmp_path_factory.mktemp("seq") / "a"), feed, flat


RANGES = st.lists(st.integers(-2, 8), min_size=0, max_size=3)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(seqs=st.none() | st.integers() | st.text(max_size=3) | st.dictionaries(st.text(max_size=3), RANGES, max_size=3),
       names=st.none() | st.lists(st.text(max_size=3), max_size=8), reseal=st.booleans())
def test_fuzz_output_sequences(built_sequences, tmp_path_factory, seqs, names, reseal):
    """Edited output_sequences / output_names (resealed or not): refused with a CuvilError, or every
    array comes back, in order, whatever grouping the edit made."""
    src, feed, flat = built_sequences
    d = tmp_path_factory.mktemp("edit") / "a"
    shutil.copytree(src, d)
    m = json.loads((d / "manifest.json").read_text())
    m["output_sequences"], m["output_names"] = seqs, names
    if reseal:
        m["content_hash"] = artifact._content_hash(m)
    (d / "manifest.json").write_text(json.dumps(m))
    try:
        outs = cuvil.InferenceSession(str(d)).run(None, feed)
    except cuvil.CuvilError:
        return
    got = [a for o in outs for a in (o if isinstance(o, list) else [o])]
    assert len(got) == len(flat)
    for a, b in zip(got, flat):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(split=st.none() | st.integers(-3, 1 << 40) | st.lists(st.integers(-3, 1 << 33), max_size=4),
       axis=st.integers(-4, 4), keepdims=st.integers(0, 1), pos=st.integers(-(1 << 62), 1 << 62),
       op=st.sampled_from(["SequenceAt", "SequenceInsert", "SequenceErase"]), cat_axis=st.integers(-4, 4),
       new_axis=st.integers(0, 1))
def test_fuzz_hostile_sequence_graphs(split, axis, keepdims, pos, op, cat_axis, new_axis):
    """Hostile numbers in sequence ops (split sizes, axes, positions): the frontend converts the graph
    or raises a CuvilError; a graph it converts gives the ONNX reference evaluator's answer (ONNX
    Runtime 1.2x squeezes SplitToSequence's parts for a scalar split with keepdims=0, which the spec
    says is ignored once split is given, and fails for a scalar split of 2 there)."""
    from onnx import numpy_helper
    init = [numpy_helper.from_array(np.array(pos, np.int64), "p")]
    split_in = []
    if split is not None:
        init.append(numpy_helper.from_array(np.array(split, np.int64), "split"))
        split_in = ["split"]
    seq_op = {"SequenceAt": h.make_node("SequenceAt", ["s", "p"], ["e"]),
              "SequenceInsert": h.make_node("SequenceInsert", ["s", "y", "p"], ["s2"]),
              "SequenceErase": h.make_node("SequenceErase", ["s", "p"], ["s2"])}[op]
    tail = [h.make_node("Identity", ["e"], ["out"])] if op == "SequenceAt" else \
        [h.make_node("ConcatFromSequence", ["s2"], ["out"], axis=cat_axis, new_axis=new_axis)]
    model = _model([h.make_node("SplitToSequence", ["x"] + split_in, ["s"], axis=axis, keepdims=keepdims), seq_op] + tail,
                   [v("x", T.FLOAT, [3, 4]), v("y", T.FLOAT, [1, 4])], [v("out", T.FLOAT, None)], init)
    try:
        cm = cuvil.compile(model)
    except cuvil.CuvilError:
        return
    feed = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": np.ones((1, 4), np.float32)}
    from onnx.reference import ReferenceEvaluator
    try:
        want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, feed)
    except Exception:  # noqa: BLE001 - the reference refusing what cuvil accepted is a finding
        pytest.fail(f"cuvil compiled a graph the ONNX reference refuses: split={split} axis={axis} pos={pos} {op}")
    _same(cm.run(*feed.values()), want)


def test_bad_sequence_graphs_are_clean_errors():
    """A sequence holding a missing value, a graph listing an output twice, a graph whose only output
    is an empty sequence: each a CuvilError naming the problem, never a stray exception."""
    x = v("x", T.FLOAT, [2])
    seq = h.make_tensor_sequence_value_info
    cases = [
        ([h.make_node("SequenceConstruct", ["x", ""], ["s"])], [seq("s", T.FLOAT, None)], "not a tensor"),
        ([h.make_node("SequenceConstruct", ["x"], ["s"])], [seq("s", T.FLOAT, None), seq("s", T.FLOAT, None)], "twice"),
        ([h.make_node("SequenceEmpty", [], ["s"])], [seq("s", T.FLOAT, None)], "empty sequences"),
    ]
    for nodes, outs, why in cases:
        with pytest.raises(cuvil.CuvilError, match=why):
            cuvil.compile(_model(nodes, [x], outs))
