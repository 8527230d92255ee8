"""kernels/smath.h's branch-free log, log1p, softplus, sin and cos, as generated pointwise loops use them in
place of libm (so the loops vectorize), at every x86 width: within a few ulp of float64 numpy over float32's
range (subnormals included; sin and cos up to 1e6, near multiples of pi/2 too) and with libm's values at the
edges (0, -0, negatives, +-inf, NaN, -1 for log1p)."""
import re

import numpy as np
import pytest

from cuvil.ir.graph import Graph, TensorType, Value

from .util import compile_graph, skip_unless_host_runs


def _positive():
    """Positive floats from the smallest subnormal to the largest float, and around 1."""
    x = np.concatenate([np.logspace(-45, 38.5, 4000), 1 + np.linspace(-1e-3, 1e-3, 401), [1.0, 2.0, 0.5]])
    return x.astype(np.float32)


EDGES = np.array([0.0, -0.0, -1e-30, -1.0, -2.5, np.inf, -np.inf, np.nan], np.float32)


def _ulps(got, want):
    """|got - want| in float32 ulps of want (NaN and infinities must match exactly: 0 or inf)."""
    same = (np.isnan(got) & np.isnan(want)) | (got == want)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - want) / np.maximum(ulp, np.float64(2.0 ** -149))
    return np.where(same, 0.0, np.where(np.isfinite(want) & np.isfinite(got), err, np.inf))


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_log_log1p_softplus_sin_cos_match_float64(target):
    skip_unless_host_runs(target)
    pos = _positive()
    x_log = np.concatenate([pos, EDGES])
    x_l1p = np.concatenate([pos - 1, -pos[pos < 1], [-1 + 2.0 ** -24, 1e-30, -1e-30], EDGES]).astype(np.float32)
    x_sp = np.concatenate([np.linspace(-120, 120, 4001), [-1e-30, 1e-30, 30.0, -30.0], EDGES]).astype(np.float32)
    x_tr = np.concatenate([np.linspace(-1e6, 1e6, 20001), np.linspace(-20, 20, 4001), np.arange(-2000, 2000) * np.pi / 2,
                           [1e-30, -1e-30, 1e-40, 3e-3], EDGES]).astype(np.float32)
    g = Graph()
    ins = [Value(TensorType(v.shape, "float32"), n) for n, v in (("a", x_log), ("b", x_l1p), ("c", x_sp), ("d", x_tr))]
    g.inputs = ins
    ops = ("log", "log1p", "softplus", "sin", "cos")
    g.outputs = [g.add(op, [v]) for op, v in zip(ops, ins + [ins[3]])]
    cm = compile_graph(g, target=target)
    assert re.search(r"(?<!\w)(log(1p)?|sin|cos)f?\(", cm.c_source) is None, "a libm call left in the loops"
    got = cm.run(x_log, x_l1p, x_sp, x_tr)
    with np.errstate(all="ignore"):
        d_sp, d_tr = x_sp.astype(np.float64), x_tr.astype(np.float64)
        want = [np.log(x_log.astype(np.float64)), np.log1p(x_l1p.astype(np.float64)),
                np.log1p(np.exp(-np.abs(d_sp))) + np.maximum(d_sp, 0), np.sin(d_tr), np.cos(d_tr)]
    for name, x, gv, w in zip(ops, (x_log, x_l1p, x_sp, x_tr, x_tr), got, want):
        w32 = w.astype(np.float32).astype(np.float64)            # the float64 value rounded, as libm's would be
        u = _ulps(gv, np.where(np.isfinite(w32), w, w32))
        worst = int(np.argmax(u))
        assert u[worst] <= 4, f"{name}({x[worst]!r}) = {gv[worst]!r}, float64 gives {w[worst]!r} ({u[worst]:.1f} ulp)"
