"""The compile cache's shortcut key for a torch.nn.Module: a repeat compile of the same model skips
torch.export (seconds) when this key finds the artifact it produced before.

The key must change whenever the exported graph could: the code that runs (every method of every
submodule's class, and what those methods reach through their globals and closures), every
non-tensor attribute (an eps, a scale, a flag, the training mode, hooks), every parameter and
buffer (persistent or not) by content, the example inputs' structure, shapes, dtypes and non-tensor
values, and the versions of torch and of the libraries the model's classes come from. Code is hashed
as compiled (marshal), so an edit to `forward` counts even in a class that keeps its name.

Anything the key cannot account for (an object with no `__dict__` to read, an unreadable
attribute) gives no key at all: the compile then exports, which is slower but never wrong."""
from __future__ import annotations

import enum
import functools
import hashlib
import importlib.metadata
import marshal
import os
import sys
import sysconfig
import types

import numpy as np
import torch

MAX_DEPTH = 12
_SLICE = 1 << 26


class Unkeyable(Exception):
    """Something in the model that the key cannot account for."""


@functools.lru_cache(None)
def _library_roots() -> tuple:
    """Folders of installed code (the standard library, site-packages): its code is keyed by the
    package's version, not hashed."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(roots))


@functools.lru_cache(4096)
def _library_version(module_name: str) -> str | None:
    """'torch 2.13.0' for code of an installed package; None for the user's own code."""
    mod = sys.modules.get(module_name)
    if module_name in sys.builtin_module_names or module_name == "builtins":
        return "builtins"
    f = getattr(mod, "__file__", None)
    if f is None:
        return None if mod is None or module_name == "__main__" else "builtin " + module_name
    f = os.path.realpath(f)
    if not f.startswith(_library_roots()):
        return None
    top = module_name.split(".")[0]
    try:
        return f"{top} {importlib.metadata.version(top)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{top} {getattr(sys.modules.get(top), '__version__', sys.version)}"


