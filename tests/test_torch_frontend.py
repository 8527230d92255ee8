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


def test_bfloat16_checkpoint_in_and_out(tmp_path):
    """A model cast to bfloat16 (as checkpoints are loaded): bf16 inputs, weights and outputs, computed in
    float32 between casts; verify=True allows two bf16 units in the last place (one rounding per chain,
    not per op); the saved artifact takes and returns bf16 torch tensors (numpy: ml_dtypes')."""
    import cuvil
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(torch.bfloat16).eval()
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    cm = cuvil.compile(m, (x,), verify=True, cache_dir=str(tmp_path / "c"))
    with torch.no_grad():
        want = m(x)
    got = cm(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -6)
    cm.save(tmp_path / "m.cuvil")
    loaded = cuvil.load(tmp_path / "m.cuvil")
    import ml_dtypes
    assert loaded(x).dtype == torch.bfloat16
    assert loaded.run(x.view(torch.int16).numpy().view(ml_dtypes.bfloat16))[0].dtype == ml_dtypes.bfloat16


class _Fold(torch.nn.Module):
    """F.fold (col2im: MobileViTV2's folding), which export writes as an index_put with a whole dim first."""

    def forward(self, x):
        return torch.nn.functional.fold(x, output_size=(5, 6), kernel_size=(2, 3), stride=(1, 2), padding=1)


class _PutWholeDimFirst(torch.nn.Module):
    def forward(self, x, v):
        y = x.clone()
        y[:, torch.tensor([0, 2])] = v
        return y


class _AddApart(torch.nn.Module):
    """Index tensors apart (torch puts their broadcast dims first), read and accumulated."""

    def forward(self, x, v):
        y = x.clone()
        y[:, torch.tensor([[1], [3]]), :, torch.tensor([0, 2, -1])] += v
        return y + x[torch.tensor([1, 0]), :, torch.tensor([2, 0])].sum()


class _PutAdjacentAfterWhole(torch.nn.Module):
    def forward(self, x, v):
        y = x.clone()
        y[:, torch.tensor([1, 0]), torch.tensor([2, -2])] = v
        return y


class _OneHot(torch.nn.Module):
    """F.one_hot, whose export carries a check of the classes' range (aten._assert_async.msg)."""

    def forward(self, ids):
        return torch.nn.functional.one_hot(ids, 5).float() * 2


@pytest.mark.parametrize("model, args", [
    (_Fold(), (torch.randn(2, 18, 18),)),
    (_PutWholeDimFirst(), (torch.randn(3, 4), torch.randn(3, 2))),
    (_AddApart(), (torch.randn(2, 4, 3, 3), torch.randn(2, 3, 2, 3))),
    (_PutAdjacentAfterWhole(), (torch.randn(2, 3, 4, 5), torch.randn(2, 2, 5))),
    (_OneHot(), (torch.randint(0, 5, (2, 7)),))], ids=lambda v: type(v).__name__ if isinstance(v, torch.nn.Module) else "")
def test_index_writes_beside_whole_dims_and_one_hot_match_eager(model, args):
    """The ops the transformers sweep (benchmarks/zoo_sweep.py) found missing: MobileViTV2's fold and
    LongT5's one_hot."""
    with torch.no_grad():
        want = model(*args)
    got = cuvil.compile(model, args).run(*[a.numpy() for a in args])[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel,stride,bias", [((2, 2), 2, True), ((3, 2), (3, 2), False), ((3, 3), 2, True)])
def test_transposed_conv_by_patches_matches_eager(kernel, stride, bias):
    """A transposed conv whose kernel equals its stride (UNet's upsampling) runs as one GEMM into patches, no
    conv over the stride's zeros (frontend/aten._patches_transposed); one whose kernel overlaps (3x3, stride 2)
    keeps the spread-input conv. Both match eager, batch 2, bias or not."""
    torch.manual_seed(0)
    m = torch.nn.ConvTranspose2d(6, 5, kernel, stride, bias=bias).eval()
    x = torch.randn(2, 6, 7, 9)
    cm = cuvil.compile(m, (x,))
    ops = [n.op for n in cm.graph.nodes]
    assert ("conv" in ops) == (kernel == (3, 3)), ops
    with torch.no_grad():
        np.testing.assert_allclose(cm(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-5)
