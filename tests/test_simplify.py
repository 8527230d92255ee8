"""passes/simplify.py's rewrites of linear layers, compiled from torch modules against eager: a batch norm
over a linear layer's rows folded into its weight and bias (LeViT's MLPLayerWithBN), through the reshapes
that flatten and restore the rows, and left alone where another node reads the linear layer's output; a
constant weight with a unit batch dim (a bmm over [1, K, N]) taken as the 2-d weight it is."""
from __future__ import annotations

import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the cases compile torch modules")
import cuvil  # noqa: E402


class LinearBN(torch.nn.Module):
    """LeViT's MLPLayerWithBN: a linear layer without bias, batch norm over its flattened rows."""

    def __init__(self, k, n, also_out=False):
        super().__init__()
        self.linear = torch.nn.Linear(k, n, bias=False)
        self.bn = torch.nn.BatchNorm1d(n)
        self.also_out = also_out
        g = torch.Generator().manual_seed(1)
        self.bn.running_mean.copy_(torch.randn(n, generator=g))
        self.bn.running_var.copy_(torch.rand(n, generator=g) + 0.5)
        self.bn.weight.data.copy_(torch.randn(n, generator=g))
        self.bn.bias.data.copy_(torch.randn(n, generator=g))

    def forward(self, x):
        h = self.linear(x)
        y = self.bn(h.flatten(0, 1)).reshape_as(h)
        return (y, h) if self.also_out else torch.nn.functional.hardswish(y)


class UnitBatchWeight(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1, k, n))
        self.b = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.relu(torch.bmm(x, self.w) + self.b)


def _compile(model, x):
    model = model.eval()
    cm = cuvil.compile(model, (x,), cache_dir=tempfile.mkdtemp())
    got = cm(x.numpy())
    want = model(x)
    for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, tuple) else [want]):
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-4, atol=1e-4)
    return [n.op for n in cm.graph.nodes], cm


@pytest.mark.parametrize("rows,k,n", [(196, 128, 640), (7, 5, 33), (1, 64, 17)])
def test_batch_norm_over_a_linear_layer_folds_into_it(rows, k, n):
    ops, cm = _compile(LinearBN(k, n), torch.randn(1, rows, k))
    assert "batch_norm" not in ops and ops.count("matmul_fused") == 1, ops
    assert "cuvil_batch_norm" not in cm.c_source


def test_batch_norm_stays_where_the_linear_output_is_read_elsewhere():
    ops, _ = _compile(LinearBN(24, 40, also_out=True), torch.randn(2, 9, 24))
    assert "batch_norm" in ops, ops          # the weight is not scaled under the other reader


def test_weight_with_a_unit_batch_dim_is_packed_at_compile_time():
    ops, cm = _compile(UnitBatchWeight(48, 70), torch.randn(1, 13, 48))
    assert ops == ["matmul_fused"], ops
    assert "cuvil_pack_b(" not in cm.c_source
