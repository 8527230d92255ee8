"""Ops of object-detection heads: nms_select, the greedy part of non-maximum suppression.

    nms_select(boxes [B, N, 4], scores [B, C, N], order [B, C, N] int64, max_per_class (0-d int64),
               iou_threshold (0-d), score_threshold (0-d); center_point_box, use_score_threshold)
        -> (selected [B * C * N, 3] int64, count (0-d int64))

For each batch b and class c, boxes are visited in `order` (scores sorted high to low, ties by index);
one is kept when its score passes score_threshold (strictly; only with use_score_threshold) and its IoU
with every box kept for that (b, c) is at most iou_threshold, until max_per_class are kept (none when
it is 0 or less); an iou_threshold outside [0, 1] (NaN included) fails the run, as ONNX Runtime's does. Rows of
(b, c, box) in that order; rows past count are zero. Boxes are [y1, x1, y2, x2] with either corner
first, or [x_center, y_center, width, height] with center_point_box. The arithmetic is the ONNX
reference's, in the boxes' dtype, so a box exactly at the threshold falls the same way."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ..types import TensorType
from .registry import OpDef, declare


def _infer(types, attrs, inputs):
    boxes, scores, order, k, iou, thr = types
    if boxes.rank != 3 or boxes.shape[2] != 4 or scores.rank != 3 or order.shape != scores.shape:
        raise ShapeError(f"nms_select: boxes {boxes}, scores {scores}, order {order}: expected [B, N, 4], [B, C, N], "
                         "and order shaped as scores")
    if order.dtype != "int64" or k.dtype != "int64" or k.rank or iou.rank or thr.rank:
        raise ShapeError("nms_select: order and max_per_class are int64, the thresholds 0-d")
    B, C, N = scores.shape
    return [TensorType((B * C * N, 3), "int64"), TensorType((), "int64")]


def overlaps(a, b, center, iou_threshold):
    """Whether boxes a and b overlap by more than iou_threshold (ONNX's suppress_by_iou)."""
    if center:
        ax0, ax1, bx0, bx1 = a[0] - a[2] / 2, a[0] + a[2] / 2, b[0] - b[2] / 2, b[0] + b[2] / 2
        ay0, ay1, by0, by1 = a[1] - a[3] / 2, a[1] + a[3] / 2, b[1] - b[3] / 2, b[1] + b[3] / 2
    else:
        ax0, ax1 = min(a[1], a[3]), max(a[1], a[3])
        bx0, bx1 = min(b[1], b[3]), max(b[1], b[3])
        ay0, ay1 = min(a[0], a[2]), max(a[0], a[2])
        by0, by1 = min(b[0], b[2]), max(b[0], b[2])
    ix0, ix1, iy0, iy1 = max(ax0, bx0), min(ax1, bx1), max(ay0, by0), min(ay1, by1)
    if ix1 <= ix0 or iy1 <= iy0:
        return False
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    if inter <= 0 or area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return inter / union > iou_threshold


def _ref(xs, a):
    boxes, scores, order, k, iou, thr = xs
    if not 0 <= iou <= 1:
        raise ValueError(f"NonMaxSuppression: iou_threshold {iou} is outside [0, 1]")
    B, C, N = scores.shape
    out = np.zeros((B * C * N, 3), np.int64)
    count = 0
    for b in range(B):
        for c in range(C):
            kept = []
            for j in order[b, c]:
                if len(kept) >= int(k):
                    break
                if a["use_score_threshold"] and not scores[b, c, j] > thr:
                    continue
                if any(overlaps(boxes[b, j], boxes[b, i], a["center_point_box"], iou) for i in kept):
                    continue
                kept.append(j)
                out[count] = (b, c, j)
                count += 1
    return [out, np.array(count, np.int64)]


declare(OpDef("nms_select", {"center_point_box": 0, "use_score_threshold": 0}, _infer, _ref, kind="other"))
