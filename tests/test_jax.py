"""The JAX frontend: functions compiled with cuvil.compile(fn, example_inputs) agree with jax.jit(fn) on
the same inputs (an MLP, an NHWC CNN, a transformer block, a table of primitives); unsupported primitives
are reported together; verify=True and save / load work for a JAX source."""
from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax extra (a dev requirement); the oracle is jax.jit")
jnp = jax.numpy
lax = jax.lax

import cuvil  # noqa: E402

RTOL = ATOL = 1e-4


def _dense(rng, n_in, n_out):
    return {"w": jnp.asarray(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(n_out) * 0.1, jnp.float32)}


def _leaves(out):
    return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]


def _agrees(fn, args, cm=None):
    """cm (compiled from fn unless given) against jax.jit(fn) on args: every output leaf's shape, dtype
    and values."""
    cm = cm or cuvil.compile(fn, args)
    got = cm.run(*[np.asarray(a) for a in args])
    expected = _leaves(jax.jit(fn)(*args))
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape and g.dtype == e.dtype, (i, g.shape, e.shape, g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"output {i}")
    return cm


# ---- (1) an MLP, its params bound with functools.partial as flax's apply would take them -------------
def mlp_apply(params, x):
    h = jax.nn.gelu(x @ params["l1"]["w"] + params["l1"]["b"])
    h = jax.nn.relu(h @ params["l2"]["w"] + params["l2"]["b"])
    return h @ params["l3"]["w"] + params["l3"]["b"]


def test_mlp():
    rng = np.random.default_rng(0)
    params = {"l1": _dense(rng, 16, 32), "l2": _dense(rng, 32, 32), "l3": _dense(rng, 32, 10)}
    x = rng.standard_normal((4, 16)).astype(np.float32)
    _agrees(functools.partial(mlp_apply, params), (x,))


# ---- (2) a CNN in NHWC: strided and depthwise convs, max / average pooling, log_softmax ------------
def cnn_apply(params, x):
    conv = functools.partial(lax.conv_general_dilated, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jax.nn.relu(conv(x, params["c1"], (1, 1), "SAME") + params["b1"])
    h = jax.nn.relu(conv(h, params["c2"], (2, 2), ((1, 1), (1, 1))))
    h = jax.nn.silu(conv(h, params["dw"], (1, 1), "SAME", feature_group_count=h.shape[-1]))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0
    h = h.reshape(h.shape[0], -1)
    return jax.nn.log_softmax(h @ params["fc"]["w"] + params["fc"]["b"])


def test_cnn_nhwc():
    rng = np.random.default_rng(1)

    def w(*shape):
        return jnp.asarray(rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1])), jnp.float32)
    params = {"c1": w(3, 3, 3, 8), "b1": w(8), "c2": w(3, 3, 8, 16), "dw": w(3, 3, 1, 16), "fc": _dense(rng, 64, 10)}
    x = jnp.asarray(rng.standard_normal((2, 16, 16, 3)), jnp.float32)
    _agrees(functools.partial(cnn_apply, params), (x,))


