"""Object-detection op handlers: NonMaxSuppression and RoiAlign (the IR's roi_align).

NonMaxSuppression sorts each class's scores (topk over every box, ties by index) and hands the greedy
selection to the IR's nms_select (ir/ops/detection.py); its output, one row per kept box, is sized by
the data: padded to batches x classes x boxes rows, then cut by bind_dim."""
from __future__ import annotations

import numpy as np

from ..data_sized import bind, fresh_symbol
from .helpers import Unsupported, dtype_of, shape_of
from .registry import handler
from .regions import flag


@handler("NonMaxSuppression")
def _nms(c):
    boxes, scores = c.inp(0), c.inp(1)
    (B, N, four), (B2, _, N2) = shape_of(boxes), shape_of(scores)
    if four != 4 or B2 != B or N2 != N:
        raise Unsupported(f"boxes {list(shape_of(boxes))} and scores {list(shape_of(scores))}: expected [B, N, 4] and [B, C, N]")
    if not isinstance(N, int):
        raise Unsupported("NonMaxSuppression over a symbolic number of boxes")
    t = str(dtype_of(boxes))
    if str(dtype_of(scores)) != t:
        raise Unsupported(f"boxes of {t} with scores of {dtype_of(scores)}")
    order = c.op("topk", [scores], k=N, axis=-1, largest=True, sorted=True)[1]
    k = flag(c, c.inp(2), "int64") if c.inp(2) is not None else np.array(0, np.int64)
    iou = flag(c, c.inp(3), t) if c.inp(3) is not None else np.array(0, t)
    thr = flag(c, c.inp(4), t) if c.inp(4) is not None else np.array(0, t)
    sel, count = c.op("nms_select", [boxes, scores, order, k, iou, thr], center_point_box=int(c.attr("center_point_box", 0)),
                      use_score_threshold=int(c.inp(4) is not None))
    return bind(lambda op, ins, attrs: c.op(op, ins, **attrs), c.g, sel, count, 0, fresh_symbol(c.g, "nms_rows"))


@handler("RoiAlign")
def _roi_align(c):
    """Opset 16's coordinate_transformation_mode: half_pixel (the default) shifts by half a pixel;
    output_half_pixel, and every RoiAlign before opset 16, does not."""
    x, rois, idx = c.inp(0), c.inp(1), c.inp(2)
    mode = c.attr("coordinate_transformation_mode", "half_pixel" if c.opset >= 16 else "output_half_pixel")
    if mode not in ("half_pixel", "output_half_pixel"):
        raise Unsupported(f"coordinate_transformation_mode {mode!r}")
    rois = c.cast(rois, str(dtype_of(x)))
    return c.op("roi_align", [x, rois, c.cast(idx, "int64")], mode=c.attr("mode", "avg"),
                output_height=int(c.attr("output_height", 1)), output_width=int(c.attr("output_width", 1)),
                sampling_ratio=int(c.attr("sampling_ratio", 0)), spatial_scale=float(c.attr("spatial_scale", 1.0)),
                half_pixel=int(mode == "half_pixel"))
