"""Resampling op handlers.

Resize / Upsample as separable per-axis linear maps computed at compile time, and GridSample with its
taps gathered from the flattened input and their weights computed pointwise."""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...errors import ShapeError
from .helpers import Unsupported, dtype_of, norm_axis, shape_of, transpose
from .registry import handler


# ---- resize: separable per-axis linear maps computed at compile time ------------------------------
def _resize_coeff_fn(mode, nearest_mode, cubic_a, antialias):
    from onnx.reference.ops import op_resize as R
    if mode == "nearest":
        return lambda x, s: R._nearest_coeffs(x, mode=nearest_mode)
    if mode == "cubic":
        f = R._cubic_coeffs_antialias if antialias else R._cubic_coeffs
        return lambda x, s: f(x, s, A=cubic_a)
    if mode == "linear":
        return R._linear_coeffs_antialias if antialias else R._linear_coeffs
    raise Unsupported(f"mode {mode!r}")


@handler("Resize", "Upsample")
def _resize(c):
    x = c.inp(0)
    sh = shape_of(x)
    r = len(sh)
    if not all(isinstance(d, int) for d in sh):
        raise Unsupported("symbolic input shape")
    mode = c.attr("mode", "nearest")
    if c.node.op_type == "Upsample" or c.opset < 11:
        ctm, nearest_mode = "asymmetric", "floor"
        if c.node.op_type == "Upsample" and c.opset < 9:
            scales = c.attr("scales")
        else:
            scales = c.known(1, "scales")
            scales = None if scales is None else [float(v) for v in np.asarray(scales).ravel()]
        sizes, roi, axes = None, None, None
        if mode == "bilinear":
            mode = "linear"
    else:
        ctm = c.attr("coordinate_transformation_mode", "half_pixel")
        nearest_mode = c.attr("nearest_mode", "round_prefer_floor")
        roi = c.known(1, "roi")
        sc = c.known(2, "scales")
        sz = c.known(3, "sizes")
        scales = [float(v) for v in np.asarray(sc).ravel()] if sc is not None and sc.size else None
        sizes = [int(v) for v in np.asarray(sz).ravel()] if sz is not None and sz.size else None
        axes = c.attr("axes")
        roi = None if roi is None or roi.size == 0 else [float(v) for v in roi.ravel()]
    policy = c.attr("keep_aspect_ratio_policy", "stretch")
    excl = bool(c.attr("exclude_outside", 0))
    extrap = float(c.attr("extrapolation_value", 0.0))
    try:
        fct = _resize_coeff_fn(mode, nearest_mode, c.attr("cubic_coeff_a", -0.75), c.attr("antialias", 0))
        from onnx.reference.ops import op_resize as R
    except ImportError:
        raise Unsupported("needs onnx's reference resize helpers") from None
    # output sizes and scales, exactly as onnx's reference computes them
    if axes is not None:
        axes = [norm_axis(a, r) for a in axes]
        if scales is not None:
            full = [1.0] * r
            for i, d in enumerate(axes):
                full[d] = scales[i]
            scales = full
        if sizes is not None:
            full = list(sh)
            for i, d in enumerate(axes):
                full[d] = sizes[i]
            sizes = full
        if roi is not None:
            full = [0.0] * r + [1.0] * r
            for i, d in enumerate(axes):
                full[d], full[r + d] = roi[i], roi[len(axes) + i]
            roi = full
    else:
        axes = list(range(r))
    if sizes is not None:
        scales = [sizes[i] / sh[i] for i in range(r)]
        if policy != "stretch":
            s = min(scales[a] for a in axes) if policy == "not_larger" else max(scales[a] for a in axes)
            scales = [s if i in axes else 1.0 for i in range(r)]
            sizes = [int(s * sh[i] + 0.5) if i in axes else sh[i] for i in range(r)]
    elif scales is not None:
        if len(scales) != r:
            raise ShapeError(f"{len(scales)} scales for rank {r}")
        sizes = [int(v) for v in (np.array(scales) * np.array(sh))]
    else:
        raise ShapeError("Resize needs scales or sizes")
    dt = dtype_of(x)
    y = x
    for ax in axes:
        n, m, s = sh[ax], int(sizes[ax]), float(scales[ax])
        if math.isclose(s, 1.0) and m == n and (roi is None or (math.isclose(roi[ax], 0.0) and
                                                               math.isclose(roi[ax + r], 1.0))):
            continue
        aroi = None if roi is None else [roi[ax], roi[ax + r]]
        kw = dict(roi=aroi, exclude_outside=excl, coordinate_transformation_mode=ctm)
        W = R._interpolate_1d_along_axis(np.eye(n), 0, s, m, fct, extrapolation_value=0.0, **kw)
        E = R._interpolate_1d_along_axis(np.zeros((n, 1)), 0, s, m, fct, extrapolation_value=1.0, **kw)[:, 0] != 0
        onehot = np.all((W == 0) | (W == 1), axis=1) & (W.sum(axis=1) == 1)
        if np.all(onehot | E):
            idx = np.where(E, 0, W.argmax(axis=1)).astype(np.int64)
            y = c.op("gather", [y, idx], axis=ax)
        else:
            if not dt.startswith(("float", "bfloat")):
                raise Unsupported(f"{mode} resize of {dt}")
            perm = [i for i in range(r) if i != ax] + [ax]
            inv = [perm.index(i) for i in range(r)]
            yt = transpose(c, y, perm)
            yt = c.op("matmul", [yt, np.ascontiguousarray(W.T).astype(dt)])
            y = transpose(c, yt, inv)
        if E.any():
            mask = E.reshape([m] + [1] * (r - ax - 1))
            y = c.op("where", [mask, c.scalar(extrap, dt), y])
    return y


