"""F.grid_sample compiled (frontend/aten_grid.py) against torch eager: every interpolation mode, padding
mode and align_corners setting in one module per spatial rank, with sample points outside [-1, 1] (the
padding rules) and at odd sizes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the cases compile torch modules and compare with eager")

PADDINGS = ("zeros", "border", "reflection")


class _Sampler(torch.nn.Module):
    def __init__(self, modes):
        super().__init__()
        self.combos = list(itertools.product(modes, PADDINGS, (False, True)))

    def forward(self, x, grid):
        return tuple(torch.nn.functional.grid_sample(x, grid, mode=m, padding_mode=p, align_corners=a)
                     for m, p, a in self.combos)


@pytest.mark.parametrize("rank", [2, 3])
def test_grid_sample_matches_eager(tmp_path, rank):
    import cuvil
    g = torch.Generator().manual_seed(rank)
    if rank == 2:
        x, grid = torch.randn(2, 3, 5, 7, generator=g), torch.rand(2, 4, 6, 2, generator=g) * 3 - 1.5
        modes = ("bilinear", "nearest", "bicubic")
    else:
        x, grid = torch.randn(1, 2, 3, 4, 5, generator=g), torch.rand(1, 2, 3, 4, 3, generator=g) * 3 - 1.5
        modes = ("bilinear", "nearest")
    m = _Sampler(modes).eval()
    cm = cuvil.compile(m, (x, grid), cache_dir=str(tmp_path))
    grid2 = torch.rand(grid.shape, generator=g) * 2.4 - 1.2          # other points, same artifact
    for pts in (grid, grid2):
        with torch.no_grad():
            want = m(x, pts)
        for combo, got, w in zip(m.combos, cm.run(x.numpy(), pts.numpy()), want):
            np.testing.assert_allclose(got, w.numpy(), rtol=1e-4, atol=1e-5, err_msg=str(combo))


def test_grid_sample_edge_values(tmp_path):
    """A tap outside the input under zeros padding reads 0 even where the clamped pixel is inf; a NaN
    sample point gives NaN for that point (as torch), the others stay right."""
    import cuvil
    x = torch.tensor([[[[0.0, 1.0], [2.0, float("inf")]]]])
    grid = torch.tensor([[[[3.0, 3.0], [float("nan"), 0.0], [0.5, -0.25]]]])
    m = _Sampler(("bilinear", "nearest")).eval()
    cm = cuvil.compile(m, (x, grid), cache_dir=str(tmp_path))
    with torch.no_grad():
        want = m(x, grid)
    for combo, got, w in zip(m.combos, cm.run(x.numpy(), grid.numpy()), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6, err_msg=str(combo))
