"""Helpers for tests: compile a hand-built IR graph, compare with tolerances."""
from __future__ import annotations

import numpy as np

from cuvil.build import cache
from cuvil.driver import Progress, build_graph
from cuvil.ir import interpreter
from cuvil.options import make_options


def compile_graph(graph, **opts):
    """IR Graph -> CompiledModel (through passes, codegen, build and the cache)."""
    o = make_options(**opts)
    return build_graph(graph, o, cache.default_dir(), Progress(False))


def check_graph(graph, inputs, rtol=1e-4, atol=1e-4, **opts):
    """Compile graph, run it and the reference interpreter on inputs, assert they agree."""
    import copy
    expected = interpreter.run(copy.deepcopy(graph), *inputs)
    cm = compile_graph(graph, **opts)
    got = cm.run(*inputs)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.shape == e.shape, (g.shape, e.shape)
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    return cm


def import_file(path):
    """The Python file at `path` (a model file the CLI tests also compile) as a module of its own,
    registered in sys.modules under a name unique to the path (torch.jit.script looks it up)."""
    import importlib.util
    import sys
    from pathlib import Path
    path = Path(path)
    name = f"_under_test_{abs(hash(str(path.resolve())))}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_kernels(files, flags):
    """Some of the kernel library's C files built by themselves into a shared library with `flags`
    (an ISA to test on this host), or where `flags` are a compile target's, that target's whole kernel
    library (_target_of): the loaded ctypes.CDLL. Built once per test run for the same files,
    flags and kernel sources, whichever worker asks first (the others wait on a lock and load it): a
    build of test_int8dot's files is up to a minute and a half on CI's two cores, and its module fixture
    serves test_depthwise_bytes too."""
    import ctypes
    import fcntl
    import hashlib
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    from cuvil.build.toolchain import COMMON_FLAGS, KERNELS_DIR
    target = _target_of(flags)
    # a target's whole library is one build whatever files were asked for
    h = hashlib.sha256(repr((() if target else tuple(files), tuple(flags), COMMON_FLAGS, target)).encode())
    for src in sorted(KERNELS_DIR.glob("*.[ch]")):
        h.update(src.name.encode() + src.read_bytes())
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    cache = Path(tempfile.gettempdir()) / f"cuvil-test-kernels-{run}"
    cache.mkdir(exist_ok=True)
    so = cache / f"{h.hexdigest()[:24]}.so"
    with open(so.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not so.exists():
            tmp = so.with_suffix(f".{os.getpid()}.tmp")
            if target:          # that target's whole library, as the compiler's tests build it once a run
                link_kernel_library(target, tmp)
            else:
                subprocess.run(["gcc", *COMMON_FLAGS, "-shared", *flags, *(str(KERNELS_DIR / f) for f in files),
                                "-o", str(tmp), "-lm"], check=True)
            os.replace(tmp, so)
    return ctypes.CDLL(str(so))


def kernel_library(target):
    """The run's kernel library (libcuvil_kernels.a) for `target`, as the compiler builds it for a model:
    built once a run, in the run's cache (conftest.py)."""
    import os
    from pathlib import Path

    from cuvil.build.toolchain import kernels_object
    return kernels_object(target, Path(os.environ["CUVIL_CACHE_DIR"]))


def link_kernel_library(target, out):
    """kernel_library(target) linked whole into the shared library `out` (its objects are position
    independent), every symbol resolved."""
    import subprocess

    from cuvil.build.toolchain import COMMON_FLAGS, find_compiler, target_flags
    subprocess.run([find_compiler(), *COMMON_FLAGS, *target_flags(target), "-shared", "-Wl,--no-undefined",
                    "-Wl,--whole-archive", str(kernel_library(target)), "-Wl,--no-whole-archive", "-lm", "-o", str(out)],
                   check=True, capture_output=True)
    return out


def _target_of(flags):
    """The compile target whose flags these are (cuvil.build.toolchain.target_flags), or None: its kernel
    library is then linked whole rather than `files` compiled again (single-threaded, up to a minute and
    a half each on CI's two cores)."""
    from cuvil.build.toolchain import target_flags
    return next((t for t in ("native", "x86_64-sse2", "x86_64-avx2", "x86_64-avx512") if list(flags) == target_flags(t)),
                None)


def branching_conv_block(cin, cout, k, stride, pad, dil):
    """A 1x1 conv with ReLU feeding two k x k convs whose sum is ReLU'd: bias, residual and activation
    fused into a conv, every source kind of a blocked conv by k / stride / pad (the lower-precision
    convs' tests against torch)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(cin, cin, 1)
            self.c = torch.nn.Conv2d(cin, cout, k, stride, pad, dil)
            self.r = torch.nn.Conv2d(cin, cout, k, stride, pad, dil)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return torch.relu(self.c(h) + self.r(h))
    return Block().eval()


def compile_linked_and_plain(model, args, tmp_path, monkeypatch, **opts):
    """(linked, plain): the model compiled as it is, and with passes/quantize.link_int8_convs and
    link_bf16_convs switched off, so that every map between integer or bf16 convs stays in floats (the
    oracle the byte and bf16 links are checked against)."""
    import cuvil
    from cuvil.passes import quantize
    linked = cuvil.compile(model, args, cache_dir=tmp_path / "linked", **opts)
    for link in ("link_int8_convs", "link_bf16_convs"):
        monkeypatch.setattr(quantize, link, lambda graph, backend: graph)
    return linked, cuvil.compile(model, args, cache_dir=tmp_path / "plain", **opts)


def skip_unless_host_runs(target):
    """pytest.skip where this CPU cannot run code built for `target` (the builds with explicit flags)."""
    import platform

    import pytest

    from cuvil.target import cpu_flags
    needs = {"x86_64-avx512": "avx512f", "x86_64-avx2": "avx2"}.get(target)
    if needs and needs not in cpu_flags():
        pytest.skip(f"this CPU cannot run {target} code")
    if target.startswith("x86_64") and platform.machine() != "x86_64":
        pytest.skip(f"{target} code runs on x86-64 hosts only")
