"""The torch frontend's two paths: export's graph converted directly (no run_decompositions) when
every op in it is known, else the core-ATen decomposed graph. Both must match eager."""
import numpy as np
import pytest
import torch

import cuvil
from cuvil.frontend import torch as torch_frontend

from . import models


def _path_and_check(model, args):
    _, _, decomposed = torch_frontend.from_exported(torch_frontend.export(model, args))
    with torch.no_grad():
        expected = model(*args)
    got = cuvil.compile(model, args)(*args)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
    return "decomposed" if decomposed else "direct"


class InPlaceOnIntermediate(torch.nn.Module):
    """In-place ops on a tensor no view aliases: a read before the mutation sees the old value."""

    def forward(self, x):
        y = x * 2
        z = y + 1
        y.add_(3)
        y.relu_()
        return y * z


class InPlaceThroughView(torch.nn.Module):
    """A write through a view changes the base: only the decomposed graph expresses that."""

    def forward(self, x):
        y = x * 2
        y.view(-1).add_(1)
        return y - 1


class TrainingDropout(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.0, training=True) + 1


def test_in_place_on_intermediate_converts_directly():
    assert _path_and_check(InPlaceOnIntermediate().eval(), (torch.randn(3, 5),)) == "direct"


def test_write_through_a_view_falls_back_to_decomposition():
    assert _path_and_check(InPlaceThroughView().eval(), (torch.randn(3, 5),)) == "decomposed"


def test_conv_bn_relu_residual_pool_linear_direct():
    m, args = models.resnet()
    _, _, decomposed = torch_frontend.from_exported(torch_frontend.export(m, args))
    assert not decomposed        # correctness against eager: test_models.py


@pytest.mark.parametrize("name", ["gpt2"])
def test_unknown_op_falls_back(name):
    m, args = models.ALL[name]()
    _, _, decomposed = torch_frontend.from_exported(torch_frontend.export(m, args))
    assert decomposed            # aten.diff (the causal mask) has no direct handler
