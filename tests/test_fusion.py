"""Fused kernels vs the reference interpreter on the unfused graph: GEMM/conv epilogues,
attention (masks, causal, grouped heads, layouts) and pointwise chains, at odd sizes that
exercise every remainder path of the micro-kernel (8 x 32 on AVX-512, 6 x 16 on AVX2), the
384-deep K blocks and 120-row M blocks."""
import numpy as np
import pytest

from cuvil.ir import dims
from cuvil.ir.graph import Graph, TensorType, Value

from .util import check_graph

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def ops_of(cm):
    return [n.op for n in cm.graph.nodes]


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (5, 15, 3), (7, 17, 385), (13, 33, 257), (6, 16, 384), (2, 40, 769), (125, 17, 40),
                                   (29, 35, 1003), (1, 170, 400)])   # (29, ...): A packed 8 columns at a time, by both threads;
# (1, 170, 400): the GEMV, its 11 panels as a group of 6 streams and one of 5
@pytest.mark.parametrize("act", ["gelu", "relu", "silu", "gelu_tanh"])
def test_linear_bias_activation(M, N, K, act):
    g = Graph()
    x = Value(TensorType((M, K), "float32"), "x")
    g.inputs = [x]
    y = g.add("matmul", [x, g.const(f32(K, N))])
    y = g.add("add", [y, g.const(f32(N))])
    g.outputs = [g.add(act, [y])]
    cm = check_graph(g, [f32(M, K)])
    assert ops_of(cm) == ["matmul_fused"]


@pytest.mark.parametrize("form", ["bias, scale [N]", "scale [1, 1, N] first", "no bias", "scale read twice",
                                  "scale per row", "scale not finite", "matmul read twice"])
def test_column_scale_folds_into_the_linear_layer(form):
    """mul(matmul(x, W) + b, g), g one constant per column (ConvNeXt's layer scale): W and b scaled at
    compile time, the multiply gone (passes/simplify.fold_scale_into_linear); a scale that is not one per
    column, not finite, or whose operand has other readers is left as it was. Against the reference
    interpreter on the graph as written."""
    g = Graph()
    x = Value(TensorType((2, 7, 24), "float32"), "x")
    g.inputs = [x]
    z = g.add("matmul", [x, g.const(f32(24, 40))])
    y = z if form == "no bias" else g.add("add", [z, g.const(f32(40))])
    scale = {"scale per row": f32(7, 1), "scale [1, 1, N] first": f32(1, 1, 40)}.get(form, f32(40))
    if form == "scale not finite":
        scale[3] = np.inf
    c = g.const(scale)
    out = g.add("mul", [c, y] if form == "scale [1, 1, N] first" else [y, c])
    g.outputs = [g.add("relu", [out])]
    if form == "scale read twice":
        g.outputs.append(g.add("neg", [y]))
    if form == "matmul read twice":
        g.outputs.append(g.add("neg", [z]))
    cm = check_graph(g, [f32(2, 7, 24)])
    if form in ("bias, scale [N]", "scale [1, 1, N] first", "no bias"):
        assert ops_of(cm) == ["matmul_fused"]          # the scale, the bias and the relu in the GEMM
    else:                                              # the multiply kept (alone or in a pointwise chain)
        assert any(op not in ("matmul_fused", "neg") for op in ops_of(cm)), ops_of(cm)


def test_pow_by_a_small_constant_is_its_cheaper_op():
    """pow(x, 2), pow(x, 0.5) and pow(x, -1) run as x * x, sqrt and reciprocal (passes/simplify.pow_by_constant),
    with pow's values at the edges (-0, +-inf, NaN, negatives); pow(x, -0.5) and pow(x, 2.5) stay pow, as does a
    pow whose exponent widens x. Against the reference interpreter (numpy's pow)."""
    g = Graph()
    x = Value(TensorType((4, 10), "float32"), "x")
    g.inputs = [x]
    outs = [g.add("pow", [x, g.const(np.float32(e))]) for e in (2.0, 0.5, -1.0, -0.5, 2.5)]
    outs.append(g.add("pow", [x, g.const(np.full((3, 4, 10), 2.0, np.float32))]))
    g.outputs = outs
    xs = np.abs(f32(4, 10)) * 3
    xs[0, :6] = [-0.0, 0.0, np.inf, -np.inf, np.nan, -2.0]
    check_graph(g, [xs], rtol=1e-6, atol=0)
    from cuvil.passes import simplify
    ops = [n.op for n in simplify.pow_by_constant(g).nodes]
    assert ops == ["mul", "sqrt", "reciprocal", "pow", "pow", "pow"]


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("M,N,K", [(128, 384, 384), (203, 96, 401), (300, 1200, 40)])
def test_rows_split_over_threads(M, N, K, threads):
    """A layer norm then two GEMMs whose rows split between the threads (at least 64 rows a thread,
    N <= 4 M): each thread owns a run of the row blocks and takes from the back of another's once out
    of its own. 3 threads on 2 cores: a thread that is not running has its run taken by the others.
    Odd M leaves a short row tile in the last thread's run."""
    g = Graph()
    x = Value(TensorType((M, K), "float32"), "x")
    g.inputs = [x]
    h = g.add("layer_norm", [x, g.const(f32(K)), g.const(f32(K))])
    y = g.add("gelu", [g.add("add", [g.add("matmul", [h, g.const(f32(K, N))]), g.const(f32(N))])])
    g.outputs = [g.add("add", [g.add("matmul", [y, g.const(f32(N, N))]), y])]
    check_graph(g, [f32(M, K)], rtol=1e-3, atol=1e-3, num_threads=threads)


