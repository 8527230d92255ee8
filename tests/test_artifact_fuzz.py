"""Fuzzing the artifact boundary (issue 37): random edits of manifest.json (with and without a
recomputed content hash, loaded with and without checksums) and random byte damage to every file.
Each load either raises a CuvilError, or loads and then computes the right answer."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuvil
from cuvil.runtime import artifact

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)

    def forward(self, x):
        y = self.lin(x)
        return {"a": torch.tanh(y), "b": y.sum(-1)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(4, 6)
    with torch.no_grad():
        want = [t.numpy() for t in m(x).values()]
    src = cuvil.compile(m, (x,)).save(tmp_path_factory.mktemp("fuzz") / "src")
    return src, x, want


def _copy(src):
    d = Path(tempfile.mkdtemp(prefix="cuvil-fuzz-")) / "a"
    shutil.copytree(src, d)
    return d


def _load_and_run(d, x, want, verify, exact=True):
    """The property: a CuvilError, or a module whose answers are right (exact=False: of the right
    shapes and dtypes, for weights whose checksum the caller chose not to verify: a flipped weight
    byte then changes the numbers, as verify_checksum=False says it may)."""
    try:
        mod = cuvil.load(d, verify_checksum=verify)
    except cuvil.CuvilError:
        return "refused"

    def check(g, w):
        if exact:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        else:
            assert g.shape == w.shape and g.dtype == w.dtype
    try:
        got = mod.run(x.numpy())
        for g, w in zip(got, want):
            check(g, w)
        out = mod(x)                             # the torch path reads the manifest's treespec too
        for g, w in zip(out.values() if isinstance(out, dict) else out, want):
            check(np.asarray(g), w)
    except cuvil.CuvilError:
        return "refused at run"
    finally:
        mod.close()
    return "ran"


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
                    | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=10)


def _paths(v, prefix=()):
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, prefix + (i,))


@pytest.fixture(scope="module")
def built_lossy(tmp_path_factory):
    """A bf16 artifact: its manifest also carries the accuracy report and the per-op formats."""
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(4, 6)
    cm = cuvil.compile(m, (x,), precision="bf16")
    assert "accuracy" in cuvil.load(cm.path).manifest
    return cm.save(tmp_path_factory.mktemp("fuzz") / "lossy"), x, cm.run(x.numpy())


class Selective(torch.nn.Module):
    """Outputs sized by the data, a complex output and a python number: the manifest's data_dims, its
    complex dtypes and its scalar flags are what the edits hit."""

    def forward(self, x):
        return x[x > 0], torch.fft.rfft(x), x.sum().item()


@pytest.fixture(scope="module")
def built_dynamic(tmp_path_factory):
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    want = [np.asarray(t) for t in Selective()(x)]
    src = cuvil.compile(Selective(), (x,)).save(tmp_path_factory.mktemp("fuzz") / "dynamic")
    return src, x, want


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data(), reseal=st.booleans(), verify=st.booleans())
def test_fuzz_dynamic_manifest_edits(built_dynamic, data, reseal, verify):
    _edit_manifest_and_load(built_dynamic, data, reseal, verify)


@FUZZ
@given(data=st.data(), reseal=st.booleans(), verify=st.booleans())
def test_fuzz_manifest_edits(built, data, reseal, verify):
    _edit_manifest_and_load(built, data, reseal, verify)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data(), reseal=st.booleans(), verify=st.booleans())
def test_fuzz_lossy_manifest_edits(built_lossy, data, reseal, verify):
    _edit_manifest_and_load(built_lossy, data, reseal, verify)


def _edit_manifest_and_load(built, data, reseal, verify):
    src, x, want = built
    d = _copy(src)
    try:
        m = json.loads((d / "manifest.json").read_text())
        for _ in range(data.draw(st.integers(1, 3))):
            paths = [p for p in _paths(m) if p]
            path = data.draw(st.sampled_from(paths))
            parent = m
            for k in path[:-1]:
                parent = parent[k]
            if data.draw(st.booleans()) and isinstance(parent, list):
                parent.pop(path[-1])
            elif data.draw(st.booleans()) and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = data.draw(JSON)
        if reseal:
            try:
                m["content_hash"] = artifact._content_hash(m)
            except (TypeError, ValueError):
                pass
        (d / "manifest.json").write_text(json.dumps(m))
        _load_and_run(d, x, want, verify)
    finally:
        shutil.rmtree(d.parent)


@FUZZ
@given(data=st.data(), victim=st.sampled_from(artifact.FILES), verify=st.booleans())
def test_fuzz_artifact_bytes(built, data, victim, verify):
    src, x, want = built
    d = _copy(src)
    try:
        original = (d / victim).read_bytes()
        buf = bytearray(original)
        for _ in range(data.draw(st.integers(1, 4))):
            kind = data.draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
            pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
            if kind == "flip" and buf:
                buf[pos] ^= data.draw(st.integers(1, 255))
            elif kind == "cut":
                del buf[pos:pos + data.draw(st.integers(1, 64))]
            elif kind == "insert":
                buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
            else:
                del buf[pos:]
        (d / victim).write_bytes(bytes(buf))
        result = _load_and_run(d, x, want, verify, exact=verify or victim != "weights.bin")
        if verify and victim != "manifest.json" and bytes(buf) != original:
            assert result == "refused", f"a damaged {victim} was loaded"
    finally:
        shutil.rmtree(d.parent)


@pytest.fixture(scope="module")
def built_llm_step(tmp_path_factory):
    """An LLM step artifact: its manifest bounds the step's rows x tokens (symbol_products)."""
    import cuvil.llm

    from .llm_fixtures import small_model
    llm = cuvil.llm.from_transformers(small_model("llama"), max_seq_len=16, max_batch=2,
                                      cache_dir=tmp_path_factory.mktemp("llm-cache"))
    assert llm.module.manifest["symbol_products"] == [["batch", "seq", 16]]
    return llm.save(tmp_path_factory.mktemp("fuzz") / "llm")


