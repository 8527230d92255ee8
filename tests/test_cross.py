"""Cross-compilation: artifacts built here for aarch64 (gcc-aarch64-linux-gnu) run under qemu-user
through their C runner, and for wasm32-wasi (clang, lld, wasi-libc) under wasmtime, and match torch
eager. `make setup` installs the Debian packages (and the dev requirements wasmtime); without them
these tests skip and say why."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuvil
from cuvil.build import toolchain
from cuvil.errors import ArtifactError, CompileError
from cuvil.runtime.module import Module
from cuvil.target import TARGETS

from .util import import_file

torch = pytest.importorskip("torch", reason="the oracle is torch eager (a dev requirement)")
AARCH64 = TARGETS["aarch64-neon"]


def _ready(target):
    t = TARGETS[target]
    return not t.missing_packages() and t.runner_command() is not None


def _needs(target):
    t = TARGETS[target]
    return pytest.mark.skipif(not _ready(target), reason=f"{target} needs {', '.join(t.packages)} and its runner "
                                                         f"{t.runner[0]} (make setup installs them as root)")


needs_cross = _needs("aarch64-neon")
CROSS_TARGETS = [pytest.param(t, marks=_needs(t)) for t in ("aarch64-neon", "wasm32-wasi")]
ZOO = ["mlp", "resnet", "bert", "minilm", "gpt2", "llama"]


def _eager(model, args):
    from torch.utils import _pytree
    with torch.no_grad():
        out = model(*args)
    return [t.numpy() for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("target", CROSS_TARGETS)
@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_for_foreign_target_matches_eager_emulated(name, target, tmp_path):
    pytest.importorskip("transformers", reason="the zoo models come from transformers configs (a dev requirement)")
    from . import models
    model, args = models.ALL[name]()
    cm = cuvil.compile(model, args, target=target, cache_dir=tmp_path / "cache")
    assert type(cm.module).__name__ == "EmulatedModule"
    with open(cm.path / "cuvil_run", "rb") as f:        # aarch64 machine code (ELF e_machine 183), or wasm
        head = f.read(20)
    assert head[:4] == b"\0asm" if target.startswith("wasm") else int.from_bytes(head[18:20], "little") == 183
    got = cm.run(*[a.numpy() for a in args])
    for g, e in zip(got, _eager(model, args), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


@needs_cross
def test_runner_needs_no_python(tmp_path):
    """The artifact's cuvil_run, run directly under qemu-aarch64 (as on a Pi: no Python, no numpy)."""
    from . import models
    model, (x,) = models.mlp()
    cuvil.compile(model, (x,), target="aarch64-neon", cache_dir=tmp_path / "cache").save(tmp_path / "m.cuvil")
    d = tmp_path / "m.cuvil"
    assert os.access(d / "cuvil_run", os.X_OK)
    np.save(tmp_path / "x.npy", x.numpy())
    subprocess.run([*AARCH64.runner_command(), str(d / "cuvil_run"), "-w", str(d / "weights.bin"), "-t", "2",
                    "-o", str(tmp_path), str(tmp_path / "x.npy")], check=True)
    np.testing.assert_allclose(np.load(tmp_path / "output0.npy"), _eager(model, (x,))[0], rtol=1e-4, atol=1e-4)


@needs_cross
def test_cli_compile_and_run_for_aarch64(tmp_path):
    src = tmp_path / "net.py"
    src.write_text("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        torch.manual_seed(0)\n        self.l = torch.nn.Linear(6, 3)\n"
                   "    def forward(self, x):\n        return torch.tanh(self.l(x))\n")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32))
    cli = [sys.executable, "-m", "cuvil"]
    subprocess.run([*cli, "compile", f"{src}::Net", "--example-input", str(tmp_path / "x.npy"), "--target",
                    "aarch64-neon", "--verify", "--quiet", "-o", str(tmp_path / "m.cuvil")], check=True)
    subprocess.run([*cli, "run", str(tmp_path / "m.cuvil"), "--input", str(tmp_path / "x.npy"), "--output-dir",
                    str(tmp_path / "out")], check=True)
    want = import_file(src).Net()(torch.from_numpy(np.load(tmp_path / "x.npy"))).detach().numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output0.npy"), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target,precision", [pytest.param(*tp, marks=_needs(tp[0])) for tp in (
    ("aarch64-neon", "int4"), ("aarch64-neon-dotprod", "int4"), ("aarch64-neon-dotprod", "int8"),
    ("wasm32-wasi", "int4"))])
