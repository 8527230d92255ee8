"""C lowering of detection ops: nms_select (ir/ops/detection.py), the greedy loop of non-maximum
suppression. The IoU test is written as the ONNX reference computes it; areas and the intersection are
stored through volatile so the compiler's contraction (-ffp-contract=fast) cannot fuse them into the
sums after them and move a box sitting exactly at the threshold across it."""
from __future__ import annotations

from ...ir import dims as D
from .ctypes_map import CTYPE
from .emit import lowering


def _corners(center, box, pre):
    """C declarations of box's x / y extents (x0 <= x1, y0 <= y1) named with prefix pre."""
    if center:
        return (f"{pre}x0 = {box}[0] - {box}[2] / 2, {pre}x1 = {box}[0] + {box}[2] / 2, "
                f"{pre}y0 = {box}[1] - {box}[3] / 2, {pre}y1 = {box}[1] + {box}[3] / 2;")
    return (f"{pre}x0 = {box}[1] < {box}[3] ? {box}[1] : {box}[3], {pre}x1 = {box}[1] < {box}[3] ? {box}[3] : {box}[1], "
            f"{pre}y0 = {box}[0] < {box}[2] ? {box}[0] : {box}[2], {pre}y1 = {box}[0] < {box}[2] ? {box}[2] : {box}[0];")


@lowering("nms_select")
def lower_nms_select(em, node):
    boxes, scores, order, k, iou, thr = node.inputs
    sel, count = node.outputs
    t = CTYPE[boxes.dtype]
    B, C, N = (D.to_c(d) for d in scores.type.shape)
    BX, SC, ORD, SEL = em.ptr(boxes), em.ptr(scores), em.ptr(order), em.ptr(sel)
    center = node.attrs["center_point_box"]
    passes = f"{SC}[(b * nC + c) * nN + j] > thr" if node.attrs["use_score_threshold"] else "1"
    return [
        "{",
        f"  const int64_t nB = {B}, nC = {C}, nN = {N}, kmax = *(const int64_t *){em.ptr(k)};",
        f"  const {t} iou = *(const {t} *){em.ptr(iou)}, thr = *(const {t} *){em.ptr(thr)};",
        '  if (!(iou >= 0 && iou <= 1)) CUVIL_FAIL("NonMaxSuppression: iou_threshold %g is outside [0, 1]", (double)iou);',
        "  int64_t cnt = 0;",
        f"  memset({SEL}, 0, (size_t)(nB * nC * nN) * 3 * sizeof(int64_t));",
        "  for (int64_t b = 0; b < nB; b++) for (int64_t c = 0; c < nC; c++) {",
        "    const int64_t first = cnt;",
        "    for (int64_t r = 0; r < nN && cnt - first < kmax; r++) {",
        f"      const int64_t j = {ORD}[(b * nC + c) * nN + r];",
        '      if (j < 0 || j >= nN) CUVIL_FAIL("nms_select: box index %lld outside [0, %lld)", (long long)j, (long long)nN);',
        f"      if (!({passes})) continue;",
        f"      const {t} *p = {BX} + (b * nN + j) * 4;",
        f"      const {t} {_corners(center, 'p', 'a')}",
        "      int keep = 1;",
        "      for (int64_t s = first; s < cnt && keep; s++) {",
        f"        const {t} *q = {BX} + (b * nN + {SEL}[s * 3 + 2]) * 4;",
        f"        const {t} {_corners(center, 'q', 'b')}",
        f"        const {t} ix0 = ax0 > bx0 ? ax0 : bx0, ix1 = ax1 < bx1 ? ax1 : bx1;",
        f"        const {t} iy0 = ay0 > by0 ? ay0 : by0, iy1 = ay1 < by1 ? ay1 : by1;",
        "        if (ix1 <= ix0 || iy1 <= iy0) continue;",
        f"        volatile {t} inter = (ix1 - ix0) * (iy1 - iy0), area_a = (ax1 - ax0) * (ay1 - ay0), "
        "area_b = (bx1 - bx0) * (by1 - by0);",
        f"        const {t} ia = inter, aa = area_a, ab = area_b, uni = aa + ab - ia;",
        "        if (ia <= 0 || aa <= 0 || ab <= 0 || uni <= 0) continue;",
        "        if (ia / uni > iou) keep = 0;",
        "      }",
        f"      if (keep) {{ {SEL}[cnt * 3] = b; {SEL}[cnt * 3 + 1] = c; {SEL}[cnt * 3 + 2] = j; cnt++; }}",
        "    }",
        "  }",
        f"  *(int64_t *){em.ptr(count)} = cnt;",
        "}"]
