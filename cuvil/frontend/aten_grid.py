"""ATen grid sampling -> IR: grid_sampler_2d / 3d (F.grid_sample; spatial transformers, optical flow,
deformable attention) with (bi/tri)linear, nearest and (2-d) bicubic interpolation and zeros, border
and reflection padding, align_corners both ways. The sample points come from a run-time tensor, so the
taps are gathers at computed indices, by torch's rules (aten/src/ATen/native/GridSampler.h):
unnormalize, pad (clip or reflect), then weight each tap; a tap outside the input reads 0 (its index
clamped in, its value masked)."""
from __future__ import annotations

import math

from .aten import Unsupported, aten, handles

CUBIC_A = -0.75
MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}


def _f(ctx, v, dtype):
    return ctx.scalar(v, dtype)


def _unnormalize(ctx, g, size, align_corners):
    """[-1, 1] -> pixel coordinates: align_corners maps the ends to the corner pixels' centers, else to
    their outer edges."""
    dt = g.dtype
    if align_corners:
        return ctx.add("mul", [ctx.add("add", [g, _f(ctx, 1, dt)]), _f(ctx, (size - 1) / 2, dt)])
    scaled = ctx.add("mul", [ctx.add("add", [g, _f(ctx, 1, dt)]), _f(ctx, size, dt)])
    return ctx.add("div", [ctx.add("sub", [scaled, _f(ctx, 1, dt)]), _f(ctx, 2, dt)])


def _clip(ctx, c, size):
    return ctx.add("clip", [c], {"min": 0.0, "max": float(size - 1)})


def _reflect(ctx, c, twice_low, twice_high):
    """c reflected into [low, high] (torch's reflect_coordinates)."""
    dt = c.dtype
    if twice_low == twice_high:
        return ctx.add("mul", [c, _f(ctx, 0, dt)])
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    c = ctx.add("abs", [ctx.add("sub", [c, _f(ctx, low, dt)])])
    extra = ctx.add("fmod", [c, _f(ctx, span, dt)])
    flips = ctx.add("floor", [ctx.add("div", [c, _f(ctx, span, dt)])])
    even = ctx.add("eq", [ctx.add("fmod", [flips, _f(ctx, 2, dt)]), _f(ctx, 0, dt)])
    return ctx.add("where", [even, ctx.add("add", [extra, _f(ctx, low, dt)]),
                             ctx.add("sub", [_f(ctx, span + low, dt), extra])])


def _pad(ctx, c, size, padding, align_corners):
    if padding == 1:
        return _clip(ctx, c, size)
    if padding == 2:
        c = _reflect(ctx, c, 0, 2 * (size - 1)) if align_corners else _reflect(ctx, c, -1, 2 * size - 1)
        return _clip(ctx, c, size)
    return c


class _Taps:
    """Sums weight * input[i_1, ..., i_d] over taps, for the input flattened to xf [N, C, prod(spatial)]
    and points of shape [N, P]."""

    def __init__(self, ctx, x, n_points):
        self.ctx, self.N, self.C, self.sizes, self.P = ctx, x.shape[0], x.shape[1], list(x.shape[2:]), n_points
        self.xf = ctx.add("reshape", [x], {"shape": [self.N, self.C, math.prod(self.sizes)]})
        self.total = None

    def add(self, coords, weight):
        """coords: per spatial dim (outermost first) the float tap coordinates (whole numbers) [N, P]. The
        index is built in int64 from each coordinate clamped in (NaN to 0): a float index is exact only up
        to 2^24 elements. A tap outside the input (or at NaN) reads 0 whatever its weight, as torch skips
        it (after border or reflection padding only the bilinear corner past the last pixel is)."""
        ctx, dt = self.ctx, weight.dtype
        inside, flat = None, None
        for c, size in zip(coords, self.sizes):
            ok = ctx.add("and", [ctx.add("ge", [c, _f(ctx, 0, dt)]), ctx.add("le", [c, _f(ctx, size - 1, dt)])])
            inside = ok if inside is None else ctx.add("and", [inside, ok])
            c = ctx.add("where", [ctx.add("isnan", [c]), _f(ctx, 0, dt), _clip(ctx, c, size)])
            c = ctx.add("cast", [c], {"to": "int64"})
            flat = c if flat is None else ctx.add("add", [ctx.add("mul", [flat, ctx.scalar(size, "int64")]), c])
        idx = ctx.add("expand", [ctx.add("reshape", [flat], {"shape": [self.N, 1, self.P]})],
                      {"shape": [self.N, self.C, self.P]})
        val = ctx.add("gather_elements", [self.xf, idx], {"axis": 2})
        val = ctx.add("where", [ctx.add("reshape", [inside], {"shape": [self.N, 1, self.P]}), val, _f(ctx, 0, dt)])
        term = ctx.add("mul", [val, ctx.add("reshape", [weight], {"shape": [self.N, 1, self.P]})])
        self.total = term if self.total is None else ctx.add("add", [self.total, term])


