"""The spellings of the project's seed examples, run as written: the CLI line (`--input FILE::Class
... --output lib.so`), the SimpleNet FX-style module, `compile_model` without example inputs (a
clear error), `InferenceSession(model=..., device=...)`, `verify=True` with rtol/atol, a device
other than the CPU refused, `cuvil.profiler.export_chrome_trace`, and TorchScript modules."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import cuvil

from .util import import_file

torch = pytest.importorskip("torch", reason="the oracle is torch eager (a dev requirement)")

SIMPLE_NET = """import torch
class SimpleNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(10, 20)
        self.fc2 = torch.nn.Linear(20, 5)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
"""


@pytest.fixture()
def simple_net(tmp_path):
    (tmp_path / "simple_net.py").write_text(SIMPLE_NET)
    return tmp_path, import_file(tmp_path / "simple_net.py").SimpleNet().eval()


def test_cli_line_with_input_and_output_library(simple_net):
    d, net = simple_net
    subprocess.run([sys.executable, "-m", "cuvil", "compile", "--input", f"{d / 'simple_net.py'}::SimpleNet",
                    "--example-input", "float32[1,10]", "--output", str(d / "lib.so"), "--quiet"], check=True)
    header = (d / "lib.h").read_text()
    assert "cuvil_create_embedded" in header
    # the library runs with no weights file: through ctypes, as a C program would
    import ctypes
    lib = ctypes.CDLL(str(d / "lib.so"))
    lib.cuvil_create_embedded.restype = ctypes.c_void_p
    lib.cuvil_arena_size.restype = ctypes.c_int64
    lib.cuvil_run.argtypes = [ctypes.c_void_p] * 5
    handle = lib.cuvil_create_embedded(1)
    assert handle
    x = np.random.default_rng(0).standard_normal((1, 10)).astype(np.float32)
    y = np.empty((1, 5), np.float32)
    shape = (ctypes.c_int64 * 2)(1, 10)
    arena = np.empty(lib.cuvil_arena_size() + 64, np.uint8)
    ins = (ctypes.c_void_p * 1)(x.ctypes.data)
    shapes = (ctypes.POINTER(ctypes.c_int64) * 1)(ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)))
    outs = (ctypes.c_void_p * 1)(y.ctypes.data)
    assert lib.cuvil_run(handle, ins, shapes, outs, arena.ctypes.data + (-arena.ctypes.data % 64)) == 0
    np.testing.assert_allclose(y, net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_cli_model_given_twice_or_never(simple_net):
    d, _ = simple_net
    for args in ([f"{d / 'simple_net.py'}::SimpleNet", "--input", f"{d / 'simple_net.py'}::SimpleNet"], []):
        r = subprocess.run([sys.executable, "-m", "cuvil", "compile", *args, "--example-input", "float32[1,10]",
                            "-o", str(d / "o")], capture_output=True, text=True)
        assert r.returncode == 2 and "give the model once" in r.stderr


def test_compile_model_without_example_inputs_says_what_to_pass(simple_net):
    _, net = simple_net
    with pytest.raises(cuvil.CuvilError, match="SimpleNet.forward takes x: pass example inputs for x"):
        cuvil.compile_model(net)


def test_session_model_keyword_and_device(simple_net):
    _, net = simple_net
    x = torch.randn(3, 10)
    cm = cuvil.compile_model(net, (x,), verify=True, rtol=1e-5, atol=1e-6)
    sess = cuvil.InferenceSession(model=cm, device="cpu")
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(y, net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    for bad in (lambda: cuvil.InferenceSession(model=cm, device="cuda:0"),
                lambda: cuvil.compile(net, (x,), device="cuda"),
                lambda: cm.to("cuda:0")):
        with pytest.raises(ValueError, match="GPU devices are not supported"):
            bad()
    assert cm.to("cpu") is cm and cm.to(torch.device("cpu")) is cm
    with pytest.raises(cuvil.CuvilError, match="compile the torch module first"):
        cuvil.InferenceSession(model=net)
    with pytest.raises(cuvil.CuvilError, match="takes one model"):
        cuvil.InferenceSession(cm, model=cm)


def test_verify_tolerances_are_used(simple_net):
    _, net = simple_net
    x = torch.randn(3, 10)
    with pytest.raises(ValueError, match="rtol=-1"):
        cuvil.compile(net, (x,), verify=True, rtol=-1)
    # a tolerance of zero is stricter than float reassociation allows on some output: it may fail, and
    # when it does the error names the tolerances used
    try:
        cuvil.compile(net, (x,), verify=True, rtol=0.0, atol=0.0)
    except cuvil.VerificationError as e:
        assert "rtol=0.0" in str(e) and "atol=0.0" in str(e)


def test_export_chrome_trace_filters(simple_net, tmp_path):
    _, net = simple_net
    x = torch.randn(3, 10)
    cm = cuvil.compile(net, (x,), profile=True, fusion_level=0)
    ops = {label.split(":", 1)[1] for label, _ in cm.module.profile_counters()} or None
    path = cuvil.profiler.export_chrome_trace(cm, x.numpy(), trace_file=tmp_path / "t.json", runs=2)
    events = json.loads(path.read_text() if hasattr(path, "read_text") else open(path).read())["traceEvents"]
    names = {e["name"] for e in events}
    assert names and (ops is None or names <= ops | names)
    some = sorted(names)[0]
    only = json.loads(open(cuvil.profiler.export_chrome_trace(cm, x.numpy(), trace_file=tmp_path / "o.json",
                                                              include_ops={some})).read())["traceEvents"]
    assert {e["name"] for e in only} == {some}
    rest = json.loads(open(cuvil.profiler.export_chrome_trace(cm, x.numpy(), trace_file=tmp_path / "r.json",
                                                              exclude_kernels=[some[:3] + "*"])).read())["traceEvents"]
    assert all(not e["name"].startswith(some[:3]) for e in rest)
    whole = json.loads(open(cuvil.profiler.export_chrome_trace(cm, x.numpy(), trace_file=tmp_path / "w.json",
                                                               include_ops=False)).read())["traceEvents"]
    assert len(whole) == 1 and whole[0]["dur"] >= 0


@pytest.mark.parametrize("how", ["script", "trace"])
def test_torchscript_module(simple_net, tmp_path, how):
    _, net = simple_net
    x = torch.randn(4, 10)
    ts = torch.jit.script(net) if how == "script" else torch.jit.trace(net, (x,))
    ts.save(str(tmp_path / "m.pt"))
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    cm = cuvil.compile(loaded, (x,))
    np.testing.assert_allclose(cm(x).numpy(), loaded(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_torchscript_that_does_not_convert_is_a_clear_error():
    class Weird(torch.nn.Module):
        def forward(self, x):
            for _ in range(int(x.sum().item()) % 3):       # a trip count read from the data
                x = x + 1
            return x
    ts = torch.jit.script(Weird())
    with pytest.raises(cuvil.CuvilError):
        cuvil.compile(ts, (torch.randn(3, 4),))