class _Key:
    def __init__(self):
        self.h = hashlib.sha256()
        self.seen = set()

    def put(self, *parts):
        for p in parts:
            self.h.update(p if isinstance(p, bytes) else str(p).encode("utf-8", "surrogatepass"))
            self.h.update(b"\x00")

    # ---- values -----------------------------------------------------------------------------
    def value(self, v, depth=0):
        if depth > MAX_DEPTH:
            raise Unkeyable("nesting deeper than the key reads")
        t = type(v)
        if v is None or t in (bool, int, float, complex, str, bytes):
            return self.put(t.__name__, repr(v))
        if isinstance(v, (torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout, enum.Enum)):
            return self.put(t.__name__, repr(v))
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, np.ndarray):
            return self.put("ndarray", v.dtype.str, v.shape, hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest())
        if isinstance(v, (list, tuple)):
            self.put(t.__name__, len(v))
            for x in v:
                self.value(x, depth + 1)
            return
        if isinstance(v, (set, frozenset)):
            return self.put(t.__name__, sorted(repr(x) for x in v))
        if isinstance(v, dict):
            self.put(t.__name__, len(v))
            for k, x in v.items():
                self.value(k, depth + 1)
                self.value(x, depth + 1)
            return
        if id(v) in self.seen:               # a cycle, or a shared object already keyed
            return self.put("seen", t.__qualname__)
        self.seen.add(id(v))
        if isinstance(v, (types.FunctionType, types.MethodType, functools.partial, staticmethod, classmethod,
                          property, types.BuiltinFunctionType)):
            return self.callable(v, depth)
        if isinstance(v, type):
            return self.cls(v, depth)
        if isinstance(v, types.ModuleType):
            return self.put("module", v.__name__, _library_version(v.__name__) or self.module_file(v))
        if isinstance(v, torch.nn.Module):
            return self.module(v, depth)
        self.cls(t, depth)
        state = getattr(v, "__dict__", None)
        if state is None:
            raise Unkeyable(f"an attribute of type {t.__qualname__} has no __dict__ to read")
        self.value(dict(state), depth + 1)

    def tensor(self, t):
        t = t.detach()
        self.put("tensor", t.dtype, tuple(t.shape))
        if t.numel() == 0:
            return
        if t.layout != torch.strided or t.device.type != "cpu" or t.dtype not in _BYTES_DTYPES:
            raise Unkeyable(f"a {t.dtype} {t.layout} tensor on {t.device}")
        flat = t.contiguous().view(-1).view(torch.uint8).numpy()
        for j in range(0, len(flat), _SLICE):
            self.put(hashlib.sha256(flat[j:j + _SLICE]).digest())

    # ---- code ----------------------------------------------------------------------------------
    def callable(self, f, depth):
        if isinstance(f, (staticmethod, classmethod)):
            return self.value(f.__func__, depth + 1)
        if isinstance(f, property):
            for g in (f.fget, f.fset, f.fdel):
                self.value(g, depth + 1)
            return
        if isinstance(f, functools.partial):
            self.value(f.func, depth + 1)
            self.value(f.args, depth + 1)
            return self.value(f.keywords, depth + 1)
        if isinstance(f, types.MethodType):
            self.value(f.__func__, depth + 1)
            return self.value(f.__self__, depth + 1)
        mod = getattr(f, "__module__", None) or ""
        lib = _library_version(mod) if mod else "builtins"
        name = getattr(f, "__qualname__", repr(f))
        if lib is not None or isinstance(f, types.BuiltinFunctionType):
            return self.put("libfn", mod, name, lib)
        code = f.__code__
        self.put("fn", name, marshal.dumps(code))
        self.value(f.__defaults__, depth + 1)
        self.value(f.__kwdefaults__, depth + 1)
        for cell in f.__closure__ or ():
            try:
                self.value(cell.cell_contents, depth + 1)
            except ValueError:               # an empty cell
                self.put("empty cell")
        g = f.__globals__
        for n in sorted(_global_names(code)):
            if n in g:
                self.put("global", n)
                self.value(g[n], depth + 1)

    def cls(self, c, depth):
        lib = _library_version(c.__module__)
        self.put("class", c.__module__, c.__qualname__, lib)
        if lib is not None:
            return
        for k, v in sorted(vars(c).items()):
            if k in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__"):
                continue
            self.put("attr", k)
            self.value(v, depth + 1)
        for base in c.__bases__:
            self.value(base, depth + 1)

    def module_file(self, mod):
        """A user module reached as a global (`mylib.helper(x)`): its whole source file."""
        f = getattr(mod, "__file__", None)
        try:
            with open(f, "rb") as fh:
                return hashlib.sha256(fh.read()).hexdigest()
        except (OSError, TypeError):
            raise Unkeyable(f"module {mod.__name__} has no readable source") from None

    def module(self, m, depth):
        self.cls(type(m), depth)
        for k, v in sorted(vars(m).items()):
            if k in ("_parameters", "_buffers", "_modules"):
                continue
            self.put("state", k)
            self.value(v, depth + 1)
        for k, p in m._parameters.items():
            self.put("param", k)
            self.value(p, depth + 1)
        for k, b in m._buffers.items():
            self.put("buffer", k)
            self.value(b, depth + 1)
        for k, sub in m._modules.items():
            self.put("child", k)
            self.value(sub, depth + 1)


_BYTES_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
                 torch.int64, torch.uint8, torch.bool}


def _global_names(code) -> set:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def source_key(model, example_inputs, salt: str) -> str | None:
    """The shortcut key of (model, example inputs) under `salt` (options, compiler, cuvil's own
    sources), or None when the model holds something the key cannot account for."""
    from torch.utils import _pytree
    k = _Key()
    k.put("cuvil torch source key v2", salt, torch.__version__, torch.get_default_dtype())
    try:
        k.value(model)
        leaves, spec = _pytree.tree_flatten(example_inputs)
        k.put(str(spec))
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                k.put("input", leaf.dtype, tuple(leaf.shape), leaf.is_contiguous())
            else:
                k.value(leaf)
    except (Unkeyable, RecursionError, TypeError, ValueError):
        return None
    return k.h.hexdigest()[:32]
