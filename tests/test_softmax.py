"""softmax and log_softmax (kernels/norm.c) in vectors at every x86 width, against the reference
interpreter (float64): contiguous rows with a scalar tail, columns along a strided axis in whole vectors
and one at a time, and torch's edges (masked -inf, an all -inf row, +inf, NaN, exp's underflow)."""
import numpy as np
import pytest

from cuvil.ir.graph import Graph, TensorType, Value

from .util import check_graph, skip_unless_host_runs


def _scores(shape, axis, seed):
    """Scores spread over exp's range, with edges in the first slices along `axis`'s neighbours."""
    x = np.random.default_rng(seed).uniform(-30, 30, shape).astype(np.float32)
    v = np.moveaxis(x, axis, -1)                      # a view: rows along the axis
    flat = v.reshape(-1, v.shape[-1])
    rows = [np.unravel_index(i, v.shape[:-1]) for i in range(min(6, flat.shape[0]))]
    v[rows[0]][: v.shape[-1] // 2] = -np.inf        # a mask over half the row
    v[rows[1]][:] = -np.inf                          # all masked: 0 / 0
    v[rows[2]][1] = np.inf
    v[rows[3]][2] = np.nan
    v[rows[4]][:] = np.linspace(-120, 0, v.shape[-1])   # terms past exp's underflow
    return x


SHAPES = [((7, 37), 1),          # rows: whole vectors and a scalar tail
          ((3, 300, 35), 1),     # columns: whole vectors, then 3 one at a time
          ((2, 9, 5), 1),        # columns no vector fills
          ((6, 8, 16), 2)]       # rows of exactly one or two vectors


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
def test_softmax_matches_the_reference(target):
    """Each shape through both ops, one graph a target (a build each)."""
    skip_unless_host_runs(target)
    g = Graph()
    g.inputs = [Value(TensorType(shape, "float32"), f"x{i}") for i, (shape, _) in enumerate(SHAPES)]
    g.outputs = [g.add(op, [x], {"axis": axis}) for x, (_, axis) in zip(g.inputs, SHAPES)
                 for op in ("softmax", "log_softmax")]
    xs = [_scores(shape, axis, i) for i, (shape, axis) in enumerate(SHAPES)]
    check_graph(g, xs, rtol=2e-6, atol=1e-6, target=target)