@pytest.mark.parametrize("cached", [True, False])
def test_gemv_weights_cached_or_streamed(cached, monkeypatch):
    """One row against constant weights in both of the GEMV's forms: weights that stay in the
    last-level cache read without software prefetch, larger ones (forced here) with it; odd K so each
    form's last single K step runs; 700 columns: 22 panels of 32 (AVX-512) or 44 of 16 over 2 threads,
    each thread's share as groups of 6 panels and a shorter one (read side by side, or one at a time
    where one stream reads faster: Zen 5, streamed form)."""
    from cuvil.codegen.c import emit
    monkeypatch.setattr(emit, "weights_fit_in_cache", lambda graph, target: cached)
    g = Graph()
    x = Value(TensorType((1, 401), "float32"), "x")
    g.inputs = [x]
    y = g.add("add", [g.add("matmul", [x, g.const(f32(401, 700))]), g.const(f32(700))])
    g.outputs = [g.add("gelu", [y])]
    cm = check_graph(g, [f32(1, 401)], num_threads=2)
    assert f"NT, {int(cached)});" in (cm.path / "model.c").read_text()


@pytest.mark.parametrize("target", ["native", "x86_64-avx2"])
def test_gemm_tiles_of_each_target(target):
    """Both register tiles (8 rows on AVX-512, 6 on AVX2) with every row remainder, and the A operands
    packed at compile time for them (conv filters through im2col and Winograd): an AVX-512 machine
    builds the AVX2 tile too."""
    from cuvil.target import cpu_flags
    if target != "native" and "avx2" not in cpu_flags():
        pytest.skip(f"this CPU cannot run {target} code")
    for M in range(1, 18):
        g = Graph()
        x = Value(TensorType((M, 40), "float32"), "x")
        g.inputs = [x]
        g.outputs = [g.add("relu", [g.add("matmul", [x, g.const(f32(40, 37))])])]
        check_graph(g, [f32(M, 40)], target=target)
    # im2col inside the GEMM, then Winograd: filters as packed A; last, stride 2 onto 20-wide rows, whose
    # im2col runs are vectors stored whole or in part (kernels/conv.c: copy_run)
    for cout, k, stride, (h, w) in [(19, 5, 1, (12, 12)), (21, 3, 1, (12, 12)), (19, 3, 2, (9, 40))]:
        g = Graph()
        x = Value(TensorType((1, 17, h, w), "float32"), "x")
        g.inputs = [x]
        g.outputs = [g.add("conv", [x, g.const(f32(cout, 17, k, k))],
                           {"strides": [stride, stride], "pads": [(1, 1), (1, 1)]})]
        # outputs are sums of 153 to 425 products of N(0, 1) values (|y| up to ~40); F(4x4)'s transforms
        # keep ~1e-5 of that scale, which an output cancelling to near 0 fails at atol 1e-4 (seen: 2.4e-4)
        cm = check_graph(g, [f32(1, 17, h, w)], atol=1e-3, target=target)
        assert ("winograd" in cm.c_source) == (k == 3 and stride == 1)


@pytest.mark.parametrize("target", ["native", "x86_64-avx2", "x86_64-sse2"])
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
def test_epilogue_activation_accuracy(act, target):
    """The vector exp/erf/tanh of the GEMM epilogue (kernels/vmath.h) over [-9, 9], near 0 and where
    exp leaves float32's range (inf, NaN, +-100, +-88.7), against float64 references to ~1e-6: through
    an identity weight, so the epilogue sees x exactly. On each x86 width: AVX-512's exp scales by
    vscalefps, the others build 2^n in integer lanes."""
    from cuvil.target import cpu_flags
    if target != "native" and "avx2" not in cpu_flags():
        pytest.skip(f"this CPU cannot run {target} code")
    edges = [0.0, 1e-6, -1e-6, 0.03, -0.03, 88.7, -88.7, 100.0, -100.0, 87.4, -87.4, np.inf, -np.inf, np.nan]
    x = np.concatenate([np.linspace(-9, 9, 6000), edges]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)]).reshape(-1, 16)
    g = Graph()
    xv = Value(TensorType(x.shape, "float32"), "x")
    g.inputs = [xv]
    g.outputs = [g.add(act, [g.add("matmul", [xv, g.const(np.eye(16, dtype=np.float32))])])]
    cm = check_graph(g, [x], rtol=2e-6, atol=1e-6, target=target)
    assert ops_of(cm) == ["matmul_fused"]