def _cubic_weights(ctx, t):
    """Keys' cubic convolution weights of the four taps at offsets -1, 0, 1, 2 from floor, t the fraction."""
    dt, A = t.dtype, CUBIC_A

    def near(d):      # |d| <= 1: ((A + 2) d - (A + 3)) d^2 + 1
        return ctx.add("add", [ctx.add("mul", [ctx.add("sub", [ctx.add("mul", [d, _f(ctx, A + 2, dt)]), _f(ctx, A + 3, dt)]),
                                               ctx.add("mul", [d, d])]), _f(ctx, 1, dt)])

    def far(d):       # 1 < |d| < 2: ((A d - 5A) d + 8A) d - 4A
        inner = ctx.add("add", [ctx.add("mul", [ctx.add("sub", [ctx.add("mul", [d, _f(ctx, A, dt)]), _f(ctx, 5 * A, dt)]), d]),
                                _f(ctx, 8 * A, dt)])
        return ctx.add("sub", [ctx.add("mul", [inner, d]), _f(ctx, 4 * A, dt)])
    one = _f(ctx, 1, dt)
    return [far(ctx.add("add", [t, one])), near(t), near(ctx.add("sub", [one, t])),
            far(ctx.add("sub", [ctx.add("add", [one, one]), t]))]


@handles(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _grid_sampler(ctx, x, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    d = x.type.rank - 2
    if interpolation_mode not in MODES or padding_mode not in (0, 1, 2) or (d == 3 and interpolation_mode == 2):
        raise Unsupported(f"grid sampling mode {interpolation_mode}, padding {padding_mode} in {d} dims")
    if not all(isinstance(s_, int) for s_ in (*x.shape, *grid.shape)):
        raise Unsupported("grid sampling at a symbolic size")
    N, sizes, out = x.shape[0], list(x.shape[2:]), list(grid.shape[1:-1])
    P = math.prod(out)
    g = ctx.add("reshape", [grid], {"shape": [N, P, d]})
    # the grid's last axis is (x, y[, z]): the innermost spatial dim first
    coords = [_unnormalize(ctx, ctx.add("reshape", [ctx.add("slice", [g], {"axis": 2, "start": d - 1 - k, "step": 1,
                                                                                 "length": 1})], {"shape": [N, P]}),
                           sizes[k], align_corners) for k in range(d)]
    taps = _Taps(ctx, x, P)
    dt = coords[0].dtype
    one = _f(ctx, 1, dt)

    def pad(c, k):
        return _pad(ctx, c, sizes[k], padding_mode, align_corners)
    if MODES[interpolation_mode] == "bicubic":       # padding applies to each tap's coordinate
        base = [ctx.add("floor", [c]) for c in coords]
        w = [_cubic_weights(ctx, ctx.add("sub", [c, b])) for c, b in zip(coords, base)]
        for j in range(4):
            for i in range(4):
                taps.add([pad(ctx.add("add", [base[0], _f(ctx, j - 1, dt)]), 0),
                          pad(ctx.add("add", [base[1], _f(ctx, i - 1, dt)]), 1)],
                         ctx.add("mul", [w[0][j], w[1][i]]))
    elif MODES[interpolation_mode] == "nearest":
        taps.add([ctx.add("round", [pad(c, k)]) for k, c in enumerate(coords)],
                 ctx.add("expand", [one], {"shape": list(coords[0].shape)}))
    else:                                            # (bi/tri)linear: the 2^d corners around each point
        coords = [pad(c, k) for k, c in enumerate(coords)]
        lows = [ctx.add("floor", [c]) for c in coords]
        frac = [ctx.add("sub", [c, lo]) for c, lo in zip(coords, lows)]
        for corner in range(2 ** d):
            picks, weight = [], None
            for k in range(d):
                up = corner >> (d - 1 - k) & 1
                picks.append(ctx.add("add", [lows[k], one]) if up else lows[k])
                wk = frac[k] if up else ctx.add("sub", [one, frac[k]])
                weight = wk if weight is None else ctx.add("mul", [weight, wk])
            taps.add(picks, weight)
    return ctx.add("reshape", [taps.total], {"shape": [N, x.shape[1], *out]})
