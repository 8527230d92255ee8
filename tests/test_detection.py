"""Non-maximum suppression (ONNX NonMaxSuppression -> topk + nms_select + bind_dim) against ONNX
Runtime and the ONNX reference evaluator: both box formats, ties, thresholds and the per-class limit
given at run time, the output's row count set by the data."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuvil

onnx = pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402


def _nms_model(B, C, N, center, with_threshold=True):
    v = h.make_tensor_value_info
    ins = ["boxes", "scores", "k", "iou"] + (["thr"] if with_threshold else [])
    inputs = [v("boxes", T.FLOAT, [B, N, 4]), v("scores", T.FLOAT, [B, C, N]), v("k", T.INT64, [1]),
              v("iou", T.FLOAT, [1])] + ([v("thr", T.FLOAT, [1])] if with_threshold else [])
    g = h.make_graph([h.make_node("NonMaxSuppression", ins, ["sel"], center_point_box=center)], "m", inputs,
                     [v("sel", T.INT64, ["n", 3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 11)]).SerializeToString()


def _boxes(rng, B, N, center):
    xy = rng.uniform(0, 10, (B, N, 2)).astype(np.float32)
    wh = rng.uniform(0.5, 4, (B, N, 2)).astype(np.float32)
    if center:
        return np.concatenate([xy, wh], -1)
    corners = np.concatenate([xy, xy + wh], -1)[..., [1, 0, 3, 2]]       # [y1, x1, y2, x2]
    flip = rng.random((B, N)) < 0.3                                     # either corner first
    corners[flip] = corners[flip][:, [2, 3, 0, 1]]
    return corners


@pytest.mark.parametrize("center", [0, 1])
def test_nms_matches_onnxruntime(center):
    B, C, N = 2, 3, 40
    model = _nms_model(B, C, N, center)
    cm, sess = cuvil.compile(model), ort.InferenceSession(model)
    assert "nms_select" in cm.module.manifest["node_ops"]
    rng = np.random.default_rng(center)
    for k, iou, thr in [(5, 0.5, 0.2), (100, 0.3, 0.0), (0, 0.5, 0.0), (3, 0.0, 0.9), (40, 1.0, -1.0)]:
        scores = np.round(rng.random((B, C, N)), 1).astype(np.float32)      # rounded: many ties
        feed = {"boxes": _boxes(rng, B, N, center), "scores": scores, "k": np.array([k], np.int64),
                "iou": np.array([iou], np.float32), "thr": np.array([thr], np.float32)}
        got, want = cm.run(*feed.values())[0], sess.run(None, feed)[0]
        np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(seed=st.integers(0, 2**16), k=st.integers(0, 50), iou=st.sampled_from([0.0, 0.5, 1.0]),
       thr=st.sampled_from([None, 0.5, -np.inf, np.inf, np.nan]), center=st.integers(0, 1))
def test_fuzz_nms_against_the_reference(seed, k, iou, thr, center):
    """Limits and thresholds at their edges (infinite and NaN score thresholds), degenerate boxes (zero width, the same
    box twice): the rows of the ONNX reference evaluator (of ONNX Runtime without a score threshold)."""
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(seed)
    B, C, N = 1, 2, 12
    boxes = _boxes(rng, B, N, center)
    boxes[0, 3] = boxes[0, 4]                  # the same box twice
    boxes[0, 5, 2] = boxes[0, 5, 0]            # no width
    scores = np.round(rng.random((B, C, N)), 1).astype(np.float32)
    model = _nms_model(B, C, N, center, thr is not None)
    feed = {"boxes": boxes, "scores": scores, "k": np.array([k], np.int64), "iou": np.array([iou], np.float32)}
    if thr is not None:
        feed["thr"] = np.array([thr], np.float32)
    if thr is None:        # (the reference evaluator of onnx 1.2x fails without a score threshold)
        want = ort.InferenceSession(model).run(None, feed)[0]
    else:
        want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, feed)[0]
    np.testing.assert_array_equal(_compiled(model).run(*feed.values())[0], want)


_CACHE = {}


def _compiled(model):
    if model not in _CACHE:
        _CACHE[model] = cuvil.compile(model)
    return _CACHE[model]


def test_nms_bad_thresholds_fail_the_run_and_a_negative_limit_keeps_nothing():
    """An iou_threshold outside [0, 1] (NaN and infinities included) is a run-time CuvilError naming it
    (ONNX Runtime refuses it too); max_output_boxes_per_class below 0 keeps no box."""
    model = _nms_model(1, 2, 12, 0)
    cm, rng = _compiled(model), np.random.default_rng(5)
    feed = [_boxes(rng, 1, 12, 0), rng.random((1, 2, 12)).astype(np.float32), np.array([3], np.int64)]
    for iou in (-1.0, 1.5, np.inf, np.nan):
        with pytest.raises(cuvil.CuvilError, match="iou_threshold"):
            cm.run(*feed, np.array([iou], np.float32), np.array([0.0], np.float32))
    feed[2] = np.array([-2], np.int64)
    assert cm.run(*feed, np.array([0.5], np.float32), np.array([0.0], np.float32))[0].shape == (0, 3)


def test_nms_over_a_symbolic_box_count_is_refused():
    model = _nms_model(1, 1, "N", 0)
    with pytest.raises(cuvil.UnsupportedOpError, match="symbolic number of boxes"):
        cuvil.compile(model)


def _roi_model(N, C, H, W, R, opset=16, **attrs):
    v = h.make_tensor_value_info
    g = h.make_graph([h.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], **attrs)], "m",
                     [v("x", T.FLOAT, [N, C, H, W]), v("rois", T.FLOAT, [R, 4]), v("idx", T.INT64, [R])],
                     [v("y", T.FLOAT, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)]).SerializeToString()


@pytest.mark.parametrize("attrs", [
    dict(mode="avg", output_height=3, output_width=4, sampling_ratio=0, spatial_scale=0.5),
    dict(mode="max", output_height=2, output_width=2, sampling_ratio=2, spatial_scale=1.0),
    dict(mode="avg", output_height=5, output_width=3, sampling_ratio=1, spatial_scale=0.25,
         coordinate_transformation_mode="output_half_pixel"),
])
def test_roi_align_matches_onnxruntime(attrs):
    """Rois inside, across and outside the map, smaller than a pixel and reversed, on two images."""
    N, C, H, W = 2, 3, 9, 11
    model = _roi_model(N, C, H, W, 6, **attrs)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    s = 1 / attrs["spatial_scale"]
    rois = np.array([[1, 1, 6, 5], [-3, -2, 4, 3], [8, 6, 14, 12], [2.2, 3.1, 2.4, 3.3], [6, 5, 2, 1], [0, 0, 10.9, 8.9]],
                    np.float32) * np.float32(s)
    idx = np.array([0, 1, 1, 0, 1, 0], np.int64)
    got = cuvil.compile(model).run(x, rois, idx)[0]
    want = ort.InferenceSession(model).run(None, {"x": x, "rois": rois, "idx": idx})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_roi_align_bad_rois_fail_the_run():
    """A batch index outside the batch, and a roi whose sampling grid would be absurd (NaN or huge
    coordinates), are run-time CuvilErrors naming them, never a read outside the image or a hang."""
    model = _roi_model(1, 2, 5, 5, 1, output_height=2, output_width=2)
    cm = cuvil.compile(model)
    x = np.ones((1, 2, 5, 5), np.float32)
    with pytest.raises(cuvil.CuvilError, match="batch index 1"):
        cm.run(x, np.array([[0, 0, 2, 2]], np.float32), np.array([1], np.int64))
    for roi in ([0, 0, np.nan, 2], [0, 0, 1e9, 2]):
        with pytest.raises(cuvil.CuvilError, match="grid per bin"):
            cm.run(x, np.array([roi], np.float32), np.array([0], np.int64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(scale=st.sampled_from([0.5, -1.0, 0.0, 1e300, float("inf"), float("nan")]),
       ratio=st.integers(-3, 6) | st.sampled_from([5000, 1 << 40]), oh=st.integers(-2, 5) | st.just(1 << 40),
       ow=st.integers(-2, 5),
       mode=st.sampled_from(["avg", "max", "median", "avg\"); system(\"x"]),
       ctm=st.sampled_from(["half_pixel", "output_half_pixel", "align_corners"]))
def test_fuzz_roi_align_attributes(scale, ratio, oh, ow, mode, ctm):
    """Hostile RoiAlign attributes from a model file (the numbers reach generated C): a CuvilError at
    compile or run time, or the ONNX reference evaluator's answer (sampling ratios past cuvil's 4096 a
    side are refused before the pure-Python reference would spend hours on them)."""
    from onnx.reference import ReferenceEvaluator
    model = _roi_model(1, 2, 6, 7, 2, mode=mode, output_height=oh, output_width=ow, sampling_ratio=ratio,
                       spatial_scale=scale, coordinate_transformation_mode=ctm)
    x = np.arange(84, dtype=np.float32).reshape(1, 2, 6, 7) / 10
    rois = np.array([[0.5, 1, 4, 5], [2, 0, 6, 3]], np.float32)
    idx = np.zeros(2, np.int64)
    try:
        got = cuvil.compile(model).run(x, rois, idx)[0]
    except cuvil.CuvilError:
        return
    want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, {"x": x, "rois": rois, "idx": idx})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
