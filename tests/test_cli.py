"""The command line, run as a user would: compile, run, inspect, bench, llm compile/run."""
import subprocess
import sys
import textwrap

import numpy as np
import torch

from cuvil.target import vector_floats


def cuvil(*args, cwd):
    r = subprocess.run([sys.executable, "-m", "cuvil", *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    return r


NET = textwrap.dedent("""
    import torch
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 4)
        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean((2, 3)))
""")


def test_compile_run_inspect_bench(tmp_path):
    (tmp_path / "net.py").write_text(NET)
    r = cuvil("compile", "net.py::Net", "--example-input", "float32[2,3,16,16]", "-o", "m.cuvil", "--verify",
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[cuvil] export" in r.stderr and "max abs err" in r.stdout
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cuvil("run", "m.cuvil", "--input", "x.npy", "--output-dir", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sys.path.insert(0, str(tmp_path))
    from net import Net
    ref = Net().eval()(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output0.npy"), ref, rtol=1e-4, atol=1e-4)
    for stage, needle in (("frontend", "conv("), ("passes", "matmul_fused"), ("memplan", "arena:"), ("c", "cuvil_run")):
        r = cuvil("inspect", "net.py::Net", "--example-input", "x.npy", "--stage", stage, cwd=tmp_path)
        assert r.returncode == 0 and needle in r.stdout, (stage, r.stderr[-2000:])
    r = cuvil("bench", "m.cuvil", "--repeat", "5", cwd=tmp_path)
    assert r.returncode == 0 and "median" in r.stdout


def test_help_and_errors(tmp_path):
    for cmd in (["--help"], ["compile", "--help"], ["run", "--help"], ["inspect", "--help"], ["llm", "compile", "--help"]):
        r = cuvil(*cmd, cwd=tmp_path)
        assert r.returncode == 0 and "usage" in r.stdout
    r = cuvil("run", "missing.cuvil", "--input", "x.npy", cwd=tmp_path)
    assert r.returncode == 2 and "cuvil: error" in r.stderr and "Traceback" not in r.stderr
    r = cuvil("compile", "net.py::Net", "--example-input", "float32[1,3,8,8]", "--target", "mips", "-o", "m",
              cwd=tmp_path)
    assert r.returncode == 2 and "invalid choice: 'mips'" in r.stderr


def test_compile_onnx_with_constant_input(tmp_path):
    """A shape-deciding ONNX input: a clear error without its value, a working artifact with it."""
    import onnx
    from onnx import TensorProto, helper
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    S = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g", [X, S],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "r.onnx"))
    r = cuvil("compile", "r.onnx", "-o", "r.cuvil", cwd=tmp_path)
    assert r.returncode == 2 and "constant_inputs" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = cuvil("compile", "r.onnx", "-o", "r.cuvil", "--constant-input", "shape=4,6", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.save(tmp_path / "x.npy", x)
    r = cuvil("run", "r.cuvil", "--input", "x.npy", "--output-dir", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "output0.npy"), x.reshape(4, 6))


def test_llm_compile_and_run(tmp_path):
    from .llm_fixtures import checkpoint
    checkpoint(tmp_path / "ckpt")
    r = cuvil("llm", "compile", "ckpt", "-o", "m.cuvil", "--precision", "int4", "--max-seq-len", "64", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "top-1 agreement" in r.stdout
    r = cuvil("llm", "run", "m.cuvil", "--prompt", "le café", "--max-new-tokens", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tokens/s" in r.stderr


def test_inspect_shows_the_layout_asked_for(tmp_path):
    (tmp_path / "two.py").write_text(textwrap.dedent("""
        import torch
        class Two(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Conv2d(16, 32, 1), torch.nn.Conv2d(32, 16, 3, padding=1)
            def forward(self, x):
                return self.b(torch.relu(self.a(x)))
    """))
    out = {}
    # the second with the opted-in Python form of --example-input
    for layout, example in (("nchw", "float32[1,16,8,8]"), ("blocked", "py:torch.randn(1,16,8,8)")):
        r = cuvil("inspect", "two.py::Two", "--example-input", example, "--stage", "passes",
                  "--layout", layout, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        out[layout] = r.stdout
    assert "relayout(" not in out["nchw"] and out["blocked"].count("relayout(") == 2
    assert out["blocked"].count(f"layout=nchw{vector_floats()}c") == 2
