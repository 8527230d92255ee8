"""ATen ops that common models need beyond the tuned set (issue 39): group norm, vector norms
(F.normalize), upsampling in every mode, adaptive average pooling, top-k and sort, segment_reduce,
max-pool backward, matrix_exp, resize_. Each compiled module is checked against torch eager."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cuvil


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def check(module, *xs, rtol=1e-5, atol=1e-5):
    module = module.eval()
    with torch.no_grad():
        want = module(*xs)
    got = cuvil.compile(module, xs)(*xs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = g.numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
        assert g.shape == tuple(w.shape) and g.dtype == w.numpy().dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("groups,channels,affine,shape", [
    (4, 16, True, (2, 16, 5, 7)), (1, 6, False, (3, 6, 4)), (6, 6, True, (1, 6, 3, 3, 2))])
def test_group_norm(groups, channels, affine, shape):
    torch.manual_seed(0)
    m = torch.nn.GroupNorm(groups, channels, affine=affine)
    if affine:
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
    check(torch.nn.Sequential(m, torch.nn.SiLU()), torch.randn(*shape) * 3 + 1)


@pytest.mark.parametrize("ord,dim,keepdim", [(2, -1, False), (1, (0, 2), True), (float("inf"), None, False),
                                             (-float("inf"), 1, True), (0, -1, False), (3.0, 1, False)])
def test_vector_norm(ord, dim, keepdim):
    x = torch.randn(3, 4, 5)
    x[0, 0, :2] = 0
    check(Fn(lambda x: torch.linalg.vector_norm(x, ord, dim, keepdim)), x, rtol=1e-5)


def test_normalize_after_mean_pooling():
    """sentence-transformers' pipeline after the encoder: masked mean pooling, then L2 normalization."""
    def pool(h, mask):
        m = mask.unsqueeze(-1).float()
        return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), p=2, dim=1)
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    check(Fn(pool), torch.randn(2, 7, 16), mask)


RESAMPLE = [
    ("nearest", None, (7, 9), None), ("nearest", None, None, 2.0), ("nearest", None, None, 0.5),
    ("nearest", None, (3, 13), None),
    ("bilinear", False, None, 2.0), ("bilinear", True, None, 2.0), ("bilinear", False, (4, 11), None),
    ("bilinear", True, (9, 4), None), ("bilinear", False, None, 1.7),
    ("bicubic", False, None, 2.0), ("bicubic", True, (8, 5), None),
]


@pytest.mark.parametrize("mode,align,size,scale", RESAMPLE)
def test_interpolate_2d(mode, align, size, scale):
    kw = {} if align is None else {"align_corners": align}
    check(Fn(lambda x: F.interpolate(x, size=size, scale_factor=scale, mode=mode, **kw)), torch.randn(2, 3, 6, 7),
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,shape,size", [("linear", (2, 3, 7), (12,)), ("nearest", (2, 3, 7), (3,)),
                                             ("trilinear", (1, 2, 3, 4, 5), (5, 3, 8)),
                                             ("nearest", (1, 2, 3, 4, 5), (6, 8, 4))])
def test_interpolate_1d_3d(mode, shape, size):
    kw = {"align_corners": False} if mode != "nearest" else {}
    check(Fn(lambda x: F.interpolate(x, size=size, mode=mode, **kw)), torch.randn(*shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align", [False, True])
def test_antialiased_resize(mode, align):
    """antialias=True (torchvision's Resize on tensors): shrinking by non-integer factors along one axis,
    growing along the other, at once."""
    check(Fn(lambda x: F.interpolate(x, size=(5, 13), mode=mode, align_corners=align, antialias=True)),
          torch.randn(2, 3, 17, 9), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,out", [((2, 3, 7, 9), (3, 4)), ((1, 4, 8, 8), (2, 4)), ((1, 2, 5, 5), (1, 1)),
                                       ((1, 2, 3, 4), (5, 7)), ((2, 3, 10), (4,))])
def test_adaptive_avg_pool(shape, out):
    pool = torch.nn.AdaptiveAvgPool2d(out) if len(out) == 2 else torch.nn.AdaptiveAvgPool1d(out)
    check(pool, torch.randn(*shape))


@pytest.mark.parametrize("shape,out", [((2, 3, 7, 9), (3, 4)), ((3, 5, 5), (2, 3)), ((1, 2, 5, 6, 7), (2, 4, 3)),
                                       ((2, 3, 10), (4,))])
def test_adaptive_max_pool_with_indices(shape, out):
    """Windows of unequal sizes (the shorter ones' last position repeated), batched and unbatched, 1-3
    spatial dims; the maxima and their flat input positions."""
    torch.manual_seed(0)
    pool = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}[len(out)]
    check(Fn(lambda x: pool(x, out, return_indices=True)), torch.randn(*shape))