def _step_inputs(m, rows, tokens):
    L, B, H, S, D = m.inputs[2]["shape"]
    cache = np.zeros((L, B, H, S, D), np.float32)
    return (np.ones((rows, tokens), np.int64), np.zeros(rows, np.int64), cache, cache.copy(),
            np.arange(rows, dtype=np.int64) % B, np.arange(1, rows + 1, dtype=np.int64) * tokens - 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(edit=st.sampled_from(["loosen", "drop", "rename", "garbage"]), verify=st.booleans())
def test_fuzz_symbol_product_edits(built_llm_step, edit, verify):
    """The step's rows x tokens bound is signed with the library: an edited, dropped or malformed one is
    refused at load (a looser bound would let a run overflow the buffers the plan sized by it)."""
    d = _copy(built_llm_step)
    try:
        m = json.loads((d / "manifest.json").read_text())
        prods = m["symbol_products"]
        if edit == "loosen":
            prods[0][2] = 10 ** 6
        elif edit == "drop":
            del m["symbol_products"]
        elif edit == "rename":
            prods[0][0] = "seq"
        else:
            m["symbol_products"] = [["batch", "nope", "x"]]
        m["content_hash"] = artifact._content_hash(m)
        (d / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(cuvil.CuvilError):
            cuvil.load(d, verify_checksum=verify)
    finally:
        shutil.rmtree(d.parent)


def test_symbol_product_bound_holds_at_run(built_llm_step):
    """Within the bound a step runs; past it (rows x tokens > 16) the run is refused, not overflowed."""
    mod = cuvil.load(built_llm_step)
    try:
        (logits,) = mod.run(*_step_inputs(mod, 2, 8))
        assert logits.shape[0] == 2 and np.isfinite(logits).all()        # each row's last token's logits
        with pytest.raises(cuvil.ShapeError, match="exceed the compiled bound 16"):
            mod.run(*_step_inputs(mod, 2, 9))
    finally:
        mod.close()