# ---- GridSample: taps gathered from the flattened input, weights computed pointwise ---------------
def _gs_reflect(c, v, lo, hi, S):
    def op(name, *a):
        return c.op(name, list(a))
    rng = S(hi - lo)

    def fold(dx):
        n = op("floor", op("div", dx, rng))
        r = op("sub", dx, op("mul", n, rng))
        even = op("eq", op("sub", n, op("mul", S(2), op("floor", op("div", n, S(2))))), S(0))
        return r, even
    rb, eb = fold(op("sub", S(lo), v))
    ra, ea = fold(op("sub", v, S(hi)))
    below = op("where", eb, op("add", S(lo), rb), op("sub", S(hi), rb))
    above = op("where", ea, op("sub", S(hi), ra), op("add", S(lo), ra))
    return op("where", op("lt", v, S(lo)), below, op("where", op("gt", v, S(hi)), above, v))


@handler("GridSample")
def _grid_sample(c):
    x, grid = c.inp(0), c.inp(1)
    mode = c.attr("mode", "linear" if c.opset >= 20 else "bilinear")
    pad = c.attr("padding_mode", "zeros")
    mode, pad = (m.decode() if isinstance(m, bytes) else m for m in (mode, pad))
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    ac = bool(c.attr("align_corners", 0))
    shp = shape_of(x)
    N, C, dims = shp[0], shp[1], list(shp[2:])
    k = len(dims)
    out = list(shape_of(grid)[1:-1])
    if not all(isinstance(d, int) for d in list(shp) + out):
        raise Unsupported("symbolic shapes")
    P = int(np.prod(out)) if out else 1
    dt = dtype_of(grid)

    def S(v):
        return c.scalar(v, dt)

    def op(name, *a, **kw):
        return c.op(name, list(a), **kw)
    g = c.reshape(grid, [N, P, k])
    taps = []          # per dim: list of (index tensor (float, integral), weight or None)
    for i in range(k):
        L = dims[i]
        gi = c.reshape(op("slice", g, axis=2, start=k - 1 - i, length=1), [N, P])
        if ac:
            v = op("mul", op("div", op("add", gi, S(1)), S(2)), S(L - 1))
        else:
            v = op("div", op("sub", op("mul", op("add", gi, S(1)), S(L)), S(1)), S(2))
        if mode == "nearest":
            v = op("round", v)
        lo, hi = (0.0, L - 1.0) if ac else (-0.5, L - 0.5)
        if pad == "border":
            oob = op("or", op("lt", v, S(lo)), op("gt", v, S(hi)))
            v = op("where", oob, op("clip", v, min=0.0, max=float(L - 1)), v)
        elif pad == "reflection":
            v = _gs_reflect(c, v, lo, hi, S)
        if mode == "nearest":
            taps.append([(v, None)])
            continue
        x0 = op("floor", v)
        f = op("sub", v, x0)
        if mode == "linear":
            taps.append([(x0, op("sub", S(1), f)), (op("add", x0, S(1)), f)])
        elif mode == "cubic":
            a = -0.75

            def cub(t):     # Keys kernel on |t|, t in [0, 2]
                t1 = op("mul", op("mul", t, t), t)
                t2 = op("mul", t, t)
                near = op("add", op("sub", op("mul", S(a + 2), t1), op("mul", S(a + 3), t2)), S(1))
                far = op("sub", op("add", op("sub", op("mul", S(a), t1), op("mul", S(5 * a), t2)),
                                   op("mul", S(8 * a), t)), S(4 * a))
                return near, far
            _, w0 = cub(op("add", f, S(1)))
            w1, _ = cub(f)
            w2, _ = cub(op("sub", S(1), f))
            _, w3 = cub(op("sub", S(2), f))
            taps.append([(op("add", x0, S(d)), w) for d, w in zip((-1, 0, 1, 2), (w0, w1, w2, w3))])
        else:
            raise Unsupported(f"mode {mode}")
    xf = c.reshape(x, [N, C, int(np.prod(dims))])
    xdt = dtype_of(x)
    acc = None
    strides = [int(np.prod(dims[i + 1:])) for i in range(k)]
    fixed = []
    for i in range(k):
        L = dims[i]
        lst = []
        for t, w in taps[i]:
            valid = op("and", op("ge", t, S(0)), op("le", t, S(L - 1))) if pad == "zeros" else None
            tt = t
            if pad == "reflection":
                lo, hi = (0.0, L - 1.0) if ac else (-0.5, L - 0.5)
                tt = _gs_reflect(c, t, lo, hi, S)
            idx = c.cast(op("clip", tt, min=0.0, max=float(L - 1)), "int64")
            lst.append((idx, w, valid))
        fixed.append(lst)
    for combo in itertools.product(*fixed):
        flat, w, valid = None, None, None
        for i, (idx, wi, vi) in enumerate(combo):
            term = op("mul", idx, c.scalar(strides[i], "int64")) if strides[i] != 1 else idx
            flat = term if flat is None else op("add", flat, term)
            if wi is not None:
                w = wi if w is None else op("mul", w, wi)
            if vi is not None:
                valid = vi if valid is None else op("and", valid, vi)
        idx = op("expand", c.reshape(flat, [N, 1, P]), shape=(N, C, P))
        val = c.cast(op("gather_elements", xf, idx, axis=2), dt)
        if valid is not None:
            w = c.cast(valid, dt) if w is None else op("mul", w, c.cast(valid, dt))
        if w is not None:
            val = op("mul", val, c.reshape(w, [N, 1, P]))
        acc = val if acc is None else op("add", acc, val)
    return c.cast(c.reshape(acc, [N, C] + out), xdt)
