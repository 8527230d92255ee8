"""C lowering of detection ops (ir/ops/detection.py): roi_align's bilinear sampling loops, and
nms_select, the greedy loop of non-maximum suppression. The IoU test is written as the ONNX reference computes it; areas and the intersection are
stored through volatile so the compiler's contraction (-ffp-contract=fast) cannot fuse them into the
sums after them and move a box sitting exactly at the threshold across it."""
from __future__ import annotations

from ...ir import dims as D
from ...ir.ops.detection import MAX_ROI_GRID
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


def _sample(axis, lo, size, p, i, grid, extent):
    """C statements placing sample i of bin p along one axis: {axis}l / {axis}h (low and high index),
    {axis}f (the high one's weight), {axis}ok (inside the map, with one pixel of margin)."""
    v = f"{axis}v"
    return [f"double {v} = {lo} + {p} * {size} + ({i} + 0.5) * {size} / {grid};",
            f"const int {axis}ok = !({v} < -1.0 || {v} > {extent});",
            f"if ({v} < 0) {v} = 0;",
            f"int64_t {axis}l = (int64_t){v}, {axis}h = {axis}l + 1; double {axis}f = {v} - (double){axis}l;",
            f"if ({axis}l >= {extent} - 1) {{ {axis}l = {axis}h = {extent} - 1; {axis}f = 0; }}"]


@lowering("roi_align")
def lower_roi_align(em, node):
    x, rois, idx = node.inputs
    y = node.outputs[0]
    a = node.attrs
    t = CTYPE[x.dtype]
    N, C, H, W = (D.to_c(d) for d in x.type.shape)
    R = D.to_c(rois.type.shape[0])
    X, RO, IX, Y = em.ptr(x), em.ptr(rois), em.ptr(idx), em.ptr(y)
    off = 0.5 if a["half_pixel"] else 0.0
    s = int(a["sampling_ratio"])
    grid = "gh" if s <= 0 else str(s)
    if a["mode"] == "avg":
        acc = ["double acc = 0;", "FOR_SAMPLES(acc += w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4)", "acc /= cnt;"]
    else:
        acc = ["double acc = 0; int first = 1;",
               "FOR_SAMPLES({ double m = w1 * v1; if (w2 * v2 > m) m = w2 * v2; if (w3 * v3 > m) m = w3 * v3; "
               "if (w4 * v4 > m) m = w4 * v4; if (first || m > acc) acc = m; first = 0; })"]
    samples = (["for (int64_t iy = 0; iy < gh; iy++) {"] + ["  " + l for l in _sample("y", "y0", "bh", "ph", "iy", grid, "nH")]
               + ["  for (int64_t ix = 0; ix < gw; ix++) {"] + ["    " + l for l in _sample("x", "x0", "bw", "pw", "ix", grid.replace("gh", "gw"), "nW")]
               + ["    const int ok = yok && xok;",
                  "    const double w1 = ok ? (1 - yf) * (1 - xf) : 0, w2 = ok ? (1 - yf) * xf : 0, w3 = ok ? yf * (1 - xf) : 0, "
                  "w4 = ok ? yf * xf : 0;",
                  "    const double v1 = ok ? img[yl * nW + xl] : 0, v2 = ok ? img[yl * nW + xh] : 0, "
                  "v3 = ok ? img[yh * nW + xl] : 0, v4 = ok ? img[yh * nW + xh] : 0;",
                  "    STEP", "  }", "}"])
    expand = lambda step: [l.replace("STEP", step) for l in samples]  # noqa: E731
    body = []
    for line in acc:
        if line.startswith("FOR_SAMPLES("):
            body += expand(line[len("FOR_SAMPLES("):-1] + ";")
        else:
            body.append(line)
    return [
        "{",
        f"  const int64_t nN = {N}, nC = {C}, nH = {H}, nW = {W}, nR = {R}, OH = {a['output_height']}, OW = {a['output_width']};",
        "  for (int64_t r = 0; r < nR; r++) {",
        f"    const int64_t b = {IX}[r];",
        '    if (b < 0 || b >= nN) CUVIL_FAIL("roi_align: batch index %lld outside [0, %lld)", (long long)b, (long long)nN);',
        f"    const {t} *roi = {RO} + r * 4;",
        f"    const double x0 = (double)roi[0] * {a['spatial_scale']!r} - {off}, y0 = (double)roi[1] * {a['spatial_scale']!r} - {off};",
        f"    double w = (double)roi[2] * {a['spatial_scale']!r} - {off} - x0, h = (double)roi[3] * {a['spatial_scale']!r} - {off} - y0;",
        *(["    if (!(w > 1.0)) w = w != w ? w : 1.0;", "    if (!(h > 1.0)) h = h != h ? h : 1.0;"] if not a["half_pixel"] else []),
        "    const double bh = h / OH, bw = w / OW;",
        f"    const double ghd = {s if s > 0 else 'ceil(bh)'}, gwd = {s if s > 0 else 'ceil(bw)'};",
        f"    if (!(fabs(ghd) <= {MAX_ROI_GRID} && fabs(gwd) <= {MAX_ROI_GRID})) "
        f'CUVIL_FAIL("roi_align: roi %lld asks for a %g x %g grid per bin (at most {MAX_ROI_GRID})", (long long)r, ghd, gwd);',
        "    const int64_t gh = (int64_t)ghd, gw = (int64_t)gwd;",
        "    const double cnt = gh * gw > 1 ? (double)(gh * gw) : 1.0;",
        "    for (int64_t c = 0; c < nC; c++) {",
        f"      const {t} *img = {X} + (b * nC + c) * nH * nW;",
        "      for (int64_t ph = 0; ph < OH; ph++) for (int64_t pw = 0; pw < OW; pw++) {",
        *["        " + l for l in body],
        f"        {Y}[((r * nC + c) * OH + ph) * OW + pw] = ({t})acc;",
        "      }",
        "    }",
        "  }",
        "}"]