@pytest.mark.parametrize("M,N,K", [(3, 17, 33), (130, 20, 70), (12, 33, 400),   # full tiles over two K blocks
                                   (1003, 100, 400)])   # A past 1 MB: each task packs its own M block of it
def test_linear_scale_bias_residual_batched(M, N, K):
    g = Graph()
    x = Value(TensorType((2, M, K), "float32"), "x")
    r = Value(TensorType((2, M, N), "float32"), "r")
    g.inputs = [x, r]
    y = g.add("matmul", [x, g.const(f32(K, N))])
    y = g.add("mul", [y, g.const(np.float32(0.5))])
    y = g.add("add", [g.const(f32(1, 1, N)), y])
    g.outputs = [g.add("add", [r, y])]
    cm = check_graph(g, [f32(2, M, K), f32(2, M, N)])
    assert ops_of(cm) == ["matmul_fused"]






@pytest.mark.parametrize("groups,cin,cout,k,stride,pad", [(1, 3, 8, 3, 1, 1), (1, 16, 17, 1, 1, 0), (2, 6, 4, 3, 2, 1),
                                                           (5, 5, 5, 3, 1, 1), (1, 7, 33, 7, 2, 3),
                                                           (1, 17, 19, 3, 1, 1)])   # the last: Winograd