def test_pooling_in_three_dims():
    """max_pool3d with indices (strides, pads, dilation, ceil mode) and avg_pool3d (3-d CNNs)."""
    torch.manual_seed(0)
    check(Fn(lambda x: (*F.max_pool3d(x, (2, 3, 3), (2, 1, 2), (1, 1, 0), dilation=(1, 2, 1), ceil_mode=True,
                                      return_indices=True),
                        F.avg_pool3d(x, 3, 2, 1, count_include_pad=False))), torch.randn(2, 3, 5, 8, 7))


@pytest.mark.parametrize("k,dim,largest", [(3, -1, True), (2, 0, False), (5, 1, True)])
def test_topk(k, dim, largest):
    x = torch.randperm(60).reshape(5, 12).float()            # distinct values: one right order
    check(Fn(lambda x: torch.topk(x, k, dim=dim, largest=largest)), x)


@pytest.mark.parametrize("descending,stable", [(False, False), (True, False), (False, True), (True, True)])
def test_sort(descending, stable):
    x = torch.tensor([[3., 1., 2., 1., 5., 2.], [0., -1., 7., 7., 7., -2.]])
    if stable:
        fn = lambda x: torch.sort(x, dim=-1, descending=descending, stable=True)
        check(Fn(fn), x)                                   # ties: the lower index first
    else:
        fn = lambda x: torch.sort(x * torch.arange(1., 7.), dim=-1, descending=descending)
        check(Fn(fn), x)                                   # products distinct: no ties


def test_slice_and_select_scatter():
    def f(x, s, r):
        y = torch.slice_scatter(x, s, dim=1, start=1, end=7, step=2)
        return torch.select_scatter(y, r, dim=0, index=-1)
    check(Fn(f), torch.randn(4, 8), torch.randn(4, 3), torch.randn(8))


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    def f(x, i, j, v):
        return torch.index_put(x, (i, j), v, accumulate=accumulate)
    i = torch.tensor([0, 2, -1, 1])
    j = torch.tensor([[1], [3]])                       # broadcasts against i: 2 x 4 positions
    if accumulate:
        i = torch.tensor([0, 2, 0, 1])                 # a repeated position adds up
    check(Fn(f), torch.randn(3, 5, 2), i, j, torch.randn(2))


def test_index_put_rows():
    check(Fn(lambda x, i, v: torch.index_put(x, (i,), v)), torch.randn(6, 4), torch.tensor([4, 0]), torch.randn(2, 4))


def test_as_strided_windows():
    """Overlapping windows of a contiguous tensor (as Swin-style code and unfold produce)."""
    check(Fn(lambda x: torch.as_strided(x * 2, (3, 4, 2), (4, 1, 2), 1)), torch.randn(20))


@pytest.mark.parametrize("bins,lo,hi", [(10, 0.0, 0.0), (7, -1.0, 1.5), (4, 0.0, 0.0)])
def test_histc(bins, lo, hi):
    x = torch.randn(50)
    if bins == 4:
        x = torch.full((9,), 3.0)                       # one value: the range widens by 1 each way
    check(Fn(lambda x: torch.histc(x, bins=bins, min=lo, max=hi)), x)


