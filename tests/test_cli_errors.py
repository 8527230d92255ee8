"""The command line never shows a traceback: every failure is exit status 2 and one `error:` line
(issue 37). Each case here printed a traceback (or hung) before; most run in-process, for speed,
and two through `python -m cuvil`, the real entry point."""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cuvil import cli
from cuvil.errors import UnsupportedOpError

MODELS = textwrap.dedent("""
    import torch
    class NeedsArgs(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
    class Boom(torch.nn.Module):
        def __init__(self):
            raise RuntimeError("no weights here")
    class Net(torch.nn.Module):
        def forward(self, x):
            return x + 1
""")


def make_files(d: Path) -> Path:
    """Model files, broken inputs and broken artifacts, shared by these tests and the fuzz."""
    (d / "m.py").write_text(MODELS)
    (d / "bad.py").write_text("raise RuntimeError('boom at import')\n")
    (d / "syntax.py").write_text("class Net(:\n")
    (d / "junk.onnx").write_bytes(b"\x08\x01not an onnx model\xff\xff")
    (d / "empty.npy").write_bytes(b"")
    np.save(d / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(d / "arrays.npz", a=np.zeros(2))
    (d / "afile").write_text("not a directory")
    (d / "dir.npy").mkdir()
    (d / "notart").mkdir()
    (d / "notart" / "manifest.json").write_text("{")
    fake = d / "fake.cuvil"  # every file an artifact has, all garbage
    fake.mkdir()
    for f in ("manifest.json", "weights.bin", "model.so", "model.h", "model.c"):
        (fake / f).write_text("garbage")
    (d / "ckpt").mkdir()
    (d / "ckpt" / "config.json").write_text("[1, 2")
    return d


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return make_files(tmp_path_factory.mktemp("cli_errors"))


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv("CUVIL_DEBUG", raising=False)


def run_cli(capsys, argv):
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse's usage errors and --help
        rc = e.code
    return rc, *capsys.readouterr()


def assert_one_error(rc, err, needle):
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert needle in lines[0], err


# (argv, what the error line says); {d} is the folder of make_files
CASES = [
    # an empty model spec is a wrong one, not a missing one (it had been an internal error; found by test_cli_fuzz)
    (["profile", ""], "model must be FILE.py::ClassName or FILE.onnx, got ''"),
    # the user's model file
    (["compile", "{d}/m.py::NeedsArgs", "-o", "{d}/o"],
     "m.py::NeedsArgs() failed: TypeError: NeedsArgs.__init__() missing 1 required positional argument"),
    (["compile", "{d}/m.py::Boom", "-o", "{d}/o"], "m.py::Boom() failed: RuntimeError: no weights here"),
    (["compile", "{d}/bad.py::Net", "-o", "{d}/o"], "importing {d}/bad.py failed: RuntimeError: boom at import"),
    (["compile", "{d}/syntax.py::Net", "-o", "{d}/o"], "importing {d}/syntax.py failed: SyntaxError"),
    (["compile", "{d}/m.py::Nope", "-o", "{d}/o"], "defines no 'Nope'"),
    (["compile", "{d}/nothere.py::Net", "-o", "{d}/o"], "model file {d}/nothere.py does not exist"),
    (["compile", "{d}/nothere.onnx", "-o", "{d}/o"], "model file {d}/nothere.onnx does not exist"),
    (["compile", "{d}/m.py:Net", "-o", "{d}/o"], "model must be FILE.py::ClassName or FILE.onnx"),
    (["compile", "{d}/m.py::", "-o", "{d}/o"], "model must be FILE.py::ClassName or FILE.onnx"),
    (["compile", "{d}", "-o", "{d}/o"], "model must be FILE.py::ClassName or FILE.onnx"),
    (["compile", "{d}/junk.onnx", "-o", "{d}/o"], "junk.onnx"),
    (["inspect", "{d}/m.py::NeedsArgs"], "m.py::NeedsArgs() failed"),
    # --example-input
    (["compile", "{d}/m.py::Net", "--example-input", "torch.randn(1", "-o", "{d}/o"], "write 'py:torch.randn(1'"),
    (["compile", "{d}/m.py::Net", "--example-input", "py:torch.randn(1", "-o", "{d}/o"],
     "--example-input 'py:torch.randn(1' failed: SyntaxError"),
    (["compile", "{d}/m.py::Net", "--example-input", "py:nonsense + 1", "-o", "{d}/o"], "failed: NameError"),
    (["compile", "{d}/m.py::Net", "--example-input", "float32[100000,100000,100]", "-o", "{d}/o"],
     "more than 268435456 elements"),
    (["compile", "{d}/m.py::Net", "--example-input", "float32[99999999999]", "-o", "{d}/o"], "the shape must be"),
    (["compile", "{d}/m.py::Net", "--example-input", "float32[-1,3]", "-o", "{d}/o"], "the shape must be"),
    (["compile", "{d}/m.py::Net", "--example-input", "float32[1,,3]", "-o", "{d}/o"], "the shape must be"),
    (["compile", "{d}/m.py::Net", "--example-input", "complex64[1]", "-o", "{d}/o"], "dtype 'complex64' is not one"),
    (["compile", "{d}/m.py::Net", "--example-input", "{d}/empty.npy", "-o", "{d}/o"], "not a readable .npy file"),
    (["compile", "{d}/m.py::Net", "--example-input", "{d}/missing.npy", "-o", "{d}/o"], "not a readable .npy"),
    (["compile", "{d}/m.py::Net", "--example-input", "{d}/pickled.npy", "-o", "{d}/o"], "not a readable .npy"),
    (["compile", "{d}/m.py::Net", "--example-input", "{d}/dir.npy", "-o", "{d}/o"], "not a readable .npy"),
    # the other compile options
    (["compile", "{d}/m.py::Net", "-o", "{d}/afile"], "'{d}/afile' exists and is not a directory"),
    (["compile", "{d}/m.py::Net", "-o", ""], "'' is not a path"),
    (["compile", "{d}/m.py::Net", "--dynamic", "0:0:b:x:y", "-o", "{d}/o"], "wants INPUT:AXIS:NAME:MIN:MAX"),
    (["compile", "{d}/m.py::Net", "--dynamic", "5000000000:0:b:1:4", "-o", "{d}/o"], "0 <= INPUT < 1024"),
    (["compile", "{d}/m.py::Net", "--dynamic", "0:0:b:4:1", "-o", "{d}/o"], "0 <= MIN <= MAX"),
    (["compile", "{d}/m.py::Net", "--dynamic", "0:0:b:1:4", "--dynamic", "0:0:c:1:4", "-o", "{d}/o"],
     "input 0 axis 0 given twice"),
    (["compile", "{d}/m.py::Net", "--target", "mips", "-o", "{d}/o"], "invalid choice: 'mips'"),
    (["compile", "{d}/m.py::Net", "--precision", "fp8", "-o", "{d}/o"], "invalid choice: 'fp8'"),
    (["compile", "{d}/m.py::Net", "--precision", "int4", "-o", "{d}/o"], "int4 weights are for language models"),
    (["compile", "{d}/m.py::Net", "--fusion-level", "9", "-o", "{d}/o"], "'9' is not in [0, 3]"),
    (["compile", "{d}/m.py::Net", "--constant-input", "shape", "-o", "{d}/o"], "wants NAME=FILE.npy or NAME=1,2,3"),
    (["compile", "{d}/m.py::Net", "--constant-input", "s=1,x", "-o", "{d}/o"], "values must be integers"),
    (["compile", "{d}/m.py::Net", "--constant-input", f"s={2 ** 70}", "-o", "{d}/o"], "must fit in int64"),
    (["compile", "{d}/junk.onnx", "--constant-input", "s={d}/arrays.npz.npy", "-o", "{d}/o"], "not a readable"),
    (["profile", "{d}/m.py::Net", "--runs", "0"], "'0' is not in [1, 10000000]"),
    # artifacts and their inputs
    (["run", "{d}/missing.cuvil"], "is not a cuvil artifact directory"),
    (["run", "{d}/notart"], "is missing"),
    (["run", "{d}/fake.cuvil"], "fake.cuvil"),
    (["bench", "{d}/fake.cuvil"], "fake.cuvil"),
    (["inspect", "{d}/notart"], "is missing"),
    (["inspect", "{d}/fake.cuvil", "--stage", "c"], "fake.cuvil"),
    (["run", "{d}/notart", "--output-dir", "{d}/afile"], "'{d}/afile' exists and is not a directory"),
    (["bench", "{d}/notart", "--repeat", "0"], "'0' is not in [1, 10000000]"),
    (["bench", "{d}/notart", "--warmup", "-1"], "'-1' is not in [0, 10000000]"),
    (["bench", "{d}/notart", "--repeat", "1e3"], "'1e3' is not an integer"),
    # language models
    (["llm", "compile", "{d}/missing", "-o", "{d}/o"], "missing"),
    (["llm", "compile", "{d}/ckpt", "-o", "{d}/o"], "config.json"),
    (["llm", "compile", "{d}/ckpt", "-o", "{d}/o", "--group", "7"], "invalid choice: 7"),
    (["llm", "compile", "{d}/ckpt", "-o", "{d}/o", "--max-seq-len", "0"], "'0' is not in [1, 1048576]"),
    (["llm", "run", "{d}/missing", "--prompt", "hi"], "missing"),
    (["llm", "run", "{d}/missing", "--prompt", "hi", "--top-p", "0"], "'0' is not in (0, 1]"),
    (["llm", "run", "{d}/missing", "--prompt", "hi", "--temperature", "nan"], "'nan' is not in [0, 1000000.0]"),
    (["llm", "run", "{d}/missing", "--prompt", "hi", "--seed", "-1"], "'-1' is not in [0, 9223372036854775807]"),
]


@pytest.mark.parametrize("argv, needle", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_one_error_line(d, capsys, argv, needle):
    rc, out, err = run_cli(capsys, [a.format(d=d) for a in argv])
    assert_one_error(rc, err, needle.format(d=d))


@pytest.mark.parametrize("cmd", [["compile", "{d}/m.py::Net", "-o", "{d}/o"], ["inspect", "{d}/m.py::Net"],
                                 ["profile", "{d}/m.py::Net"], ["run", "{d}/notart"], ["bench", "{d}/notart"],
                                 ["llm", "compile", "{d}/ckpt", "-o", "{d}/o"],
                                 ["llm", "run", "{d}/notart", "--prompt", "1 2"]])
@pytest.mark.parametrize("threads", ["0", "-3", "x", "2.5", str(2 ** 64), ""])
def test_num_threads_checked_early(d, capsys, cmd, threads):
    rc, out, err = run_cli(capsys, [a.format(d=d) for a in cmd] + ["--num-threads", threads])
    assert_one_error(rc, err, "argument --num-threads:")


def test_untrusted_example_input_is_not_evaluated(d, capsys):
    marker = d / "pwned_cuvil"
    evil = f"__import__('os').system('touch {marker}')"
    rc, out, err = run_cli(capsys, ["compile", d / "m.py::Net", "--example-input", evil, "-o", d / "o"])
    assert_one_error(rc, err, "py:")
    assert not marker.exists()


def test_example_input_forms(d):
    """DTYPE[SHAPE] (random, seeded), .npy and the opted-in py: expression all give tensors for torch."""
    import torch
    np.save(d / "x.npy", np.arange(6, dtype=np.int32).reshape(2, 3))
    specs = [cli._example_spec(s) for s in ("float32[2,3]", "int64[ 4 ]", "bool[]", "uint8[0,5]",
                                            f"{d}/x.npy", "py:torch.ones(2)")]
    xs = cli._example_inputs(specs, for_torch=True)
    assert [tuple(x.shape) for x in xs] == [(2, 3), (4,), (), (0, 5), (2, 3), (2,)]
    assert [x.dtype for x in xs] == [torch.float32, torch.int64, torch.bool, torch.uint8, torch.int32, torch.float32]
    assert bool(((xs[1] >= 0) & (xs[1] < 10)).all())  # ints small enough to index an embedding
    np.testing.assert_array_equal(cli._example_inputs(specs[:1], for_torch=False)[0], xs[0].numpy())
    assert isinstance(cli._example_inputs(specs[:1], for_torch=False)[0], np.ndarray)


def test_internal_error_is_one_line_and_debug_reraises(d, capsys, monkeypatch):
    def bug(a):
        raise KeyError("oops")
    monkeypatch.setattr(cli, "cmd_run", bug)
    rc, out, err = run_cli(capsys, ["run", d / "notart"])
    assert_one_error(rc, err, "internal error: KeyError: 'oops' (set CUVIL_DEBUG=1 for the traceback)")
    monkeypatch.setenv("CUVIL_DEBUG", "1")
    with pytest.raises(KeyError):
        cli.main(["run", str(d / "notart")])


def test_multiline_error_keeps_its_details_below_one_error_line(d, capsys, monkeypatch):
    def unsupported(a):
        raise UnsupportedOpError([("aten.fft", "net.py:3"), ("aten.stft", None)])
    monkeypatch.setattr(cli, "cmd_run", unsupported)
    rc, out, err = run_cli(capsys, ["run", d / "notart"])
    assert_one_error(rc, err, "cuvil: error: 2 unsupported op(s): aten.fft, aten.stft")
    assert err.splitlines()[1:] == ["  aten.fft  at net.py:3", "  aten.stft  at <unknown location>"]


@pytest.mark.parametrize("argv, needle", [
    (["compile", "m.py::NeedsArgs", "-o", "o"], "m.py::NeedsArgs() failed: TypeError"),
    (["bench", "nothere.cuvil", "--repeat", "0"], "argument --repeat"),
])
def test_real_entry_point(d, argv, needle):
    r = subprocess.run([sys.executable, "-m", "cuvil", *argv], cwd=d, capture_output=True, text=True, timeout=300)
    assert_one_error(r.returncode, r.stderr, needle)