def test_conv_bias_residual_relu(groups, cin, cout, k, stride, pad):
    g = Graph()
    x = Value(TensorType((2, cin, 11, 9), "float32"), "x")
    g.inputs = [x]
    y = g.add("conv", [x, g.const(f32(cout, cin // groups, k, k)), g.const(f32(cout))],
              {"strides": [stride, stride], "pads": [(pad, pad), (pad, pad)], "groups": groups})
    r = Value(TensorType(y.shape, "float32"), "r")
    g.inputs.append(r)
    y = g.add("add", [y, r])
    g.outputs = [g.add("relu", [y])]
    cm = check_graph(g, [f32(2, cin, 11, 9), f32(*[int(d) for d in y.shape])])
    assert ops_of(cm) == ["conv"] and cm.graph.nodes[0].attrs["act"] == "relu"


@pytest.mark.parametrize("gate,act", [("sigmoid", "silu"), ("hardsigmoid", "hardswish")])
@pytest.mark.parametrize("layout", ["nchw", "blocked"])
def test_gated_activation_fuses_into_conv(gate, act, layout):
    """x * sigmoid(x) (core ATen's SiLU) and x * hardsigmoid(x) (MobileNetV3's hardswish) after a conv
    become the conv's epilogue activation, gate on either side of the mul."""
    g = Graph()
    x = Value(TensorType((1, 16, 9, 11), "float32"), "x")
    g.inputs = [x]
    y = g.add("conv", [x, g.const(f32(16, 16, 3, 3)), g.const(f32(16))], {"pads": [(1, 1), (1, 1)]})
    gated = g.add(gate, [y], {"alpha": 1 / 6, "beta": 0.5} if gate == "hardsigmoid" else {})
    y = g.add("mul", [gated, y] if gate == "sigmoid" else [y, gated])
    y = g.add("conv", [y, g.const(f32(16, 16, 1, 1))], {})       # a chain, so "blocked" blocks both
    g.outputs = [y]
    cm = check_graph(g, [4 * f32(1, 16, 9, 11)], layout=layout)
    convs = [n for n in cm.graph.nodes if n.op == "conv"]
    assert [n.attrs["act"] for n in convs] == [act, "none"] and not {"mul", gate} & set(ops_of(cm))


def test_gated_activation_kept_where_the_gate_has_another_reader():
    g = Graph()
    x = Value(TensorType((2, 8), "float32"), "x")
    g.inputs = [x]
    s = g.add("sigmoid", [x])
    g.outputs = [g.add("mul", [x, s]), s]
    cm = check_graph(g, [f32(2, 8)])
    assert "silu" not in ops_of(cm)


@pytest.mark.parametrize("cin,cout", [(200, 20), (400, 20), (64, 40)])
def test_conv1x1_input_in_place(cin, cout):
    """1x1 convs whose GEMM reads the input in place as B (64 pixels: whole panels): over one K block
    and two, its block copied for the row tiles (K > 192), and the shallow form (K = 64)."""
    g = Graph()
    x = Value(TensorType((1, cin, 8, 8), "float32"), "x")
    r = Value(TensorType((1, cout, 8, 8), "float32"), "r")
    g.inputs = [x, r]
    y = g.add("conv", [x, g.const(f32(cout, cin, 1, 1)), g.const(f32(cout))], {"strides": [1, 1], "pads": [(0, 0), (0, 0)]})
    g.outputs = [g.add("relu", [g.add("add", [y, r])])]
    cm = check_graph(g, [f32(1, cin, 8, 8), f32(1, cout, 8, 8)])
    assert "cuvil_conv2d(" in cm.c_source and "cuvil_conv_swapped(" not in cm.c_source


@pytest.mark.parametrize("seed", range(4))
def test_conv_swapped_random_geometry(seed):
    """The im2col rows' bounds over random kernels, strides, uneven pads and dilations against the
    reference interpreter. Maps of at most 9 output pixels and K >= 160 leave enough lanes empty that
    the swapped kernel takes every draw, with 16- or 32-wide panels."""
    rng = np.random.default_rng(seed)
    while True:                    # draw until the output map is small and the input not empty
        kh, kw, sh, sw = (int(v) for v in rng.integers(1, [6, 6, 4, 4]))
        dh, dw = (int(v) for v in rng.integers(1, 3, 2))
        pads = [tuple(int(v) for v in rng.integers(0, 3, 2)) for _ in range(2)]
        h, w = (int(v) for v in rng.integers(1, 12, 2))
        oh = (h + sum(pads[0]) - dh * (kh - 1) - 1) // sh + 1
        ow = (w + sum(pads[1]) - dw * (kw - 1) - 1) // sw + 1
        if 1 <= oh and 1 <= ow and oh * ow <= 9:
            break
    cin = int(rng.integers(160, 240))
    g = Graph()
    x = Value(TensorType((2, cin, h, w), "float32"), "x")
    g.inputs = [x]
    g.outputs = [g.add("conv", [x, g.const(f32(20, cin, kh, kw)), g.const(f32(20))],
                       {"strides": [sh, sw], "pads": pads, "dilations": [dh, dw]})]
    assert tuple(g.outputs[0].shape) == (2, 20, oh, ow)
    cm = check_graph(g, [f32(2, cin, h, w)])
    assert "cuvil_conv_swapped(" in cm.c_source


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_swapped_packs_many_tiles(threads):
    """ShuffleNet's shape of swapped conv: 116 channels (no block) at stride 2 into 210 output pixels,
    so the transposed A is packed into many row tiles and a last partial one, eight im2col rows at a
    time across K blocks (gemm.c pack_at_task), on one thread and split between two."""
    g = Graph()
    x = Value(TensorType((1, 116, 27, 29), "float32"), "x")
    g.inputs = [x]
    g.outputs = [g.add("conv", [x, g.const(f32(48, 116, 3, 3)), g.const(f32(48))],
                       {"strides": [2, 2], "pads": [(1, 1), (1, 1)], "dilations": [1, 1]})]
    assert tuple(g.outputs[0].shape) == (1, 48, 14, 15)
    cm = check_graph(g, [f32(1, 116, 27, 29)], rtol=1e-3, atol=1e-3, num_threads=threads)
    assert "cuvil_conv_swapped(" in cm.c_source


def test_conv_not_swapped_keeps_implicit_im2col():
    """A conv the swapped form could take but does not (few empty lanes x K) still runs its im2col inside
    the GEMM: the scratch reserved for the swapped form is not passed to it (cuvil_conv2d reads a
    scratch as room for a whole im2col)."""
    g = Graph()
    x = Value(TensorType((1, 8, 12, 12), "float32"), "x")
    g.inputs = [x]
    g.outputs = [g.add("conv", [x, g.const(f32(8, 8, 3, 3)), g.const(f32(8))],
                       {"strides": [2, 2], "pads": [(1, 1), (1, 1)]})]
    cm = check_graph(g, [f32(1, 8, 12, 12)])
    assert "cuvil_conv2d(" in cm.c_source and "cuvil_conv_swapped(" not in cm.c_source


@pytest.mark.parametrize("cin,h,w,kernel,stride,pads,dil", [
    (3, 8, 8, (9, 11), 1, ((4, 4), (5, 5)), 1),    # 11 kernel columns: past the runs' kept bounds
    (5, 16, 16, (3, 3), 2, ((1, 1), (1, 1)), 1),   # 8-wide rows: four runs a panel, left pads
    (3, 64, 64, (7, 7), 2, ((3, 3), (3, 3)), 1),   # the stem's geometry: one run a panel, pads at the edges
    (4, 20, 20, (3, 3), 3, ((2, 2), (2, 2)), 2),   # stride 3, dilated: 7-wide rows
    (2, 9, 40, (3, 5), (1, 2), ((0, 2), (1, 3)), 1)])   # uneven pads, rows split across panels
def test_conv_implicit_im2col_runs(cin, h, w, kernel, stride, pads, dil):
    """Convs the GEMM takes with im2col produced panel by panel (not Winograd, not swapped): each
    panel row is copied run by run (a run: the panel's pixels in one output row), pads left zero."""
    stride = stride if isinstance(stride, tuple) else (stride, stride)
    g = Graph()
    x = Value(TensorType((2, cin, h, w), "float32"), "x")
    g.inputs = [x]
    g.outputs = [g.add("conv", [x, g.const(f32(6, cin, *kernel)), g.const(f32(6))],
                       {"strides": list(stride), "pads": list(pads), "dilations": [dil, dil]})]
    cm = check_graph(g, [f32(2, cin, h, w)])
    assert "cuvil_conv2d(" in cm.c_source and "cuvil_conv_swapped(" not in cm.c_source


@pytest.mark.parametrize("n,cin,cout,h,w,kernel,stride,pads,dil,residual", [
    (2, 300, 40, 7, 7, (1, 1), 1, 0, 1, True),     # 49 pixels: two panels a quarter empty
    (1, 100, 33, 1, 5, (1, 1), 1, 0, 1, False),    # 33 channels: a partial block of the transpose back
    (2, 200, 17, 3, 3, (1, 1), 1, 0, 1, True),     # fewer pixels than a vector
    (2, 300, 40, 1, 1, (1, 1), 1, 0, 1, False),    # one pixel (a squeeze-excite block's conv): the GEMV path
    (1, 1400, 20, 17, 17, (1, 1), 1, 0, 1, True),  # 289 pixels: more than one span of the transpose
    (2, 300, 40, 13, 13, (1, 1), 2, 0, 1, True),   # a stride-2 1x1 (ResNet's downsample): im2col rows
    (1, 64, 24, 14, 14, (3, 3), 2, 1, 1, True),    # 3x3 stride 2 to 7x7 (ResNet's last stage)
    (2, 40, 20, 14, 9, (3, 5), (2, 1), ((1, 0), (2, 1)), 1, False),  # uneven pads, a row past the input
    (1, 60, 24, 9, 9, (3, 3), 1, 2, 2, True),      # dilated: Winograd does not take it
    (1, 20, 12, 6, 6, (3, 3), 2, 1, 1, False)])    # 9 pixels, 12 filters (a small ResNet's last stage)
def test_conv_swapped(n, cin, cout, h, w, kernel, stride, pads, dil, residual):
    """Convs whose pixels would leave many of the GEMM's panel lanes empty run with the pixels as its
    rows (cuvil_conv_swapped: filters packed as B, the input read as a transposed A, in place for a 1x1
    stride-1 conv and through im2col rows otherwise), then turn the product back to NCHW with bias,
    residual and ReLU. Every case leaves enough lanes empty with 16- and 32-wide panels alike (AVX2 and
    AVX-512), so the swapped kernel is taken on either."""
    stride = stride if isinstance(stride, tuple) else (stride, stride)
    pads = pads if isinstance(pads, tuple) else ((pads, pads), (pads, pads))
    oh = (h + sum(pads[0]) - dil * (kernel[0] - 1) - 1) // stride[0] + 1
    ow = (w + sum(pads[1]) - dil * (kernel[1] - 1) - 1) // stride[1] + 1
    g = Graph()
    x = Value(TensorType((n, cin, h, w), "float32"), "x")
    g.inputs = [x]
    y = g.add("conv", [x, g.const(f32(cout, cin, *kernel)), g.const(f32(cout))],
              {"strides": list(stride), "pads": list(pads), "dilations": [dil, dil]})
    assert tuple(y.shape) == (n, cout, oh, ow)
    inputs = [f32(n, cin, h, w)]
    if residual:
        r = Value(TensorType(y.shape, "float32"), "r")
        g.inputs.append(r)
        inputs.append(f32(n, cout, oh, ow))
        y = g.add("add", [y, r])
    g.outputs = [g.add("relu", [y])]
    cm = check_graph(g, inputs)
    assert ops_of(cm) == ["conv"] and "cuvil_conv_swapped(" in cm.c_source


def _attention_graph(B, H, Hk, L, S, E, mask=None, causal=False, layouts=False, Ev=None):
    g = Graph()
    Ev = E + 1 if Ev is None else Ev
    if layouts:   # q, k, v arrive as [b, s, h, d] and go through transposes the pass absorbs
        q = Value(TensorType((B, L, H, E), "float32"), "q")
        k = Value(TensorType((B, S, Hk, E), "float32"), "k")
        v = Value(TensorType((B, S, Hk, Ev), "float32"), "v")
        g.inputs = [q, k, v]
        qt, kt, vt = (g.add("transpose", [t], {"perm": [0, 2, 1, 3]}) for t in (q, k, v))
    else:
        qt = Value(TensorType((B, H, L, E), "float32"), "q")
        kt = Value(TensorType((B, Hk, S, E), "float32"), "k")
        vt = Value(TensorType((B, Hk, S, Ev), "float32"), "v")
        g.inputs = [qt, kt, vt]
    ins = [qt, kt, vt]
    if mask is not None:
        m = Value(TensorType(mask.shape, str(mask.dtype)), "mask")
        g.inputs.append(m)
        ins.append(m)
    y = g.add("attention", ins, {"scale": 1 / np.sqrt(E), "causal": causal})
    if layouts:
        y = g.add("transpose", [y], {"perm": [0, 2, 1, 3]})
    g.outputs = [y]
    return g


@pytest.mark.parametrize("head_dim", [5, 24])   # 24: the register-tiled path (head dims a multiple of the vector)
@pytest.mark.parametrize("case", ["plain", "bool_mask", "float_mask", "causal", "gqa", "layouts", "masked_row"])
def test_attention(case, head_dim):
    B, H, Hk, L, S, E = 2, 4, 4, 7, 9, head_dim
    mask, causal, layouts = None, False, False
    if case == "bool_mask":
        mask = rng.random((B, 1, 1, S)) > 0.3
        mask[..., 0] = True
    elif case == "float_mask":
        mask = f32(B, 1, L, S)
    elif case == "causal":
        L = S = 9
        causal = True
    elif case == "gqa":
        Hk = 2
    elif case == "layouts":
        layouts, Hk = True, 2
    elif case == "masked_row":
        mask = np.ones((B, H, L, S), bool)
        mask[1, 2, 3] = False
    g = _attention_graph(B, H, Hk, L, S, E, mask, causal, layouts, Ev=E if E % 8 == 0 else E + 1)
    ins = [f32(*[int(d) for d in v.shape]) if v.dtype == "float32" else mask for v in g.inputs]
    cm = check_graph(g, ins)
    assert ops_of(cm) == ["attention"]


@pytest.mark.parametrize("rows", [2, 3, 4, 5, 6, 7, 8, 13, 25])
def test_attention_row_tiles(rows):
    """Rows per KV head split into tiles of even size (tiles of up to 8 rows on AVX-512, 6 on AVX2: 13
    as 7 + 6 or 5 + 4 + 4), each size its own register tile: every size from 2 to 8 runs, causal, with
    grouped heads."""
    g = _attention_graph(1, 4, 2, rows, rows + 3, 24, causal=True)
    ins = [f32(*[int(d) for d in v.shape]) for v in g.inputs]
    cm = check_graph(g, ins)
    assert ops_of(cm) == ["attention"]


@pytest.mark.parametrize("target", ["native", "x86_64-avx2"])
@pytest.mark.parametrize("case", ["padding_mask", "causal_gqa", "masked_row"])
def test_attention_tiles_of_each_target(target, case):
    """The register-tiled rows and their one-pass softmax (exp, zeros past each row's keys and the sum
    together, 1/sum applied to P V's output) on both vector widths: 16 lanes take vscalefps, 8 the
    general exp; head dims a multiple of both, so every row runs in a tile."""
    B, H, Hk, L, S, E, mask, causal = 2, 6, 6, 37, 37, 32, None, False
    if case == "padding_mask":
        mask = f32(B, 1, 1, S) * 4
        mask[1, ..., 30:] = -np.inf                   # padded keys, as a tokenizer's mask gives them
    elif case == "causal_gqa":
        H, Hk, L, S, causal = 8, 2, 13, 29, True
    else:
        mask = np.ones((B, H, L, S), bool)
        mask[1, 2, 3] = False
    g = _attention_graph(B, H, Hk, L, S, E, mask, causal, Ev=E)
    ins = [f32(*[int(d) for d in v.shape]) if v.dtype == "float32" else mask for v in g.inputs]
    ins = [mask if v.name == "mask" else x for v, x in zip(g.inputs, ins)]
    cm = check_graph(g, ins, target=target)
    assert ops_of(cm) == ["attention"]


def test_pointwise_chain_is_one_loop():
    """GPT-2's tanh-GELU as torch decomposes it, with a broadcast input and a value used twice."""
    g = Graph()
    x = Value(TensorType((3, 17), "float32"), "x")
    s = Value(TensorType((17,), "float32"), "s")
    g.inputs = [x, s]
    c = g.const
    x2 = g.add("mul", [x, s])
    p = g.add("pow", [x2, c(np.float32(3.0))])
    inner = g.add("add", [x2, g.add("mul", [p, c(np.float32(0.044715))])])
    t = g.add("tanh", [g.add("mul", [inner, c(np.float32(0.7978845608))])])
    y = g.add("mul", [g.add("mul", [x2, c(np.float32(0.5))]), g.add("add", [t, c(np.float32(1.0))])])
    g.outputs = [g.add("cast", [g.add("gt", [y, c(np.float32(0.1))])], {"to": "float32"}), y]
    cm = check_graph(g, [f32(3, 17), f32(17)])
    assert ops_of(cm).count("fused_pointwise") == 2 and len(ops_of(cm)) == 2


def test_pointwise_reads_slices_in_place():
    """SiLU(gate) * up over the halves of one projection (the LLM's fused gate/up), and a strided
    slice along a middle axis: the loop reads them through their strides, with no copy."""
    g = Graph()
    x = Value(TensorType((2, 6, 8), "float32"), "x")
    g.inputs = [x]
    h = g.add("matmul", [x, g.const(f32(8, 2 * 19))])
    gate = g.add("slice", [h], {"axis": 2, "start": 0, "length": 19})
    up = g.add("slice", [h], {"axis": 2, "start": 19, "length": 19})
    odd = g.add("slice", [x], {"axis": 1, "start": 5, "step": -2, "length": 3})
    g.outputs = [g.add("mul", [g.add("silu", [gate]), up]),
                 g.add("add", [g.add("exp", [odd]), g.const(np.float32(1.0))])]
    cm = check_graph(g, [f32(2, 6, 8)])
    assert sorted(ops_of(cm)) == ["fused_pointwise", "fused_pointwise", "matmul"]


def test_fusion_level_zero_keeps_ops_separate():
    g = Graph()
    x = Value(TensorType((4, 8), "float32"), "x")
    g.inputs = [x]
    y = g.add("add", [g.add("matmul", [x, g.const(f32(8, 8))]), g.const(f32(8))])
    g.outputs = [g.add("relu", [y])]
    cm = check_graph(g, [f32(4, 8)], fusion_level=0)
    assert ops_of(cm) == ["matmul", "add", "relu"]


def test_linear_dynamic_rows():
    g = Graph(symbols={"b": (1, 50)})
    x = Value(TensorType((dims.Sym("b"), 19), "float32"), "x")
    g.inputs = [x]
    y = g.add("add", [g.add("matmul", [x, g.const(f32(19, 23))]), g.const(f32(23))])
    g.outputs = [g.add("relu", [y])]
    for b in (1, 7, 50):
        cm = check_graph(g, [f32(b, 19)])
    assert ops_of(cm) == ["matmul_fused"]


@pytest.mark.parametrize("tail", ["gelu", "residual"])
def test_epilogue_fuses_through_a_view(tail):
    """torch's Linear on 3-D input is addmm on a 2-D view, then a view back: the activation or the
    residual after the view still fuses into the GEMM."""
    g = Graph()
    x = Value(TensorType((2, 5, 12), "float32"), "x")
    r = Value(TensorType((2, 5, 20), "float32"), "r")
    g.inputs = [x, r]
    flat = g.add("reshape", [x], {"shape": [10, 12]})
    y = g.add("add", [g.add("matmul", [flat, g.const(f32(12, 20))]), g.const(f32(20))])
    y = g.add("reshape", [y], {"shape": [2, 5, 20]})
    g.outputs = [g.add("gelu", [y]) if tail == "gelu" else g.add("add", [y, r])]
    cm = check_graph(g, [f32(2, 5, 12), f32(2, 5, 20)])
    assert [op for op in ops_of(cm) if op != "reshape"] == ["matmul_fused"]


@pytest.mark.parametrize("cin,cout,h,w,pads,chain,kernel", [
    (4, 8, 5, 6, ((0, 1), (0, 1)), False, "cuvil_conv2d("),      # the GEMM's B: im2col, not the input
    (4, 8, 5, 6, ((0, 0), (0, 2)), False, "cuvil_conv2d("),
    (300, 40, 6, 6, ((0, 1), (0, 1)), False, "cuvil_conv_swapped("),   # 49 pixels: swapped, im2col rows
    (16, 32, 6, 6, ((0, 1), (0, 0)), True, "cuvil_conv_blocked"),      # a chain: channel-blocked
])
def test_pointwise_conv_with_end_pads(cin, cout, h, w, pads, chain, kernel):
    """A 1x1 stride-1 conv padded only at the bottom or right has more outputs than inputs: no kernel may
    read its input in place as the GEMM operand (each once did, past the end of the input)."""
    g = Graph()
    x = Value(TensorType((1, cin, h, w), "float32"), "x")
    g.inputs = [x]
    y = g.add("conv", [x, g.const(f32(cout, cin, 1, 1)), g.const(f32(cout))],
              {"strides": [1, 1], "pads": list(pads), "dilations": [1, 1]})
    if chain:
        y = g.add("conv", [y, g.const(f32(16, cout, 1, 1))], {"strides": [1, 1], "pads": [(0, 0), (0, 0)]})
    g.outputs = [y]
    cm = check_graph(g, [f32(1, cin, h, w)], **({"layout": "blocked"} if chain else {}))
    assert kernel in cm.c_source


@pytest.mark.parametrize("k,stride,pad,dil,mult,act,residual,hw", [
    (3, 1, 1, 1, 1, "relu", True, (37, 45)),       # interior columns VL at a time, a ragged tail
    (3, 2, 1, 1, 1, "none", False, (38, 41)),      # stride 2: even lanes, one float read past the last
    (5, 1, 2, 1, 2, "silu", False, (21, 30)),      # channel multiplier 2
    (5, 2, 2, 1, 1, "gelu", True, (29, 34)),
    (7, 1, 3, 1, 1, "none", True, (19, 27)),       # ConvNeXt's 7x7
    (3, 1, 2, 2, 1, "relu", False, (23, 26)),      # dilated
    (3, 3, 1, 1, 1, "none", False, (31, 31)),      # stride 3: the bounds-tested path throughout
    (3, 1, 0, 1, 1, "none", False, (9, 10)),       # unpadded, narrower than a vector row
    (1, 1, 0, 1, 1, "sigmoid", False, (6, 20)),
    ((3, 1), (1, 2), ((1, 1), (0, 0)), 1, 1, "none", False, (16, 40)),   # uneven kernel and strides
])
def test_depthwise_conv(k, stride, pad, dil, mult, act, residual, hw):
    """Depthwise convs (one group per input channel) against the reference interpreter, at sizes whose
    rows are not whole vectors, each stride the vector path takes and one it does not."""
    k = k if isinstance(k, tuple) else (k, k)
    stride = stride if isinstance(stride, tuple) else (stride, stride)
    pads = pad if isinstance(pad, tuple) else ((pad, pad), (pad, pad))
    c, (h, w) = 6, hw
    g = Graph()
    x = Value(TensorType((2, c, h, w), "float32"), "x")
    g.inputs = [x]
    ins = [x, g.const(f32(c * mult, 1, *k)), g.const(f32(c * mult))]
    attrs = {"strides": list(stride), "pads": list(pads), "dilations": [dil, dil], "groups": c, "act": act}
    oh = (h + sum(pads[0]) - dil * (k[0] - 1) - 1) // stride[0] + 1
    ow = (w + sum(pads[1]) - dil * (k[1] - 1) - 1) // stride[1] + 1
    feeds = [f32(2, c, h, w)]
    if residual:
        r = Value(TensorType((2, c * mult, oh, ow), "float32"), "r")
        g.inputs.append(r)
        ins.append(r)
        feeds.append(f32(2, c * mult, oh, ow))
    g.outputs = [g.add("conv", ins, attrs)]
    check_graph(g, feeds)


def test_constant_transposed_past_the_fold_cap_is_folded(monkeypatch):
    """A constant's transpose above passes/fold.MAX_FOLD_BYTES folds all the same (it is no larger than
    the weight it reads: VGG's 411 MB classifier had been transposed at every call, 0.9 s, and its matmul
    packed B at run time), so the matmul takes the prepacked weight; a value that grows past the cap
    (an expand) stays a node."""
    from cuvil.passes import fold
    monkeypatch.setattr(fold, "MAX_FOLD_BYTES", 1024)
    g = Graph()
    x = Value(TensorType((3, 64), "float32"), "x")
    g.inputs = [x]
    w = g.add("transpose", [g.const(f32(40, 64))], {"perm": [1, 0]})          # 10 KB
    y = g.add("matmul", [x, w])
    big = g.add("expand", [g.const(f32(1, 40))], {"shape": [3, 40]})          # 480 B: folds
    grown = g.add("expand", [g.const(f32(1, 1, 40))], {"shape": [16, 3, 40]})  # 7.7 KB from 160 B: stays
    g.outputs = [g.add("add", [g.add("add", [y, big]), grown])]
    cm = check_graph(g, [f32(3, 64)])
    assert "transpose" not in ops_of(cm) and "expand" in ops_of(cm)
    assert "cuvil_pack_b(" not in cm.c_source        # no packing at run time


@pytest.mark.parametrize("op", ["avg_pool", "max_pool"])
def test_pool_of_one_pixel_windows_is_no_node(op):
    """A pool whose windows are single pixels (VGG's adaptive_avg_pool2d(7) on a 7 x 7 map) is its input."""
    g = Graph()
    x = Value(TensorType((2, 5, 7, 7), "float32"), "x")
    g.inputs = [x]
    y = g.add(op, [x], {"kernel": [1, 1], "strides": [1, 1], "pads": [(0, 0), (0, 0)]})
    g.outputs = [g.add("relu", [y])]
    cm = check_graph(g, [f32(2, 5, 7, 7)])
    assert op not in ops_of(cm)
