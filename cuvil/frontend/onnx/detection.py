"""Object-detection op handlers: NonMaxSuppression.

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
    (B, N, four), (B2, C, N2) = shape_of(boxes), shape_of(scores)
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