def test_quantized_llama_decodes_the_same_tokens_on_aarch64(tmp_path, target, precision):
    """The portable integer tiles (Armv8.0) and the SDOT ones (Armv8.2 dotprod) sum the same integers
    as x86's maddubs/VNNI tiles: same prefill logits up to float order, same greedy tokens."""
    transformers = pytest.importorskip("transformers", reason="the zoo models come from transformers configs (a dev requirement)")
    from cuvil import llm
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=256, max_position_embeddings=128)).eval()
    prompt = list(range(3, 15))
    tokens, logits = {}, {}
    for t in ("native", target):
        m = llm.from_transformers(model, precision=precision, max_seq_len=64, target=t, measure_error=False,
                                  cache_dir=tmp_path / "cache")
        logits[t] = m.prefill(prompt)
        tokens[t] = m.generate(prompt, max_new_tokens=16)
    assert type(m.module).__name__ == "EmulatedModule"
    np.testing.assert_allclose(logits[target], logits["native"], rtol=1e-4, atol=1e-4)
    assert tokens[target] == tokens["native"]
    if target.startswith("aarch64"):
        dump = subprocess.run([TARGETS[target].tool("objdump"), "-d", str(m.path / "cuvil_run")],
                              capture_output=True, text=True, check=True).stdout
        assert ("\tsdot\t" in dump) == target.endswith("dotprod")


@needs_cross
def test_foreign_artifact_is_not_loaded_natively(tmp_path):
    from . import models
    model, args = models.mlp()
    cm = cuvil.compile(model, args, target="aarch64-neon", cache_dir=tmp_path / "cache")
    with pytest.raises(ArtifactError, match="built for aarch64-neon .aarch64.*cuvil.load"):
        Module(cm.path)


@pytest.mark.parametrize("target,message", [("aarch64-neon", "aarch64-linux-gnu-gcc.*apt-get install gcc-aarch64-linux-gnu"),
                                            ("wasm32-wasi", "clang.*apt-get install clang lld llvm")])
def test_missing_cross_compiler_names_the_package(tmp_path, monkeypatch, target, message):
    from . import models
    monkeypatch.setenv("PATH", str(tmp_path))           # no cross compiler on it
    toolchain.find_compiler.cache_clear()
    toolchain.compiler_version.cache_clear()
    try:
        with pytest.raises(CompileError, match=message):
            cuvil.compile(*models.mlp(), target=target, cache_dir=tmp_path / "cache")
    finally:
        toolchain.find_compiler.cache_clear()
        toolchain.compiler_version.cache_clear()


@pytest.mark.parametrize("target", CROSS_TARGETS)
def test_missing_emulator_names_the_package(tmp_path, monkeypatch, target):
    import importlib.util
    from . import models
    model, args = models.mlp()
    cm = cuvil.compile(model, args, target=target, cache_dir=tmp_path / "cache")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    want = "wasmtime: pip install 'cuvil.wasm.'" if target.startswith("wasm") else "qemu-aarch64: apt-get install qemu-user"
    with pytest.raises(ArtifactError, match=want):
        cuvil.load(cm.path)


MANIFEST_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=20),
                            st.sampled_from(["aarch64", "x86_64", "wasm32", "aarch64-neon", "wasm32-wasi", "native",
                                             "x86_64-avx512"]),
                            st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=5), st.none(),
                                                                                       max_size=2))


@pytest.mark.parametrize("target", ["native", *CROSS_TARGETS])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_arch_and_target_fields(tmp_path_factory, target, data):
    """The manifest's arch and target decide how an artifact runs (natively, emulated, or refused):
    any value there, resealed or not, gives a CuvilError or the right answer, never another error."""
    import json
    from cuvil.runtime import artifact
    from . import models
    model, (x,) = models.mlp()
    key = f"fuzz-{target}"
    if key not in _BUILT:
        _BUILT[key] = cuvil.compile(model, (x,), target=target).save(tmp_path_factory.mktemp(key) / "a")
    d = tmp_path_factory.mktemp("edit") / "a"
    shutil.copytree(_BUILT[key], d)
    m = json.loads((d / "manifest.json").read_text())
    for field in data.draw(st.lists(st.sampled_from(["arch", "target"]), min_size=1, max_size=2, unique=True)):
        m[field] = data.draw(MANIFEST_VALUES)
    if data.draw(st.booleans()):
        m["content_hash"] = artifact._content_hash(m)
    (d / "manifest.json").write_text(json.dumps(m))
    try:
        got = cuvil.load(d).run(x.numpy())
    except cuvil.CuvilError:
        return
    np.testing.assert_allclose(got[0], _eager(model, (x,))[0], rtol=1e-4, atol=1e-4)


_BUILT = {}