def test_group_norm_statistics():
    """native_group_norm and native_layer_norm return the mean and 1/std beside the output."""
    def f(x):
        y, m, r = torch.ops.aten.native_group_norm(x, None, None, 2, 6, 12, 3, 1e-5)
        z, m2, r2 = torch.ops.aten.native_layer_norm(x, [3, 4], None, None, 1e-5)
        return y, m, r, z, m2, r2
    check(Fn(f), torch.randn(2, 6, 3, 4) * 2 + 1, rtol=1e-4, atol=1e-5)


def test_gathered_views():
    def f(x):
        return (torch.flip(x, [0, 2]), torch.diagonal(x, 1, 0, 2), torch.diagonal(x, -1, 2, 1),
                x.unfold(2, 3, 2), x.unfold(0, 2, 1))
    check(Fn(f), torch.randn(4, 3, 7))


@pytest.mark.parametrize("kind", ["sum", "prod", "amax", "amin", "add", "src", "value"])
def test_scatter_family(kind):
    index = torch.tensor([[0, 1, 2, 0], [1, 0, 0, 2]])
    def f(x, src):
        if kind == "add":
            return torch.scatter_add(x, 1, index, src)
        if kind == "src":
            return torch.scatter(x, 1, torch.tensor([[0, 1, 3, 2], [3, 2, 1, 0]]), src)
        if kind == "value":
            return torch.scatter(x, 1, index, 2.5)
        return torch.scatter_reduce(x, 1, index, src, reduce=kind)
    check(Fn(f), torch.randn(2, 5), torch.randn(2, 6))


def test_unary_additions_and_rounding():
    def f(x):
        return (torch.special.erfc(x), torch.lgamma(x.abs() + 0.1), torch.exp2(x), torch.trunc(x * 3),
                torch.round(x * 100, decimals=1), torch.round(x * 1000, decimals=-2), torch.cumprod(x, 1))
    check(Fn(f), torch.randn(3, 8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ceil,pad,dil", [(False, 0, 1), (True, 1, 1), (False, 1, 2)])
def test_max_pool_indices(ceil, pad, dil):
    x = torch.randn(2, 3, 9, 8)
    check(Fn(lambda x: F.max_pool2d(x, 3, 2, pad, dil, ceil_mode=ceil, return_indices=True)), x)


def test_avg_pool_divisor_override():
    check(Fn(lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=5)), torch.randn(1, 2, 7, 7))


@pytest.mark.parametrize("running", [True, False])
def test_batch_norm_training_statistics(running):
    """Batch norm in training mode: the batch's own statistics, and the running ones updated."""
    def f(x, w, b, rm, rv):
        if running:
            return torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        return torch.ops.aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    check(Fn(f), torch.randn(4, 3, 5, 2) * 2 + 1, torch.rand(3) + 0.5, torch.randn(3), torch.randn(3),
          torch.rand(3) + 0.5, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("accumulate,value_shape", [(False, ()), (True, (1,)), (False, (4,))])
def test_index_put_boolean_mask(accumulate, value_shape):
    def f(x, m, v):
        return torch.index_put(x, (m,), v, accumulate=accumulate)
    check(Fn(f), torch.randn(3, 4), torch.tensor([True, False, True]), torch.randn(value_shape))


def test_in_place_write_to_an_input_is_refused():
    def f(x, running):
        running.mul_(0.9).add_(x.mean(0) * 0.1)
        return x * 2
    with pytest.raises(cuvil.UnsupportedOpError, match="writes into the model's inputs"):
        cuvil.compile(Fn(f), (torch.randn(3, 4), torch.zeros(4)))


def test_unbatched_adaptive_pool_and_ceil_divisor():
    check(Fn(lambda x: F.adaptive_avg_pool2d(x, (5, 3))), torch.randn(8, 9, 7))
    check(Fn(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=4)), torch.randn(1, 2, 8, 8))


def test_same_padding_and_relu6_fold_into_the_conv():
    """TF-style 'same' padding (an explicit F.pad, uneven) and ReLU6 (a clamp to [0, 6]) become the
    conv's own pads and epilogue activation: no pad or clip op is left to run."""
    from cuvil import api
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 8, 3, stride=2, groups=8)
    pw = torch.nn.Conv2d(8, 16, 3, stride=1)
    m = Fn(lambda x: torch.nn.functional.relu6(pw(F.pad(torch.nn.functional.relu6(conv(F.pad(x, (0, 1, 0, 1)))) * 4,
                                                       (1, 1, 1, 1)))))
    x = torch.randn(1, 8, 15, 16) * 3
    text = api.inspect_stages(m, (x,), stages=("passes",))["passes"]
    assert " pad(" not in text and " clip(" not in text and text.count("act=relu6") == 2, text
    check(m, x)


