"""Complex tensors kept inside the compiled graph as float pairs (frontend/aten_complex.py, dft.py), against
torch eager and numpy.fft: rotary embeddings written with complex numbers (Meta's Llama reference code),
a spectrogram front end (stft -> power -> mel -> log), FFTs over several dims and norms, complex model
inputs and outputs through a saved artifact, and the clear errors for what is not built."""
from __future__ import annotations

import numpy as np
import pytest

from cuvil.frontend import dft

torch = pytest.importorskip("torch", reason="the cases compile torch modules and compare with eager")


def _compare(cm, model, *args, tol=1e-5):
    got, want = cm(*args), model(*args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


class _ComplexRotary(torch.nn.Module):
    """apply_rotary_emb as Meta's reference Llama writes it: a complex buffer of rotations, queries viewed
    as complex pairs, one complex product, viewed back as real."""

    def __init__(self, head_dim=8, max_len=16, theta=10000.0):
        super().__init__()
        freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(max_len).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, q, k):
        t = q.shape[1]
        f = self.freqs_cis[:t].reshape(1, t, 1, -1)
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        kc = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
        return torch.view_as_real(qc * f).flatten(3), torch.view_as_real(kc * f).flatten(3)


def test_rotary_written_with_complex_numbers(tmp_path):
    import cuvil
    m = _ComplexRotary()
    q, k = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8)
    cm = cuvil.compile(m, (q, k), cache_dir=str(tmp_path))
    _compare(cm, m, q, k)
    _compare(cm, m, torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8))


class _LogMel(torch.nn.Module):
    """A Whisper-style front end: centered STFT with a Hann window, power, mel projection, log."""

    def __init__(self, n_fft=64, hop=16, mels=10):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("mel", torch.rand(mels, n_fft // 2 + 1, generator=torch.Generator().manual_seed(0)))

    def forward(self, audio):
        spec = torch.stft(audio, self.n_fft, self.hop, window=self.window, return_complex=True)
        power = spec.abs() ** 2
        return torch.log10(torch.clamp(self.mel @ power, min=1e-10))


def test_spectrogram_front_end(tmp_path):
    import cuvil
    m = _LogMel()
    audio = torch.randn(2, 400)
    cm = cuvil.compile(m, (audio,), cache_dir=str(tmp_path))
    _compare(cm, m, audio, tol=1e-4)


class _Transforms(torch.nn.Module):
    def forward(self, x):
        r = torch.fft.rfft(x)
        return (r, torch.fft.irfft(r, n=x.shape[-1]), torch.fft.fft2(x, norm="ortho"),
                torch.fft.ifftn(x, dim=(0, 2), norm="forward"), torch.fft.hfft(r[..., :5], n=7),
                torch.fft.rfftn(x, s=(4, 9)), torch.fft.fftshift(torch.fft.fft(x, dim=1), dim=1))


def test_ffts_over_dims_sizes_and_norms(tmp_path):
    import cuvil
    x = torch.randn(3, 5, 12)
    m = _Transforms()
    cm = cuvil.compile(m, (x,), cache_dir=str(tmp_path))
    _compare(cm, m, x, tol=2e-5)


class _ComplexIO(torch.nn.Module):
    def forward(self, z, w):
        return z * w + 1j, (z / w).abs(), torch.fft.ifft(z)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_inputs_and_outputs_through_a_saved_artifact(tmp_path, dtype):
    import cuvil
    from cuvil.errors import ShapeError
    m = _ComplexIO()
    z, w = torch.randn(4, 6, dtype=dtype), torch.randn(4, 6, dtype=dtype)
    cm = cuvil.compile(m, (z, w), cache_dir=str(tmp_path / "c"))
    cm.save(tmp_path / "m.cuvil")
    loaded = cuvil.load(tmp_path / "m.cuvil")
    name = str(dtype).split(".")[1]
    assert [i["dtype"] for i in loaded.inputs] == [name, name] and loaded.inputs[0]["shape"] == [4, 6]
    assert [o["dtype"] for o in loaded.outputs] == [name, name.replace("complex", "float").replace("64", "32")
                                                    .replace("128", "64"), name]
    zn, wn = z.numpy(), w.numpy()
    got = loaded.run(zn, wn)
    want = [t.numpy() for t in m(z, w)]
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match=f"expected dtype {name}"):
        loaded.run(zn.real.copy(), wn)
    with pytest.raises(ShapeError, match="expected shape"):
        loaded.run(zn[:, :5].copy(), wn)
    out = [np.empty_like(e) for e in want]            # caller-provided out= buffers of complex dtype
    loaded.run(zn, wn, out=out)
    np.testing.assert_allclose(out[0], want[0], rtol=1e-5, atol=1e-5)


def test_complex_op_without_a_handler_is_named(tmp_path):
    import cuvil
    from cuvil.errors import UnsupportedOpError

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.sin(torch.fft.rfft(x)).real
    with pytest.raises(UnsupportedOpError, match="sin.* on complex tensors"):
        cuvil.compile(M(), (torch.randn(4, 8),), cache_dir=str(tmp_path))


def test_long_transform_refused_with_the_reason(tmp_path):
    import cuvil
    from cuvil.errors import UnsupportedOpError

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).abs()
    with pytest.raises(UnsupportedOpError, match="DFT matrix"):
        cuvil.compile(M(), (torch.randn(1, 8192),), cache_dir=str(tmp_path))


