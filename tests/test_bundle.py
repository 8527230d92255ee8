"""Deployment bundles: two models compiled by `cuvil compile --name N -o libN.a|.so` (weights
embedded) link into examples/c/two_models.c, which runs with no Python and no files and prints what
torch eager computes; for aarch64 the same program is cross-linked and run under qemu-user."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuvil.target import TARGETS

from .util import import_file

torch = pytest.importorskip("torch", reason="the oracle is torch eager (a dev requirement)")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "c" / "two_models.c"
MODELS = """import torch
class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.l = torch.nn.Linear(16, 8)
    def forward(self, x):
        return torch.nn.functional.gelu(self.l(x))
class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.l = torch.nn.Linear(8, 4)
    def forward(self, x):
        return torch.tanh(self.l(x))
"""


def _expected(tmp_path):
    two_nets = import_file(tmp_path / "two_nets.py")
    x = (torch.arange(16, dtype=torch.float32) / 16 - 0.5).reshape(1, 16)
    with torch.no_grad():
        return two_nets.Head()(two_nets.Encoder()(x)).numpy().ravel()


def _bundles(tmp_path, suffix, target="native"):
    (tmp_path / "two_nets.py").write_text(MODELS)
    for cls, name, width in (("Encoder", "encoder", 16), ("Head", "head", 8)):
        subprocess.run([sys.executable, "-m", "cuvil", "compile", f"{tmp_path / 'two_nets.py'}::{cls}",
                        "--example-input", f"float32[1,{width}]", "--name", name, "--target", target, "--quiet",
                        "-o", str(tmp_path / f"lib{name}{suffix}")], check=True)
        assert (tmp_path / f"lib{name}.h").is_file()


@pytest.mark.parametrize("suffix", [".a", ".so"])
def test_two_models_link_into_one_c_program(tmp_path, suffix):
    _bundles(tmp_path, suffix)
    libs = [str(tmp_path / f"lib{n}{suffix}") for n in ("encoder", "head")]
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", f"-I{tmp_path}", str(EXAMPLE), *libs, "-lm", "-pthread",
                    "-Wl,-rpath,$ORIGIN", "-o", str(tmp_path / "two_models")], check=True)
    for n in ("encoder", "head"):          # the weights are in the libraries: no file is read
        assert not (tmp_path / f"lib{n}").exists()
    out = subprocess.run([str(tmp_path / "two_models")], capture_output=True, text=True, check=True, cwd="/")
    np.testing.assert_allclose(np.array(out.stdout.split(), np.float32), _expected(tmp_path), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-gcc") and TARGETS["aarch64-neon"].runner_command()),
                    reason="needs gcc-aarch64-linux-gnu and qemu-user (make setup installs them as root)")
def test_static_bundles_for_aarch64_run_under_qemu(tmp_path):
    _bundles(tmp_path, ".a", target="aarch64-neon")
    libs = [str(tmp_path / f"lib{n}.a") for n in ("encoder", "head")]
    subprocess.run(["aarch64-linux-gnu-gcc", "-std=c11", "-static", f"-I{tmp_path}", str(EXAMPLE), *libs, "-lm",
                    "-pthread", "-o", str(tmp_path / "two_models")], check=True)
    out = subprocess.run([*TARGETS["aarch64-neon"].runner_command(), str(tmp_path / "two_models")],
                         capture_output=True, text=True, check=True)
    np.testing.assert_allclose(np.array(out.stdout.split(), np.float32), _expected(tmp_path), rtol=1e-5, atol=1e-6)


def test_bundle_suffix_and_flags_are_checked(tmp_path):
    (tmp_path / "two_nets.py").write_text(MODELS)
    r = subprocess.run([sys.executable, "-m", "cuvil", "compile", f"{tmp_path / 'two_nets.py'}::Head",
                        "--example-input", "float32[1,8]", "--embed-weights", "--quiet", "-o", str(tmp_path / "d")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--embed-weights builds one library" in r.stderr


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=40))
def test_fuzz_model_names_reaching_c(name):
    """--name / name= becomes C identifiers: only [A-Za-z][A-Za-z0-9_]{0,31} is accepted."""
    import re

    from cuvil.codegen.c.frame import symbol_prefix
    from cuvil.options import make_options
    try:
        make_options(name=name)
    except ValueError:
        assert not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,31}", name, re.ASCII)
        return
    assert re.fullmatch(r"cuvil_[A-Za-z][A-Za-z0-9_]{0,31}_", symbol_prefix(name), re.ASCII)


@pytest.fixture(scope="module")
def small_artifact(tmp_path_factory):
    import cuvil
    torch.manual_seed(0)
    return cuvil.compile(torch.nn.Linear(3, 2), (torch.randn(1, 3),), name="small").save(
        tmp_path_factory.mktemp("small") / "a")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.text(max_size=40) | st.sampled_from(["cuvil_", "cuvil_x_", "cuvil_a\\nb_", 'cuvil_"_', "cuvil_x_;"]))
def test_fuzz_manifest_prefix_reaching_the_bundle(small_artifact, tmp_path_factory, prefix):
    """The bundle's generated C names its symbols by the manifest's symbol_prefix: an edited prefix
    (resealed, so only the field check stands between it and the C) is refused unless it is one."""
    import json
    import re
    import shutil as sh

    from cuvil.build import bundle, cache
    from cuvil.errors import CuvilError
    from cuvil.runtime import artifact
    d = tmp_path_factory.mktemp("p") / "a"
    sh.copytree(small_artifact, d)
    m = json.loads((d / "manifest.json").read_text())
    m["symbol_prefix"] = prefix
    m["content_hash"] = artifact._content_hash(m)
    (d / "manifest.json").write_text(json.dumps(m))
    valid = re.fullmatch(r"cuvil_([A-Za-z][A-Za-z0-9_]{0,31}_)?", prefix, re.ASCII)
    if valid:
        return                     # a valid prefix builds (test_two_models_link_into_one_c_program)
    with pytest.raises(CuvilError, match="symbol_prefix"):
        bundle.build(d, d.parent / "lib.a", cache.usable_dir(None))
