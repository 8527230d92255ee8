"""Ops of object-detection heads: nms_select (the greedy part of non-maximum suppression) and
roi_align (Mask / Faster R-CNN's pooling of regions).

    nms_select(boxes [B, N, 4], scores [B, C, N], order [B, C, N] int64, max_per_class (0-d int64),
               iou_threshold (0-d), score_threshold (0-d); center_point_box, use_score_threshold)
        -> (selected [B * C * N, 3] int64, count (0-d int64))

For each batch b and class c, boxes are visited in `order` (scores sorted high to low, ties by index);
one is kept when its score passes score_threshold (strictly; only with use_score_threshold) and its IoU
with every box kept for that (b, c) is at most iou_threshold, until max_per_class are kept (none when
it is 0 or less); an iou_threshold outside [0, 1] (NaN included) fails the run, as ONNX Runtime's does. Rows of
(b, c, box) in that order; rows past count are zero. Boxes are [y1, x1, y2, x2] with either corner
first, or [x_center, y_center, width, height] with center_point_box. The arithmetic is the ONNX
reference's, in the boxes' dtype, so a box exactly at the threshold falls the same way.

    roi_align(x [N, C, H, W], rois [R, 4] as [x1, y1, x2, y2], batch_indices [R] int64; mode, output_height,
              output_width, sampling_ratio, spatial_scale, half_pixel) -> [R, C, output_height, output_width]

ONNX RoiAlign: each output bin averages (or takes the max of) a grid of bilinear samples; the grid is
sampling_ratio a side, or, at 0, ceil(bin size) (so it depends on each roi's values). A sample more
than one pixel outside the map counts as 0. "max" takes the largest weighted corner, as the ONNX
reference and ONNX Runtime do."""
from __future__ import annotations

import math

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


def _roi_align_infer(types, attrs, inputs):
    x, rois, idx = types
    if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 4 or idx.rank != 1 or idx.dtype != "int64":
        raise ShapeError(f"roi_align: x {x}, rois {rois}, batch_indices {idx}: expected [N, C, H, W], [R, 4], int64 [R]")
    if rois.dtype != x.dtype:
        raise ShapeError(f"roi_align: rois of {rois.dtype} for x of {x.dtype}")
    if attrs["mode"] not in ("avg", "max"):
        raise ShapeError(f"roi_align: mode {attrs['mode']!r} is not avg or max")
    scale, ratio = attrs["spatial_scale"], attrs["sampling_ratio"]
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and isinstance(ratio, int)
            and attrs["half_pixel"] in (0, 1)):
        raise ShapeError(f"roi_align: spatial_scale {scale!r} must be a finite number, sampling_ratio {ratio!r} an int")
    attrs["spatial_scale"] = float(scale)
    oh, ow = attrs["output_height"], attrs["output_width"]
    if not (isinstance(oh, int) and isinstance(ow, int) and oh > 0 and ow > 0):
        raise ShapeError(f"roi_align: output size {oh} x {ow} must be positive")
    return [TensorType((rois.shape[0], x.shape[1], oh, ow), x.dtype)]


def roi_samples(lo, size, bins, grid, extent):
    """The sampling positions of one axis of one roi: per bin, its grid of points, each as (low index,
    high index, weight of the high one) for bilinear interpolation, or None outside the map."""
    out = []
    for p in range(bins):
        row = []
        for i in range(grid):
            y = lo + p * size + (i + 0.5) * size / grid
            if y < -1.0 or y > extent:
                row.append(None)
                continue
            y = max(y, 0)
            low = int(y)
            if low >= extent - 1:
                row.append((extent - 1, extent - 1, 0.0))
            else:
                row.append((low, low + 1, y - low))
        out.append(row)
    return out


def roi_grid(roi, attrs):
    """(start_y, start_x, bin_h, bin_w, grid_h, grid_w) of one roi [x1, y1, x2, y2] (ONNX RoiAlign)."""
    off = 0.5 if attrs["half_pixel"] else 0.0
    x0, y0, x1, y1 = (float(v) * attrs["spatial_scale"] - off for v in roi)
    w, h = x1 - x0, y1 - y0
    if not attrs["half_pixel"]:
        w, h = max(w, 1.0), max(h, 1.0)
    bh, bw = h / attrs["output_height"], w / attrs["output_width"]
    s = attrs["sampling_ratio"]
    gh = s if s > 0 else np.ceil(h / attrs["output_height"])
    gw = s if s > 0 else np.ceil(w / attrs["output_width"])
    if not (abs(gh) <= MAX_ROI_GRID and abs(gw) <= MAX_ROI_GRID):
        raise ValueError(f"roi_align: a roi {list(roi)} asks for a {gh} x {gw} grid per bin (at most {MAX_ROI_GRID})")
    return y0, x0, bh, bw, int(gh), int(gw)


MAX_ROI_GRID = 4096      # samples per bin side: a roi asking for more (absurd or NaN coordinates) fails the run


def _roi_align_ref(xs, a):
    x, rois, idx = xs
    R, (N, C, H, W) = rois.shape[0], x.shape
    out = np.zeros((R, C, a["output_height"], a["output_width"]), x.dtype)
    for r in range(R):
        if not 0 <= idx[r] < N:
            raise IndexError(f"roi_align: batch index {idx[r]} outside [0, {N})")
        y0, x0, bh, bw, gh, gw = roi_grid(rois[r], a)
        ys, xs_ = roi_samples(y0, bh, a["output_height"], gh, H), roi_samples(x0, bw, a["output_width"], gw, W)
        count = max(gh * gw, 1)
        img = x[idx[r]].astype(np.float64)
        for ph in range(a["output_height"]):
            for pw in range(a["output_width"]):
                vals = []
                for sy in ys[ph]:
                    for sx in xs_[pw]:
                        if sy is None or sx is None:
                            vals.append(np.zeros(C))
                            continue
                        (yl, yh, ly), (xl, xh, lx) = sy, sx
                        corners = [(1 - ly) * (1 - lx) * img[:, yl, xl], (1 - ly) * lx * img[:, yl, xh],
                                   ly * (1 - lx) * img[:, yh, xl], ly * lx * img[:, yh, xh]]
                        vals.append(sum(corners) if a["mode"] == "avg" else np.max(corners, axis=0))
                if a["mode"] == "avg":
                    out[r, :, ph, pw] = sum(vals, np.zeros(C)) / count
                elif vals:
                    out[r, :, ph, pw] = np.max(vals, axis=0)
    return [out]


declare(OpDef("roi_align", {"mode": "avg", "output_height": 1, "output_width": 1, "sampling_ratio": 0,
                            "spatial_scale": 1.0, "half_pixel": 1}, _roi_align_infer, _roi_align_ref, kind="other"))
