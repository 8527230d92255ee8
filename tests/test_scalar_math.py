"""kernels/smath.h's branch-free log, log1p and softplus, as generated pointwise loops use them in place of
libm (so the loops vectorize), at every x86 width: within a few ulp of float64 numpy over float32's range
(subnormals included) and with libm's values at the edges (0, -0, negatives, +-inf, NaN, -1 for log1p)."""
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
def test_log_log1p_softplus_match_float64(target):
    skip_unless_host_runs(target)
    pos = _positive()
    x_log = np.concatenate([pos, EDGES])
    x_l1p = np.concatenate([pos - 1, -pos[pos < 1], [-1 + 2.0 ** -24, 1e-30, -1e-30], EDGES]).astype(np.float32)
    x_sp = np.concatenate([np.linspace(-120, 120, 4001), [-1e-30, 1e-30, 30.0, -30.0], EDGES]).astype(np.float32)
    g = Graph()
    ins = [Value(TensorType(v.shape, "float32"), n) for n, v in (("a", x_log), ("b", x_l1p), ("c", x_sp))]
    g.inputs = ins
    g.outputs = [g.add("log", [ins[0]]), g.add("log1p", [ins[1]]), g.add("softplus", [ins[2]])]
    cm = compile_graph(g, target=target)
    assert re.search(r"(?<!\w)log(1p)?f?\(", cm.c_source) is None, "a libm call left in the loops"
    got = cm.run(x_log, x_l1p, x_sp)
    with np.errstate(all="ignore"):
        d_sp = x_sp.astype(np.float64)
        want = [np.log(x_log.astype(np.float64)), np.log1p(x_l1p.astype(np.float64)),
                np.log1p(np.exp(-np.abs(d_sp))) + np.maximum(d_sp, 0)]
    for name, x, gv, w in zip(("log", "log1p", "softplus"), (x_log, x_l1p, x_sp), got, want):
        w32 = w.astype(np.float32).astype(np.float64)            # the float64 value rounded, as libm's would be
        u = _ulps(gv, np.where(np.isfinite(w32), w, w32))
        worst = int(np.argmax(u))
        assert u[worst] <= 4, f"{name}({x[worst]!r}) = {gv[worst]!r}, float64 gives {w[worst]!r} ({u[worst]:.1f} ulp)"