# ---- (3) a transformer block in plain jax, closed over by a lambda ---------------------------------
def layer_norm(p, x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * p["g"] + p["b"]


def attention(p, x, heads):
    b, t, d = x.shape
    q, k, v = (jnp.einsum("btd,dhe->bhte", x, p[n].reshape(d, heads, d // heads)) for n in ("wq", "wk", "wv"))
    scores = jnp.einsum("bhqe,bhke->bhqk", q, k) / np.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((t, t), bool))
    att = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    out = jnp.einsum("bhqk,bhke->bqhe", att, v).reshape(b, t, d)
    return out @ p["wo"]


def transformer_apply(params, ids, heads=2):
    x = params["emb"][ids] + params["pos"][: ids.shape[1]]
    x = x + attention(params["att"], layer_norm(params["ln1"], x), heads)
    h = layer_norm(params["ln2"], x)
    x = x + jax.nn.gelu(h @ params["up"]["w"] + params["up"]["b"]) @ params["down"]["w"] + params["down"]["b"]
    logits = layer_norm(params["lnf"], x) @ params["emb"].T
    return logits, jnp.argmax(logits, axis=-1)


def test_transformer_block():
    rng = np.random.default_rng(2)
    vocab, d, t = 50, 32, 8

    def w(*shape, scale=None):
        return jnp.asarray(rng.standard_normal(shape) * (scale or 1 / np.sqrt(shape[0])), jnp.float32)

    def ln():
        return {"g": 1 + w(d, scale=0.1), "b": w(d, scale=0.1)}
    params = {"emb": w(vocab, d, scale=0.5), "pos": w(16, d, scale=0.1), "ln1": ln(), "ln2": ln(), "lnf": ln(),
              "att": {n: w(d, d) for n in ("wq", "wk", "wv", "wo")}, "up": _dense(rng, d, 4 * d),
              "down": _dense(rng, 4 * d, d)}
    ids = rng.integers(0, vocab, (2, t)).astype(np.int32)
    _agrees(lambda i: transformer_apply(params, i), (ids,))


# ---- the primitives the models above do not reach, in one function ---------------------------------
def primitives(x, idx, i):
    y = x.reshape(4, 6)
    gathers = (jnp.take(y, idx, axis=1), y[idx % 4, idx], jnp.take_along_axis(y, jnp.argsort(y, axis=1), axis=1),
               jax.nn.one_hot(idx, 5), y[i], lax.dynamic_slice_in_dim(y, i, 3, axis=1))
    movement = (y[1:4:2, ::-1], jnp.pad(y, ((1, 0), (0, 2)), constant_values=-1.0), jnp.concatenate([y, -y], 0),
                jnp.split(y, 3, axis=1)[1], lax.iota(jnp.int32, 5), jnp.expand_dims(y, (0, 2)).squeeze(0))
    reductions = (jnp.sort(y, axis=0), lax.top_k(y, 3)[1], lax.cumsum(y, 1, reverse=True), jnp.cumprod(y, 0),
                  y.max(1), y.min(0), jnp.prod(y, 1), jnp.argmin(y, 0), jnp.any(y > 1, 1), jnp.all(y > -2, 0))
    pointwise = (lax.clamp(-0.5, y, 0.5), lax.clamp((idx[0] * 0.1 - 1).astype(jnp.float32), y, jnp.float32(1)),
                 jnp.round(y * 3), lax.round(y * 3), jnp.sign(y), jnp.floor(y), jnp.ceil(y), jnp.abs(y) ** 1.5,
                 y ** 3, (y + 4) ** -2, jnp.exp2(y), jnp.log1p(jnp.abs(y)), jax.nn.sigmoid(y), jnp.tanh(y),
                 jax.nn.gelu(y, approximate=False), jnp.sin(y) * jnp.cos(y), lax.rem(y, 0.7), jnp.maximum(y, 0.2),
                 (y > 0) & (y < 1), ~(y > 0), jnp.isfinite(y), y.astype(jnp.int32) // 1,
                 (y * 4).astype(jnp.int32) % 3, lax.stop_gradient(y), jnp.where(y > 0, y, 0.0))
    return gathers, movement, reductions, pointwise


def test_primitives():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(24).astype(np.float32)
    _agrees(primitives, (x, np.array([5, 0, 2], np.int32), np.int32(2)))


# ---- (4) every unsupported primitive in one error --------------------------------------------------
def test_unsupported_listed_at_once():
    def fn(x):
        written = x.at[0].set(2.0)
        spectrum = jnp.fft.fft(x).real
        return written + spectrum + lax.cummax(x, 0)

    with pytest.raises(cuvil.UnsupportedOpError) as ei:
        cuvil.compile(fn, (np.ones(8, np.float32),))
    names = {op.split(" ")[0] for op, _ in ei.value.ops}
    assert {"scatter", "fft", "cummax"} <= names
    assert all(loc and __file__ in loc for _, loc in ei.value.ops), ei.value.ops


# ---- (4b) control flow: while / cond / switch as regions, scan and static fori_loop unrolled ----------
def control(x, n, h, xs, w):
    def grow(c):
        i, v = c
        return i + 1, v * 1.5 + 1.0
    steps, grown = lax.while_loop(lambda c: (c[0] < n) & (jnp.sum(c[1]) < 100.0), grow, (0, x))
    signed = lax.cond(jnp.sum(x) > 0, lambda a: a * w[0, 0], lambda a: -a, grown)    # a branch reads a const
    switched = lax.switch(n - 3, [lambda a: a + 1, lambda a: a * 3, lambda a: a - 7], signed)
    last, ys = lax.scan(lambda hh, xx: (jnp.tanh(hh @ w + xx), jnp.sum(hh)), h, xs)
    ys_back = lax.scan(lambda c, xx: (c + xx, c * xx), 0.0, xs[:, 0, 0], reverse=True)[1]
    counted = lax.fori_loop(0, 4, lambda i, v: v * 2 + i, x)
    return steps, switched, last, ys, ys_back, counted


def test_control_flow_matches_jit_on_every_path():
    rng = np.random.default_rng(7)
    h, xs = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((5, 2, 4)).astype(np.float32)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    args = (np.ones(3, np.float32), np.int32(5), h, xs, w)
    cm = _agrees(control, args)
    ops = cm.module.manifest["node_ops"]
    assert "while_loop" in ops and ops.count("cond") == 2      # cond, and a switch of three (its second cond nested)
    # both cond branches, every switch branch (n - 3 clamped below 0 and above 2), loops stopped by
    # either half of their condition
    for x, n in [(-np.ones(3), 2), (np.full(3, 2.0), 40), (np.ones(3), 4), (np.ones(3), 100), (np.zeros(3), 0)]:
        _agrees(control, (x.astype(np.float32), np.int32(n), h, xs, w), cm)


def test_scan_longer_than_the_unroll_limit_is_refused_clearly():
    with pytest.raises(cuvil.UnsupportedOpError, match="unrolls up to"):
        cuvil.compile(lambda xs: lax.scan(lambda c, x: (c + x, c), 0.0, xs), (np.ones(1000, np.float32),))


# ---- (5) verify=True compares with jax.jit(fn) -------------------------------------------------------
def test_verify():
    rng = np.random.default_rng(4)
    w = jnp.asarray(rng.standard_normal((8, 3)), jnp.float32)
    ids = np.array([[1, 2], [3, 4]])               # int64 in: jax computes in int32, and so does the artifact
    x = rng.standard_normal((2, 8)).astype(np.float32)
    cm = cuvil.compile(lambda x, i: (jax.nn.softmax(x @ w), [i * 2]), (x, ids), verify=True)
    assert set(cm.report["verify"]) == {0, 1}
    assert cm.report["verify"][1] == (0.0, 0.0)


# ---- (6) the artifact saved and loaded back ----------------------------------------------------------
def test_save_load(tmp_path):
    rng = np.random.default_rng(5)
    params = {"l1": _dense(rng, 16, 32), "l2": _dense(rng, 32, 32), "l3": _dense(rng, 32, 10)}
    fn = functools.partial(mlp_apply, params)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    cm = cuvil.compile(fn, (x,))
    cm.save(tmp_path / "mlp.cuvil")
    loaded = cuvil.load(tmp_path / "mlp.cuvil")
    x2 = rng.standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run(x2)[0], cm.run(x2)[0])
    _agrees(fn, (x2,), cm=loaded)


def test_source_kind_does_not_import_jax():
    """Only a callable given arrays is taken for a JAX function; anything else never imports jax."""
    code = ("import sys, numpy as np; from cuvil import api\n"
            "assert api._source_kind('m.onnx', (np.ones(2),)) == 'onnx'\n"
            "assert api._source_kind(object(), (np.ones(2),)) is None\n"
            "assert api._source_kind(len, ('text',)) is None\n"
            "assert 'jax' not in sys.modules\n"
            "assert api._source_kind(len, (np.ones(2), [np.ones(1)])) == 'jax'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_special_functions_match_jax(tmp_path):
    """digamma, erf_inv, the scaled Bessel I, the incomplete gamma functions, Hurwitz zeta and ndtri (via
    erf_inv) compiled from a jaxpr, against jax.jit."""
    import cuvil
    from jax import lax

    def f(x, a):
        return (jax.scipy.special.digamma(x), lax.erf_inv(jnp.tanh(x)), lax.bessel_i0e(x), lax.bessel_i1e(x),
                lax.igamma(a, x), lax.igammac(a, x), jax.scipy.special.zeta(a + 1.5, x),
                jax.scipy.special.ndtri(jax.nn.sigmoid(x)))
    rng = np.random.default_rng(0)
    x, a = (rng.uniform(0.1, 4, (3, 5)).astype(np.float32) for _ in range(2))
    cm = cuvil.compile(f, (x, a), cache_dir=str(tmp_path))
    for got, want in zip(cm.run(x, a), jax.jit(f)(x, a)):
        np.testing.assert_allclose(got, np.asarray(want), rtol=3e-5, atol=1e-6)    # jax's float32 erf_inv: 1e-5
