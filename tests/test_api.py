"""The user-facing API: options, I/O conventions, save/load, errors, dynamic shapes, verify, GIL."""
import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

import cuvil


class TwoHeads(torch.nn.Module):
    """Nested outputs: a dict holding a tuple."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 4)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return {"h": h, "pair": (self.b(x), h.sum(-1))}


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(2, 16)
    return m, x, cuvil.compile(m, (x,))


def test_torch_in_torch_out_numpy_in_numpy_out(mlp):
    m, x, cm = mlp
    y = cm(x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, m(x).detach(), rtol=1e-4, atol=1e-4)
    yn = cm(x.numpy())
    assert isinstance(yn, np.ndarray)
    (r,) = cm.run(x.numpy())
    np.testing.assert_allclose(r, yn)


def test_out_buffers_reused_switched_and_dropped(mlp):
    """run(out=...) writes into the caller's buffer: the same buffer again (its pointer is kept
    between calls), another one, then none; a kept buffer cannot be resized under the runtime."""
    m, x, cm = mlp
    xs = [torch.randn(2, 16) for _ in range(3)]
    a, b = np.full((2, 4), np.nan, np.float32), np.full((2, 4), np.nan, np.float32)
    for xi, buf in zip(xs, (a, a, b)):
        (r,) = cm.run(xi.numpy(), out=[buf])
        assert r is buf
        np.testing.assert_allclose(buf, m(xi).detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(a, m(xs[1]).detach().numpy(), rtol=1e-4, atol=1e-4)   # b's call left a alone
    (fresh,) = cm.run(xs[0].numpy())
    assert fresh is not a and fresh is not b
    np.testing.assert_allclose(fresh, m(xs[0]).detach().numpy(), rtol=1e-4, atol=1e-4)
    del r, buf                                # only b itself and the runtime now reference it
    cm.run(xs[2].numpy(), out=[b])
    with pytest.raises(ValueError, match="resize"):
        b.resize((4, 4))


def test_input_array_passed_again_is_read_again(mlp):
    """The same input array in consecutive calls (its pointer and shape are kept between them):
    changed in place, then another batch size, then reshaped in place; held, it cannot be resized."""
    m, x, _ = mlp
    cm = cuvil.compile(m, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    ref = lambda arr: m(torch.from_numpy(arr.copy())).detach().numpy()
    a = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    b = a[:3].copy()
    for arr in (a, a, b, a):
        (r,) = cm.run(arr)
        np.testing.assert_allclose(r, ref(arr), rtol=1e-4, atol=1e-4)
        a *= -2.0
    with pytest.raises(ValueError, match="resize"):
        a.resize((4, 16))
    a.shape = (16, 8)
    with pytest.raises(cuvil.ShapeError, match="expected shape"):
        cm.run(a)


def test_nested_outputs_rebuilt():
    torch.manual_seed(0)
    m = TwoHeads().eval()
    x = torch.randn(5, 8)
    out = cuvil.compile(m, (x,))(x)
    ref = m(x)
    assert set(out) == {"h", "pair"} and isinstance(out["pair"], tuple)
    torch.testing.assert_close(out["pair"][0], ref["pair"][0].detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["pair"][1], ref["pair"][1].detach(), rtol=1e-4, atol=1e-4)


def test_model_output_dataclass_rebuilt():
    import transformers as T
    torch.manual_seed(0)
    m = T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 vocab_size=50)).eval()
    ids = torch.randint(0, 50, (1, 6))
    out = cuvil.compile(m, (ids,))(ids)
    assert type(out).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    torch.testing.assert_close(out.last_hidden_state, m(ids).last_hidden_state.detach(), rtol=1e-4, atol=1e-4)


def test_non_contiguous_inputs(mlp):
    m, x, cm = mlp
    big = torch.randn(16, 4)
    xt = big.t()[:2]               # a (2, 16)... strided view
    xt = torch.randn(16, 2).t()
    assert not xt.is_contiguous()
    torch.testing.assert_close(cm(xt), m(xt).detach(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad, msg", [
    (dict(target="riscv"), "target"), (dict(precision="fp8"), "precision"), (dict(fusion_level=7), "fusion_level"),
    (dict(num_threads=0), "num_threads"), (dict(verify="yes"), "verify"), (dict(colour="red"), "colour"),
])
def test_invalid_options_name_the_option(mlp, bad, msg):
    m, x, _ = mlp
    with pytest.raises(ValueError, match=msg):
        cuvil.compile(m, (x,), **bad)


def test_compile_model_alias_and_enable_fusion(mlp):
    m, x, _ = mlp
    for flag in (True, False):
        cm = cuvil.compile_model(m, (x,), enable_fusion=flag, target="cpu")
        torch.testing.assert_close(cm(x), m(x).detach(), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="enable_fusion"):
        cuvil.compile_model(m, (x,), enable_fusion="maybe")


def test_second_compile_is_a_cache_hit(mlp):
    m, x, _ = mlp
    cm = cuvil.compile(m, (x,))
    assert cm.report["cache"] == "hit"


def test_cache_evicts_least_recently_used(tmp_path, monkeypatch):
    """Past CUVIL_CACHE_MAX_GB the oldest artifacts go; one in use keeps working."""
    monkeypatch.setenv("CUVIL_CACHE_MAX_GB", str(1.5 * 2 ** -20))      # 1.5 MiB: room for one artifact
    x = torch.randn(2, 256)
    first = cuvil.compile(torch.nn.Linear(256, 256), (x,), cache_dir=str(tmp_path))
    assert len(list((tmp_path / "artifacts").iterdir())) == 1
    second = cuvil.compile(torch.nn.Linear(256, 512), (x,), cache_dir=str(tmp_path))
    left = list((tmp_path / "artifacts").iterdir())
    assert left == [second.module.path]
    assert first.run(x.numpy())[0].shape == (2, 256)     # still mapped after its files were removed


def test_wrong_shape_and_dtype_raise_shape_error(mlp):
    _, x, cm = mlp
    with pytest.raises(cuvil.ShapeError, match=r"expected shape \[2, 16\], got \[2, 15\]"):
        cm.run(np.zeros((2, 15), np.float32))
    with pytest.raises(cuvil.ShapeError, match="expected dtype float32, got float64"):
        cm.run(np.zeros((2, 16)))
    with pytest.raises(cuvil.ShapeError, match="expected 1 inputs"):
        cm.run()


def test_save_load_without_torch(mlp, tmp_path):
    m, x, cm = mlp
    cm.save(tmp_path / "m.cuvil")
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", m(x).detach().numpy())
    script = textwrap.dedent(f"""
        import sys
        class Block:                       # importing torch or the compiler fails in this process
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('torch', 'onnx', 'sympy') or name in ('cuvil.api', 'cuvil.frontend'):
                    raise ImportError('blocked: ' + name)
        sys.meta_path.insert(0, Block())
        import numpy as np, cuvil
        m = cuvil.load({str(tmp_path / 'm.cuvil')!r})
        y = m(np.load({str(tmp_path / 'x.npy')!r}))
        np.testing.assert_allclose(y, np.load({str(tmp_path / 'y.npy')!r}), rtol=1e-4, atol=1e-4)
        assert not any(k.startswith(('torch', 'sympy', 'onnx')) for k in sys.modules), sorted(sys.modules)
        print('ok')
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_session_on_artifact_imports_no_compiler(mlp, tmp_path):
    """cuvil.InferenceSession on a saved artifact runs it without importing torch or any part of the
    compiler (the compiling session of cuvil/session.py stands above the runtime's own)."""
    m, x, cm = mlp
    cm.save(tmp_path / "m.cuvil")
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", m(x).detach().numpy())
    script = textwrap.dedent(f"""
        import sys
        import numpy as np, cuvil
        sess = cuvil.InferenceSession({str(tmp_path / 'm.cuvil')!r})
        name = sess.get_inputs()[0].name
        (y,) = sess.run(None, {{name: np.load({str(tmp_path / 'x.npy')!r})}})
        np.testing.assert_allclose(y, np.load({str(tmp_path / 'y.npy')!r}), rtol=1e-4, atol=1e-4)
        compiler = ("cuvil.api", "cuvil.driver", "cuvil.frontend", "cuvil.passes", "cuvil.codegen", "cuvil.build",
                    "torch")
        bad = [k for k in sys.modules if k in compiler or k.startswith(tuple(c + "." for c in compiler))]
        assert not bad, bad
        print('ok')
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_small_weights_on_huge_pages_large_ones_mapped(mlp, tmp_path, monkeypatch):
    """Weights up to HUGE_PAGE_COPY_MAX are a read-only copy starting on a 2 MB boundary (huge pages
    where the kernel has them); above it they stay mapped from weights.bin. Same results either way."""
    from cuvil.runtime import artifact, pages
    m, x, cm = mlp
    cm.save(tmp_path / "m.cuvil")
    ref = m(x).detach().numpy()
    small = cuvil.load(tmp_path / "m.cuvil")
    if pages.huge_pages_available():
        assert not isinstance(small._weights, np.memmap)
        assert small._weights.ctypes.data % pages.HUGE_PAGE == 0 and not small._weights.flags.writeable
    monkeypatch.setattr(artifact, "HUGE_PAGE_COPY_MAX", 0)
    mapped = cuvil.load(tmp_path / "m.cuvil")
    assert isinstance(mapped._weights, np.memmap)
    for loaded in (small, mapped):
        np.testing.assert_allclose(loaded.run(x.numpy())[0], ref, rtol=1e-4, atol=1e-4)


def test_arena_on_huge_pages_from_one_page_on(monkeypatch):
    """An arena of 2 MB or more starts on a 2 MB boundary (where the kernel has huge pages), a
    smaller one is plain 64-byte aligned memory; a model run in either gives torch's answer."""
    from cuvil.runtime import module, pages
    assert module.arena_buffer(1000).ctypes.data % 64 == 0
    big = module.arena_buffer(pages.HUGE_PAGE + 5)
    assert big.size == pages.HUGE_PAGE + 5 and big.ctypes.data % 64 == 0
    if pages.huge_pages_available():
        assert big.ctypes.data % pages.HUGE_PAGE == 0
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 8)).eval()
    x = torch.randn(600, 512)                # activations of 600 x 1024 floats: a 2.4 MB arena
    cm = cuvil.compile(m, (x,))
    assert cm.module.arena_bytes >= pages.HUGE_PAGE
    np.testing.assert_allclose(cm.run(x.numpy())[0], m(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_corrupt_artifacts_raise_artifact_error(mlp, tmp_path):
    _, x, cm = mlp
    d = cm.save(tmp_path / "a")
    w = bytearray((d / "weights.bin").read_bytes())
    w[10] ^= 0xFF
    (d / "weights.bin").write_bytes(bytes(w))
    with pytest.raises(cuvil.ArtifactError, match="checksum"):
        cuvil.load(d)
    d2 = cm.save(tmp_path / "b")
    (d2 / "manifest.json").write_text("{not json")
    with pytest.raises(cuvil.ArtifactError, match="JSON"):
        cuvil.load(d2)
    d3 = cm.save(tmp_path / "c")
    man = json.loads((d3 / "manifest.json").read_text())
    man["format_version"] = 99
    (d3 / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(cuvil.ArtifactError, match="format version"):
        cuvil.load(d3)
    d4 = cm.save(tmp_path / "d")
    (d4 / "model.so").unlink()
    with pytest.raises(cuvil.ArtifactError, match="missing model.so"):
        cuvil.load(d4)
    d5 = cm.save(tmp_path / "e")
    (d5 / "weights.bin").write_bytes(b"\0" * 7)
    with pytest.raises(cuvil.ArtifactError, match="bytes"):
        cuvil.load(d5)


def test_checksum_slices_join_to_one_crc32(monkeypatch):
    """The parallel checksum (slices on threads, joined) is the crc32 of the whole buffer."""
    import zlib
    from cuvil.runtime import artifact, pages
    monkeypatch.setattr(artifact, "SLICE", 1000)
    rng = np.random.default_rng(0)
    for n in (0, 1, 999, 1000, 1001, 5000, 12345):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert artifact.checksum(data) == artifact.crc_text(zlib.crc32(data)), n


def test_a_modified_artifact_is_checked_again_after_a_clean_load(mlp, tmp_path):
    """Loads of an unchanged, already checked weights.bin skip the checksum; a write to it does not."""
    _, x, cm = mlp
    d = cm.save(tmp_path / "a")
    cuvil.load(d)
    cuvil.load(d)
    w = bytearray((d / "weights.bin").read_bytes())
    w[10] ^= 0xFF
    (d / "weights.bin").write_bytes(bytes(w))
    with pytest.raises(cuvil.ArtifactError, match="checksum"):
        cuvil.load(d)


def test_gil_released_while_native_code_runs():
    """While one thread is inside the compiled code, another Python thread keeps running, and two
    threads running the same model concurrently each get correct results (per-thread arenas)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).eval()
    x = torch.randn(256, 512)
    cm = cuvil.compile(m, (x,), num_threads=1)
    ref = m(x).detach().numpy()
    xs = x.numpy()
    results, ticks = [], [0]
    done = threading.Event()

    def worker():
        for _ in range(6):
            results.append(cm.run(xs)[0])
        done.set()
    t = threading.Thread(target=worker)
    t2 = threading.Thread(target=lambda: results.append(cm.run(xs)[0]))
    t.start()
    t2.start()
    while not done.is_set():
        ticks[0] += 1
    t.join()
    t2.join()
    assert ticks[0] > 10000, "the main thread could not run while native code ran: GIL held"
    for r in results:
        np.testing.assert_allclose(r, ref, rtol=1e-4, atol=1e-4)


def test_dynamic_batch_one_artifact_all_sizes(mlp):
    m, x, _ = mlp
    batch = torch.export.Dim("batch", min=1, max=64)
    cm = cuvil.compile(m, (x,), dynamic_shapes=({0: batch},))
    assert cm.module.manifest["inputs"][0]["shape"] == ["batch", 16]
    for n in (1, 3, 64):
        xn = torch.randn(n, 16)
        torch.testing.assert_close(cm(xn), m(xn).detach(), rtol=1e-4, atol=1e-4)
    with pytest.raises(cuvil.ShapeError, match=r"batch = 65 is outside the compiled bounds \[1, 64\]"):
        cm(torch.randn(65, 16))


def test_dynamic_sequence_length_bert():
    import transformers as T
    torch.manual_seed(0)
    m = T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 vocab_size=50, max_position_embeddings=64)).eval()
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.ones_like(ids)
    seq = ("seq", 2, 64)
    cm = cuvil.compile(m, (ids, mask), dynamic_shapes=({1: seq}, {1: seq}))
    for n in (2, 5, 33, 64):
        ids = torch.randint(0, 50, (2, n))
        mask = torch.ones_like(ids)
        mask[1, n // 2:] = 0
        ref = m(ids, mask).last_hidden_state.detach()
        torch.testing.assert_close(cm(ids, mask).last_hidden_state, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(cuvil.ShapeError, match="seq"):
        cm(torch.zeros(2, 65, dtype=torch.int64), torch.ones(2, 65, dtype=torch.int64))


class ExportDiffers(torch.nn.Module):
    """Traces to x + 1 but runs eagerly as x: verify must catch the disagreement."""

    def forward(self, x):
        if torch.compiler.is_exporting():
            return x + 1
        return x * 1


def test_verify_reports_errors_per_output():
    x = torch.randn(3, 4)
    with pytest.raises(cuvil.VerificationError, match=r"output 0: max abs err 1"):
        cuvil.compile(ExportDiffers(), (x,), verify=True)


def test_verify_passes_and_reports(mlp):
    m, x, _ = mlp
    cm = cuvil.compile(m, (x,), verify=True)
    (abs_err, rel_err), = cm.report["verify"].values()
    assert abs_err < 1e-4


class TwoUnsupported(torch.nn.Module):
    def forward(self, x):
        a = torch.linalg.eigvals(x).abs()                                      # eigvals
        b = torch.poisson(x.abs())                                             # poisson
        return a.sum() + b.sum()


def test_unsupported_ops_listed_all_at_once_with_source_lines():
    with pytest.raises(cuvil.UnsupportedOpError) as e:
        cuvil.compile(TwoUnsupported(), (torch.randn(1, 3, 5, 5),))
    msg = str(e.value)
    assert "linalg_eig" in msg and "poisson" in msg
    assert "test_api.py" in msg and "torch.linalg.eigvals" in msg and "torch.poisson" in msg
    assert len(e.value.ops) == 2


def test_profile_build_reports_every_node(mlp):
    from cuvil import profiler
    m, x, _ = mlp
    cm = cuvil.compile(m, (x,), profile=True)
    torch.testing.assert_close(cm(x), m(x).detach(), rtol=1e-4, atol=1e-4)
    table, nodes = profiler.profile(cm, x.numpy(), runs=3)
    assert [label.split(":", 1)[1] for label, _ in nodes] == [n.op for n in cm.graph.nodes]
    assert all(ms >= 0 for _, ms in nodes) and sum(r[1] for r in table) > 0
    with pytest.raises(cuvil.ArtifactError, match="profile=True"):
        cuvil.compile(m, (x,)).module.profile_counters()


def test_float64_without_kernel_warns_about_float32():
    class Soft(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)
    x = torch.randn(3, 5, dtype=torch.float64)
    with pytest.warns(cuvil.PrecisionWarning, match="softmax"):
        cm = cuvil.compile(Soft(), (x,), cache_dir=str(__import__("tempfile").mkdtemp()))
    torch.testing.assert_close(cm(x), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


def test_full_disk_while_writing_weights_is_a_compile_error(tmp_path, monkeypatch):
    """ENOSPC from the weights file: a CompileError naming the file, and the partial file removed."""
    import errno

    from cuvil.codegen.c.emit import Weights
    from cuvil.errors import CompileError
    w = Weights(tmp_path)
    w.add("a", np.ones(16, np.float32))

    def full(data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(w._file, "write", full)
    with pytest.raises(CompileError, match="No space left on device") as e:
        w.add("b", np.ones(16, np.float32))
    assert "weights-" in str(e.value) and not list(tmp_path.iterdir())