def test_nanmedian_mode_unbind_pdist():
    """nanmedian (NaNs skipped), mode (the smallest of the most frequent values, the index of its last
    occurrence), unbind and pdist, against eager. (An all-NaN row's median is NaN; torch's index for it
    is its selection algorithm's, unspecified, so not compared.)"""
    x = torch.tensor([[1.0, float("nan"), 3.0, 2.0], [float("nan"), 0.5, float("nan"), -1.0], [5.0, 5.0, 1.0, 1.0]])
    ints = torch.tensor([[3, 1, 3, 1, 2], [4, 4, 4, 0, 0]])
    check(Fn(lambda a, b: (*torch.nanmedian(a, 1), torch.nanmedian(a), *torch.mode(b, 1), *torch.mode(a[2:], -1),
                           *torch.unbind(a, 1))), x, ints)
    check(Fn(lambda a: F.pdist(a, 1.5)), torch.randn(5, 3))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    """Bags from offsets (an empty bag among them, include_last_offset), from rows of 2-d indices,
    per-sample weights (sum), padding_idx left out; the offsets are a run-time input."""
    torch.manual_seed(0)
    weight = torch.randn(10, 4)
    idx, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 6])
    psw = torch.rand(8) if mode == "sum" else None
    check(Fn(lambda i, o: (F.embedding_bag(i, weight, o, mode=mode, per_sample_weights=psw),
                           F.embedding_bag(i, weight, torch.cat([o, o.new_tensor([8])]), mode=mode,
                                           include_last_offset=True, padding_idx=4),
                           F.embedding_bag(i.reshape(2, 4), weight, mode=mode))), idx, offsets)


def test_nonzero_static():
    """Coordinates of the nonzero elements in row-major order, cut at size or padded with fill_value."""
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0], [0.0, 0.0, 3.0]])
    check(Fn(lambda a: (torch.nonzero_static(a, size=2), torch.nonzero_static(a, size=7, fill_value=-5),
                        torch.nonzero_static(a > 1, size=4))), x)


def test_histogram():
    """Bins over the data's range (a single value widened), over a given range (values outside left out,
    the last edge closed), given edges, weights and density."""
    torch.manual_seed(0)
    x, w = torch.randn(40), torch.rand(40)
    edges = torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.5])
    check(Fn(lambda a, b: (*torch.histogram(a, 7), *torch.histogram(a, 5, range=(-1.0, 1.0), weight=b),
                           *torch.histogram(a, edges, density=True), *torch.histogram(a * 0 + 1, 3))), x, w)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce_lengths_and_offsets(reduce, initial):
    """Empty segments (the identity, NaN for an empty mean, or `initial`), inner dims, both spellings."""
    torch.manual_seed(1)
    data = torch.randn(7, 3)
    lengths = torch.tensor([0, 2, 1, 4, 0])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    check(Fn(lambda d: (torch.segment_reduce(d, reduce, lengths=lengths, initial=initial),
                        torch.segment_reduce(d, reduce, offsets=offsets, initial=initial))), data)


