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


def test_running_reductions_and_integer_scatter_means_match_eager():
    """logcumsumexp keeps a small early value beside a later large one (a running, not a global,
    shift); an integer scatter mean floors as torch does; frexp at float32's largest exponents."""
    class Ops(torch.nn.Module):
        def forward(self, x, i, s, big):
            return (torch.logcumsumexp(x, 1), torch.zeros(2, dtype=torch.int64).scatter_reduce(0, i, s, "mean",
                    include_self=False), *torch.frexp(big))
    args = (torch.tensor([[-200.0, 0.0, 3.0, -1e4, float("-inf")], [1.0, 2.0, float("-inf"), 5.0, 0.0]]),
            torch.tensor([0, 0, 1]), torch.tensor([-1, -2, 7]), torch.tensor([3e38, -3.4e38, 1.0, 0.0]))
    m = Ops()
    for got, want in zip(cuvil.compile(m, args)(*args), m(*args)):
        torch.testing.assert_close(got, want)
