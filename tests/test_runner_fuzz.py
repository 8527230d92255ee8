"""The C runner (cuvil_run) reads .npy files that come from anywhere: fuzzed headers, lengths and
truncations must end in a clean refusal (exit 2) or in the model's true answer, never in a crash or a
wrong answer. Built here for this machine (the code is the same for every target), so it runs fast."""
from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuvil
from cuvil.build import toolchain
from cuvil.codegen.c import runner

torch = pytest.importorskip("torch", reason="the oracle is torch eager (a dev requirement)")


@pytest.fixture(scope="module")
def built(tmp_path_factory, cache_dir):
    from . import models
    model, (x,) = models.mlp()
    cm = cuvil.compile(model, (x,))
    d = tmp_path_factory.mktemp("runner")
    for f in ("model.c", "model.h", "weights.bin"):
        shutil.copyfile(cm.path / f, d / f)
    (d / "cuvil_run_main.c").write_text(runner.SOURCE.read_text())
    (d / "cuvil_run_io.h").write_text(runner.io_header(cm.module.manifest, "cuvil_"))
    toolchain.build_shared(d, "native", cm.path.parent.parent, runner=True)
    return d, cm, tuple(x.shape)


def _npy(a) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def _run(d, data: bytes):
    (d / "in.npy").write_bytes(data)
    (d / "output0.npy").unlink(missing_ok=True)
    return subprocess.run([str(d / "cuvil_run"), "-w", str(d / "weights.bin"), "-o", str(d), str(d / "in.npy")],
                          capture_output=True, text=True, timeout=60)


def _check(d, cm, shape, data: bytes):
    r = _run(d, data)
    assert r.returncode in (0, 2, 3), (r.returncode, r.stderr)   # a signal is a negative code; 3: the model refused
    try:
        f = io.BytesIO(data)
        version = np.lib.format.read_magic(f)
        got_shape, fortran, dtype = np.lib.format._read_array_header(f, version)
        # the runner also wants the file to end where the data does (numpy ignores trailing bytes)
        ok = (dtype == np.float32 and got_shape == shape and not fortran
              and len(data) - f.tell() == 4 * int(np.prod(shape)))
    except Exception:  # noqa: BLE001 - whatever numpy refuses
        ok = False
    if ok:          # numpy reads it as a valid input: the runner must too, and answer as the model does
        assert r.returncode == 0, r.stderr
    if r.returncode == 0:      # whatever the runner took, it took the trailing bytes as the input data
        x = np.frombuffer(data[-4 * int(np.prod(shape)):], np.float32).reshape(shape)
        np.testing.assert_allclose(np.load(d / "output0.npy"), cm.run(x.copy())[0], rtol=1e-6, atol=1e-6)
    else:
        assert r.stderr.startswith("cuvil_run: ")


HEADERS = st.fixed_dictionaries({
    "descr": st.sampled_from(["<f4", "<f8", "|u1", "<i8", ">f4", "<f4'", "", "<f4<f4"]),
    "fortran": st.sampled_from(["False", "True", "0", ""]),
    "shape": st.lists(st.one_of(st.integers(0, 80), st.integers(0, 2**70), st.just(-1)), max_size=18)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(h=HEADERS, extra=st.integers(-8, 8), version=st.sampled_from([1, 2, 3, 7]))
def test_generated_headers(built, h, extra, version):
    d, cm, shape = built
    shp = ", ".join(map(str, h["shape"])) + ("," if len(h["shape"]) == 1 else "")
    text = f"{{'descr': '{h['descr']}', 'fortran_order': {h['fortran']}, 'shape': ({shp}), }}".encode()
    text += b" " * ((-len(text) - 11) % 64) + b"\n"
    pre = b"\x93NUMPY" + bytes([version, 0])
    pre += len(text).to_bytes(2 if version == 1 else 4, "little")
    n = 1
    for v in h["shape"]:
        n *= max(v, 0)
    body = np.ones(max(0, min(n, 4096) + extra), np.float32).tobytes()
    _check(d, cm, shape, pre + text + body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_files(built, data):
    d, cm, shape = built
    good = bytearray(_npy(np.random.default_rng(0).standard_normal(shape).astype(np.float32)))
    how = data.draw(st.sampled_from(["flip", "truncate", "header_len"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 6))):
            i = data.draw(st.integers(0, 127))
            good[i] = data.draw(st.integers(0, 255))
    elif how == "truncate":
        good = good[:data.draw(st.integers(0, len(good) - 1))]
    else:
        good[8:10] = data.draw(st.integers(0, 65535)).to_bytes(2, "little")
    _check(d, cm, shape, bytes(good))


def test_valid_file_and_bad_arguments(built, tmp_path):
    d, cm, shape = built
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    _check(d, cm, shape, _npy(x))
    for args in (["-t", "0"], ["-t", "x"], ["-q", "1"], ["-w"]):
        r = subprocess.run([str(d / "cuvil_run"), *args, str(d / "in.npy")], capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.startswith("cuvil_run: ")
    r = subprocess.run([str(d / "cuvil_run"), "-w", str(tmp_path / "missing.bin"), str(d / "in.npy")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot open" in r.stderr
    (tmp_path / "short.bin").write_bytes(b"\0" * 8)
    r = subprocess.run([str(d / "cuvil_run"), "-w", str(tmp_path / "short.bin"), str(d / "in.npy")],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "weights" in r.stderr