@pytest.mark.parametrize("dilation, ceil_mode", [(1, False), ((1, 2), True)])
def test_max_pool_backward_scatters_to_the_maxima(dilation, ceil_mode):
    x = torch.randn(2, 3, 7, 9)

    def pool_grad(x):
        y, idx = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1], dilation, ceil_mode)
        return torch.ops.aten.max_pool2d_with_indices_backward(y * 3 + 1, x, [3, 3], [2, 2], [1, 1], dilation,
                                                                ceil_mode, idx)
    check(Fn(pool_grad), x)


def test_matrix_exp_over_norms():
    """Scaling and squaring: tiny, unit, large (10x) and strongly negative matrices, a zero one, batched."""
    torch.manual_seed(2)
    a = torch.randn(5, 6, 6)
    a[1] *= 1e-4
    a[2] *= 10
    a[3] = -300 * torch.eye(6)
    a[4] = 0
    with torch.no_grad():
        want = torch.linalg.matrix_exp(a.double())
    got = cuvil.compile(Fn(torch.linalg.matrix_exp), (a,))(a).double()
    scale = want.abs().amax(dim=(1, 2), keepdim=True).clamp(min=1e-30)
    assert ((got - want).abs() / scale).max() < 1e-5


def test_resize_to_fewer_elements():
    check(Fn(lambda x: x.clone().resize_(3, 4) * 2), torch.randn(5, 5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunked(reduction):
    """F.linear_cross_entropy's chunked custom op (class weights, an ignored target, label smoothing)
    against the unchunked definition, F.cross_entropy of F.linear."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    torch.manual_seed(3)
    x, w, b, cw = torch.randn(6, 5), torch.randn(4, 5), torch.randn(4), torch.rand(4) + 0.5
    target = torch.tensor([0, 3, 1, 2, 3, 1])
    smoothing = 0.0 if reduction == "none" else 0.1         # the reduction="none" op takes no smoothing
    opts = LinearCrossEntropyOptions(batch_chunk_size=2)
    m = Fn(lambda x, t: F.linear_cross_entropy(x, w, t, linear_bias=b, weight=cw, reduction=reduction,
                                                ignore_index=1, label_smoothing=smoothing, options=opts))
    got = cuvil.compile(m, (x, target))(x, target)
    want = F.cross_entropy(F.linear(x, w, b), target, weight=cw, reduction=reduction, ignore_index=1,
                           label_smoothing=smoothing)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("density", [False, True])
def test_histogramdd(density):
    """Bin counts per dim with and without a range, given edges, weights, values on the last edge."""
    torch.manual_seed(4)
    x = torch.randn(40, 3)
    x[0] = torch.tensor([1.0, 1.0, 1.0])                                     # on the closing edge
    wts = torch.rand(40)
    edges = [torch.tensor([-2.0, -0.5, 0.0, 1.0]), torch.tensor([-1.0, 1.0]), torch.tensor([-3.0, 0.0, 0.5, 3.0])]
    from torch.utils._pytree import tree_leaves
    check(Fn(lambda x, w: tuple(tree_leaves((
        torch.histogramdd(x, [3, 4, 2], density=density),
        torch.histogramdd(x, [2, 2, 5], range=[-1.0, 1.0, -2.0, 2.0, 0.0, 1.0], weight=w, density=density),
        torch.histogramdd(x, edges, density=density))))), x, wts)


def test_hash_tensor_over_dims():
    """xor of the 64-bit patterns: float32 widened to float64, ints to int64; odd lengths; keepdim."""
    torch.manual_seed(5)
    x, n = torch.randn(3, 5, 7), torch.randint(-9, 9, (4, 3))
    check(Fn(lambda x, n: (torch.hash_tensor(x), torch.hash_tensor(x, dim=[0, 2], keepdim=True),
                           torch.hash_tensor(x, dim=1), torch.hash_tensor(n, dim=0))), x, n)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_segment_reduce_keeps_nan(reduce):
    """A NaN in a segment makes its max / min NaN, as torch (a scatter's compare would skip it)."""
    data = torch.tensor([1.0, float("nan"), 3.0, -2.0, 5.0])
    check(Fn(lambda d: torch.segment_reduce(d, reduce, lengths=torch.tensor([2, 0, 3]))), data)