@pytest.mark.parametrize("n, length", [(8, 8), (7, 7), (5, 8), (10, 8)])
def test_dft_matrices_against_numpy_fft(n, length):
    """The shared matrices (used by both frontends) against numpy.fft: complex and real input, zero padding
    and truncation to `length`, the one-sided bins, and the Hermitian inverse of even and odd lengths."""
    rng = np.random.default_rng(n * 100 + length)
    z = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    pairs = np.stack([z.real, z.imag], -1).reshape(-1)
    full = dft.forward_matrix(n, length, length, -1.0, 1.0, False)
    got = (pairs @ full).reshape(-1, 2)
    np.testing.assert_allclose(got[:, 0] + 1j * got[:, 1], np.fft.fft(z, length), atol=1e-12)
    inv = (pairs @ dft.forward_matrix(n, length, length, 1.0, 1.0 / length, False)).reshape(-1, 2)
    np.testing.assert_allclose(inv[:, 0] + 1j * inv[:, 1], np.fft.ifft(z, length), atol=1e-12)
    half = (z.real @ dft.forward_matrix(n, length, length // 2 + 1, -1.0, 1.0, True)).reshape(-1, 2)
    np.testing.assert_allclose(half[:, 0] + 1j * half[:, 1], np.fft.rfft(z.real, length), atol=1e-12)
    spec = np.fft.rfft(rng.standard_normal(length))
    spec_pairs = np.stack([spec.real, spec.imag], -1).reshape(-1)
    back = spec_pairs @ dft.hermitian_matrix(len(spec), length, 1.0 / length)
    np.testing.assert_allclose(back, np.fft.irfft(spec, length), atol=1e-12)


def test_verification_measures_the_imaginary_part():
    """verify=True's error of a complex output counts the imaginary part (a float cast would drop it)."""
    from cuvil.api import max_errors
    assert max_errors([np.array([1 + 1j, 2.0])], [np.array([1 + 0j, 2.0])])[0][0] == pytest.approx(1.0)
    assert max_errors([np.array([1 + 1j])], [np.array([1 + 1j])])[0] == (0.0, 0.0)


def test_division_of_large_and_small_magnitudes(tmp_path):
    """Smith's scaling: |b|^2 of 1e25 or 1e-25 would overflow / underflow float32; the quotient does not."""
    import cuvil

    class M(torch.nn.Module):
        def forward(self, a, b):
            return a / b
    a = torch.tensor([1e25 + 3e24j, 2 - 1j, 1e-25 + 1e-25j, 5 + 0j, 0 + 7j], dtype=torch.complex64)
    b = torch.tensor([3e25 - 1e25j, 1e-25 + 2e-25j, 2e-25 - 1e-26j, 0 + 2j, 3 + 0j], dtype=torch.complex64)
    cm = cuvil.compile(M(), (a, b), cache_dir=str(tmp_path))
    torch.testing.assert_close(cm(a, b), M()(a, b), rtol=1e-5, atol=0)
