"""Issue 37, defect 0: the compile cache's shortcut never answers for a different model. Each case
compiles a model, changes one thing that decides its graph (code, attribute, buffer, parameter,
dtype, shape, a global its code reads, a hook, the training flag), compiles again with the same
cache, and checks both results against eager PyTorch."""
from __future__ import annotations

import importlib.util
import sys
import textwrap

import numpy as np
import pytest
import torch

import cuvil


def _check(m, args, cache_dir):
    cm = cuvil.compile(m, args, cache_dir=cache_dir)
    with torch.no_grad():
        want = m(*args)
    np.testing.assert_allclose(cm.run(*[a.numpy() for a in args])[0], want.numpy(), rtol=1e-5, atol=1e-5)
    return cm


class Scale(torch.nn.Module):
    def __init__(self, s, eps=1e-5):
        super().__init__()
        self.s, self.eps = s, eps
        self.register_buffer("shift", torch.zeros(4), persistent=False)
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.s * self.w + self.shift + self.eps


def _two_classes_named_m():
    def make(fn):
        class M(torch.nn.Module):
            def forward(self, x):
                return fn(x)
        return M
    A = make(torch.abs)
    B = make(torch.neg)

    class C(torch.nn.Module):          # same name again, the code itself differs
        def forward(self, x):
            return torch.abs(x) * 2
    C.__name__ = C.__qualname__ = "M"
    return A(), B(), C()


def test_attribute_buffer_parameter_changes(tmp_path):
    x = torch.randn(3, 4)
    m = Scale(2.0).eval()
    _check(m, (x,), tmp_path)
    assert _check(m, (x,), tmp_path).report["cache"] == "hit"     # unchanged: the shortcut still works
    m.s = 3.0                                                      # a float attribute
    _check(m, (x,), tmp_path)
    m.eps = 0.5                                                    # another one
    _check(m, (x,), tmp_path)
    with torch.no_grad():
        m.shift += 1.0                                             # a non-persistent buffer
    _check(m, (x,), tmp_path)
    with torch.no_grad():
        m.w.mul_(-1)                                               # a parameter
    _check(m, (x,), tmp_path)
    _check(m, (torch.randn(5, 4),), tmp_path)                      # a shape
    _check(m.double(), (x.double(),), tmp_path)                    # a dtype


def test_same_class_name_different_code(tmp_path):
    x = torch.randn(3, 4)
    for m in _two_classes_named_m():
        _check(m, (x,), tmp_path)


def test_edited_source_file(tmp_path):
    """A user edits forward in their file and recompiles in a new interpreter state."""
    src = tmp_path / "user_model.py"
    x = torch.randn(2, 4)
    for body in ("torch.relu(x) + 1", "torch.relu(x) - 1", "torch.sigmoid(x)"):
        src.write_text(textwrap.dedent(f"""
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    return {body}
        """))
        spec = importlib.util.spec_from_file_location("user_model", src)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["user_model"] = mod
        spec.loader.exec_module(mod)
        _check(mod.Net(), (x,), tmp_path)
    del sys.modules["user_model"]


GAIN = 2.0


def _helper(x):
    return x * GAIN


class UsesGlobals(torch.nn.Module):
    def forward(self, x):
        return _helper(x) + 1


def test_globals_hooks_and_mode(tmp_path, monkeypatch):
    x = torch.randn(3, 4)
    m = UsesGlobals()
    _check(m, (x,), tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "GAIN", 5.0)        # a global the helper reads
    _check(m, (x,), tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "_helper", lambda x: x - 7)   # the helper itself
    _check(m, (x,), tmp_path)
    d = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    _check(d.eval(), (x,), tmp_path)
    h = d[0].register_forward_hook(lambda mod, inp, out: out * 3)   # a hook changes the output
    _check(d, (x,), tmp_path)
    h.remove()
    _check(d, (x,), tmp_path)


class Opaque:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v


class HoldsOpaque(torch.nn.Module):
    def __init__(self, v):
        super().__init__()
        self.o = Opaque(v)

    def forward(self, x):
        return x * self.o.v


def test_unreadable_attribute_means_no_shortcut(tmp_path):
    """An attribute the key cannot read: every compile exports (correct, just slower)."""
    from cuvil.frontend.torch_key import source_key
    m = HoldsOpaque(2.0)
    assert source_key(m, ((torch.randn(2),), {}), "") is None
    x = torch.randn(2, 3)
    _check(m, (x,), tmp_path)
    m.o.v = 4.0
    _check(m, (x,), tmp_path)
