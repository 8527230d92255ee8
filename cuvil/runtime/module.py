"""Load and run a compiled artifact through ctypes. Needs only numpy: never imports torch
or the compiler. The GIL is released while the native code runs (ctypes.CDLL does that)."""
from __future__ import annotations

import ast
import ctypes
import functools
import os
import re
import sys
import threading
import weakref
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, CuvilError, ShapeError
from ..target import cpu_flags, host_arch
from . import artifact
from .library import Library
from .pages import HUGE_PAGE, huge_page_empty, huge_pages_available

_P = ctypes.c_void_p
_I64P = ctypes.POINTER(ctypes.c_int64)


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


def arena_buffer(nbytes: int) -> np.ndarray:
    """A run's arena: on 2 MB pages from one page's size on (ResNet-50's 14 MB: 0.97-0.98x the time
    at 2 threads, 1.0x at 1; BERT's 2.3 MB 0.99x), 64-byte aligned either way."""
    if nbytes >= HUGE_PAGE and huge_pages_available():
        return huge_page_empty(nbytes)
    return aligned_empty(max(nbytes, 64))


_NAMES = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = {ast.Add: lambda a, b: a + b, ast.Mult: lambda a, b: a * b, ast.Sub: lambda a, b: a - b,
        ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}


_PARSE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _parse_dim(text: str) -> ast.Expression:
    """A dim expression's tree, parsed once. CPython 3.11's parser is not safe to enter from two threads
    at once: 32 threads running one artifact raised "SystemError: AST constructor recursion depth
    mismatch" from here. So parsing holds a lock, and a run after the first parses nothing."""
    with _PARSE_LOCK:
        return ast.parse(text, mode="eval")


def eval_dim(text: str, env: dict) -> int:
    """Evaluate a manifest dim ('batch*12', 'floordiv(seq, 2)') without eval()."""
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name) and n.id in env:
            return env[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and len(n.args) == 2:
            f = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "max": max, "min": min}.get(n.func.id)
            if f:
                return f(ev(n.args[0]), ev(n.args[1]))
        raise ArtifactError(f"bad dim expression in manifest: {text!r}")
    if not isinstance(text, str):
        raise ArtifactError(f"bad dim in manifest: {text!r} (an int or an expression)")
    try:
        v = int(ev(_parse_dim(text)))
    except (SyntaxError, ValueError, RecursionError, ZeroDivisionError, MemoryError) as e:
        raise ArtifactError(f"bad dim expression in manifest: {text!r} ({type(e).__name__})") from None
    if v < 0:
        raise ShapeError(f"dim {text!r} is {v} for {env}: negative")
    return v


def missing_cpu_features(features) -> list:
    """The features this CPU lacks (none where /proc/cpuinfo cannot tell)."""
    have = cpu_flags()
    return [f for f in features if f not in have] if have else []


def check_cpu(features):
    missing = missing_cpu_features(features)
    if missing:
        raise CuvilError(f"this artifact was built for a CPU with {', '.join(features)}; "
                         f"this CPU lacks {', '.join(missing)}. Recompile with target='native' on this machine.")



def _np_dtype(name):
    """numpy dtype of a manifest dtype name; bfloat16, float8, int4 ... need the ml_dtypes package."""
    try:
        return np.dtype(name)
    except TypeError:
        pass
    try:
        import ml_dtypes  # noqa: F401  (registers its dtypes with numpy)
        return np.dtype(name)
    except (ImportError, TypeError):
        raise ArtifactError(f"dtype {name!r} of this artifact is unknown to numpy"
                            + ("" if "ml_dtypes" in sys.modules else " (pip install ml_dtypes for low-precision "
                               "dtypes)")) from None

def check_threads(n) -> int:
    """A thread count from a caller: a positive int (bool and str are refused, not converted)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"num_threads must be a positive int, got {type(n).__name__} {n!r}")
    if not 1 <= n <= 4096:
        raise ValueError(f"num_threads must be between 1 and 4096, got {n}")
    return int(n)


def _release(lib, handle):
    """Free the model, then unload its library (weakref.finalize: once, at close() or collection)."""
    lib.fn.destroy(handle)
    lib.close()


class Module:
    """A loaded artifact. `run(*arrays)` returns a list of numpy arrays; calling it returns what
    the source model returned (torch in -> torch out when torch is already imported).

    The library is loaded from a private copy named by its content, so saving over the artifact
    (or a cache eviction) never changes what a loaded Module runs, and a load of changed files
    never returns the old library. `close()`, or dropping the last reference, unloads it."""

    def __init__(self, path, num_threads: int | None = None, verify_checksum: bool = True):
        m = self._open(path, num_threads, verify_checksum)
        if artifact.is_foreign(m):
            raise ArtifactError(f"artifact {self.path} was built for {m['target']} ({m['arch']}), not for this "
                                f"{host_arch()} machine: run it there, or here under emulation with "
                                "cuvil.load() or `cuvil run`")
        check_cpu(m.get("cpu_features", []))
        self._weights = artifact.load_weights(self.path, m, verify_checksum)
        if self._weights.size == 0:
            self._weights = aligned_empty(0)
        # the library's hash is checked even with verify_checksum=False: Library reads and hashes the
        # file anyway, and a damaged one would otherwise run (a flipped byte of machine code can crash)
        self._lib = lib = Library(self.path / "model.so", m["files"]["model.so"]["digest"],
                                  m.get("symbol_prefix", "cuvil_"))
        try:
            lib.check_signature(m, self.path)
        except ArtifactError:
            lib.close()
            raise
        self.num_threads = num_threads or m.get("num_threads") or default_threads()
        self._handle = lib.fn.create(self._weights.ctypes.data, self._weights.size, self.num_threads)
        if not self._handle:
            lib.close()
            raise ArtifactError(f"artifact {self.path}: {lib.fn.last_error().decode(errors='replace')}")
        # destroy the model, then unload the library, when the Module goes away (or at close())
        self._finalizer = weakref.finalize(self, _release, lib, self._handle)
        self._finalizer.atexit = False     # at exit the process unmaps it; a daemon thread may still run it
        self._crun = lib.fn.run
        self._data_dims = list(m.get("data_dims") or [])
        if self._data_dims:
            self._data_dims_fn = getattr(lib.cdll, lib.prefix + "data_dims")
            self._data_dims_fn.restype, self._data_dims_fn.argtypes = ctypes.c_int, [ctypes.c_void_p]
            self._data_sized_outputs = [i for i, o in enumerate(self.outputs) if any(
                isinstance(d, str) and set(_NAMES.findall(d)) & set(self._data_dims) for d in o["shape"])]
        self.arena_bytes = lib.fn.arena_size()
        self._local = threading.local()

    def _open(self, path, num_threads, verify_checksum) -> dict:
        """The manifest, read and checked against the files, and the I/O specs the checks use."""
        self.path = Path(path)
        if num_threads is not None:
            num_threads = check_threads(num_threads)
        self.manifest = m = artifact.read_manifest(self.path)
        try:
            artifact.verify(self.path, m, full=verify_checksum)
        except OSError as e:
            raise ArtifactError(f"artifact {self.path}: cannot read it ({e})") from None
        self.inputs = m["inputs"]
        self.outputs = m["outputs"]
        self._in_dtypes = [_np_dtype(i["dtype"]) for i in self.inputs]
        self._out_dtypes = [_np_dtype(o["dtype"]) for o in self.outputs]
        static = not m.get("symbols") and all(isinstance(d, int) for i in self.inputs for d in i["shape"])
        # static models: shapes are checked by one tuple compare and outputs never change shape
        self._static_in = [tuple(i["shape"]) for i in self.inputs] if static else None
        self._static_out = self.output_shapes({}) if static else None
        return m

    def close(self):
        """Free the model and unload its library. Later calls raise; do not close while another thread
        is inside run()."""
        self._handle = None
        self._local = threading.local()
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def profile_counters(self):
        """[(node label, total ns)] since the last call, for an artifact compiled with profile=True."""
        self._check_open()
        f = getattr(self._lib.cdll, self._lib.prefix + "profile", None)
        if f is None:
            raise ArtifactError(f"artifact {self.path} was not compiled with profile=True")
        n = len(self.manifest.get("node_ops", [])) or 1 << 16
        names = (ctypes.c_char_p * n)()
        ns = (ctypes.c_int64 * n)()
        f.restype = ctypes.c_int
        k = f(names, ns)
        return [(names[i].decode(), ns[i]) for i in range(k)]

    def set_num_threads(self, n: int):
        n = check_threads(n)
        self._check_open()
        self.num_threads = n
        self._lib.fn.set_num_threads(self._handle, n)

    def _check_open(self):
        if not self._handle:
            raise ArtifactError(f"module {self.path} is closed")

    # ---- I/O checking ------------------------------------------------------------------
    def check_inputs(self, arrays) -> dict:
        """The shape checks a run makes (rank, static dims, dynamic dims agreeing and within their
        compiled bounds), without running: {dynamic dim: value}. A ShapeError names what is wrong."""
        return self._bind(arrays)

    def _bind(self, arrays):
        env = {}
        for spec, a in zip(self.inputs, arrays):
            if a.ndim != len(spec["shape"]):
                raise ShapeError(f"input {spec['name']!r}: expected rank {len(spec['shape'])} "
                                 f"(shape {spec['shape']}), got shape {list(a.shape)}")
            for j, (d, n) in enumerate(zip(spec["shape"], a.shape)):
                if isinstance(d, int):
                    if d != n:
                        raise ShapeError(f"input {spec['name']!r}: expected shape {spec['shape']}, "
                                         f"got {list(a.shape)} (dim {j})")
                elif d.isidentifier():
                    if env.setdefault(d, n) != n:
                        raise ShapeError(f"input {spec['name']!r}: dim {j} ({d}) is {n}, but {d} = {env[d]} "
                                         "in an earlier input")
        given = set(env)
        for name, (lo, hi) in self.manifest.get("symbols", {}).items():
            if name in env and not lo <= env[name] <= hi:
                raise ShapeError(f"dynamic dim {name} = {env[name]} is outside the compiled bounds [{lo}, {hi}]")
            env.setdefault(name, hi)
        for a, b, most in self.manifest.get("symbol_products") or ():
            if {a, b} <= given and env[a] * env[b] > most:
                raise ShapeError(f"dynamic dims {a} x {b} = {env[a]} x {env[b]} = {env[a] * env[b]} exceed the "
                                 f"compiled bound {most}")
        return env

    def output_shapes(self, env):
        return [tuple(d if isinstance(d, int) else eval_dim(d, env) for d in o["shape"]) for o in self.outputs]

    def _call_state(self):
        """Per-thread arena and ctypes argument arrays, reused across calls."""
        st = getattr(self._local, "state", None)
        if st is None:
            n_in, n_out = max(len(self.inputs), 1), max(len(self.outputs), 1)
            shapes = [_shape_buffer(i, dt) for i, dt in zip(self.inputs, self._in_dtypes)]
            arena = arena_buffer(self.arena_bytes)
            st = self._local.state = {
                "arena": arena, "arena_ptr": arena.ctypes.data,
                "in": (_P * n_in)(), "out": (_P * n_out)(), "shapes": shapes,
                "shape_ptrs": (_I64P * n_in)(*[ctypes.cast(s, _I64P) for s in shapes]),
                # the out= buffers of the last call, held: a buffer passed again keeps its data
                # pointer (numpy refuses to resize an array something else references), and reading
                # a pointer through .ctypes costs more than the rest of a small model's call
                "out_held": [None] * n_out,
                "in_held": [None] * n_in, "in_shape": [None] * n_in,
            }
        return st

    def _checked(self, arrays):
        """The inputs as contiguous numpy arrays of the model's dtypes, the output shapes they imply
        and the symbols' values (None where the shapes are the compiled static ones) (ShapeError,
        TypeError name what does not fit)."""
        if len(arrays) != len(self.inputs):
            raise ShapeError(f"expected {len(self.inputs)} inputs ({', '.join(i['name'] for i in self.inputs)}), "
                             f"got {len(arrays)}")
        conv = []
        for spec, dt, a in zip(self.inputs, self._in_dtypes, arrays):
            a = _as_numpy(a, spec)
            if a.dtype != dt:
                raise ShapeError(f"input {spec['name']!r}: expected dtype {dt}, got {a.dtype}")
            f = a.flags        # the kernels read contiguous, naturally aligned data: copy anything else
            conv.append(a if f.c_contiguous and f.aligned else np.array(a, order="C"))
        if self._static_in is not None and all(a.shape == s for a, s in zip(conv, self._static_in)):
            return conv, self._static_out, None
        env = self._bind(conv)
        return conv, self.output_shapes(env), env

    def run(self, *arrays, out=None) -> list:
        if not self._handle:
            raise ArtifactError(f"module {self.path} is closed")
        conv, shapes, env = self._checked(arrays)
        if out is None:
            outs = [np.empty(s, dtype=dt) for s, dt in zip(shapes, self._out_dtypes)]
        elif self._data_dims:
            raise ShapeError(f"out= buffers are not taken by a model whose outputs are sized by the data "
                             f"({', '.join(self._data_dims)})")
        else:
            outs = self._check_out(out, shapes)
        st = self._call_state()
        in_ptrs, out_ptrs = st["in"], st["out"]
        held_in, held_shape = st["in_held"], st["in_shape"]
        for i, a in enumerate(conv):
            # the array of the last call (a decode loop's KV cache, a benchmark's input): its pointer
            # and shape are still in place. Held, it cannot be resized under us (numpy refuses while
            # something else references it), and reading a pointer through .ctypes costs more than
            # the rest of a small model's call
            if a is not held_in[i]:
                in_ptrs[i] = a.ctypes.data
                held_in[i] = a
            if a.shape != held_shape[i]:
                buf = st["shapes"][i]
                for j, n in enumerate(a.shape):
                    buf[j] = n
                held_shape[i] = a.shape
        held = st["out_held"]
        for i, o in enumerate(outs):
            if o is not held[i]:
                out_ptrs[i] = o.ctypes.data
                held[i] = o if out is not None else None
        rc = self._crun(self._handle, in_ptrs, st["shape_ptrs"], out_ptrs, st["arena_ptr"])
        if rc:
            raise ShapeError(f"cuvil run failed: {self._lib.fn.last_error().decode(errors='replace')}")
        return self._data_sized(outs, env if env is not None else self._bind(conv)) if self._data_dims else outs

    def _data_sized(self, outs, env):
        """Outputs with a dim the run computed from the data (allocated at its upper bound): the front
        of each buffer, at the shape the computed dims give (env: the input symbols' values)."""
        vals = (ctypes.c_int64 * len(self._data_dims))()
        self._data_dims_fn(vals)
        env = dict(env, **dict(zip(self._data_dims, vals)))
        outs = list(outs)
        for i in self._data_sized_outputs:
            shape = tuple(d if isinstance(d, int) else eval_dim(d, env) for d in self.outputs[i]["shape"])
            outs[i] = outs[i].reshape(-1)[:int(np.prod(shape, dtype=np.int64))].reshape(shape)
        return outs

    def _check_out(self, out, shapes):
        """Caller-provided output buffers: one numpy array per output, each of the output's shape and
        dtype, C-contiguous and writable (the library writes through their pointers)."""
        if not isinstance(out, (list, tuple)):
            raise TypeError(f"out must be a list of {len(self.outputs)} numpy arrays, got {type(out).__name__}")
        if len(out) != len(self.outputs):
            raise ShapeError(f"out: expected {len(self.outputs)} buffers (one per output), got {len(out)}")
        for i, (o, s, spec, dt) in enumerate(zip(out, shapes, self.outputs, self._out_dtypes)):
            if not isinstance(o, np.ndarray):
                raise TypeError(f"out[{i}] ({spec['name']!r}): expected a numpy array, got {type(o).__name__}")
            if o.shape != s or o.dtype != dt or not o.flags.c_contiguous or not o.flags.writeable:
                flags = [f for f, ok in (("non-contiguous", o.flags.c_contiguous), ("read-only", o.flags.writeable))
                         if not ok]
                raise ShapeError(f"out[{i}] ({spec['name']!r}): expected a contiguous writable {dt}{list(s)}, "
                                 f"got {' '.join(flags + [str(o.dtype)])}{list(o.shape)}")
        return list(out)

    def as_returned(self, outs, torch_in: bool) -> list:
        """run()'s arrays as the source model returned them: torch tensors for torch inputs, and python
        numbers where it returned numbers (x.item())."""
        if torch_in and "torch" in sys.modules:
            outs = [_to_torch(sys.modules["torch"], o) for o in outs]
        return [o.item() if spec.get("scalar") else o for o, spec in zip(outs, self.outputs)]

    def __call__(self, *args):
        torch_in = any(type(a).__module__.startswith("torch") for a in args)
        outs = self.as_returned(self.run(*args), torch_in)
        if torch_in and "torch" in sys.modules:
            spec = self.manifest.get("treespec")
            if spec:
                from torch.utils import _pytree
                try:
                    return _pytree.tree_unflatten(outs, _pytree.treespec_loads(spec))
                except Exception as e:  # noqa: BLE001 - whatever a bad treespec makes torch raise
                    raise ArtifactError(f"artifact {self.path}: manifest.json's treespec does not describe "
                                        f"the outputs ({type(e).__name__}: {e})") from None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self):
        ins = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in self.inputs)
        return f"<cuvil.Module {self.path} ({ins})>"


def _shape_buffer(spec, dtype):
    """The int64 dims the library reads for one input. A complex input is (real, imaginary) float
    pairs to the library: one more dim, of 2, that the caller's shape never writes over."""
    rank = len(spec["shape"])
    buf = (ctypes.c_int64 * max(rank + (dtype.kind == "c"), 1))()
    if dtype.kind == "c":
        buf[rank] = 2
    return buf


def _to_torch(torch, o):
    """A numpy output as a torch tensor; bfloat16 (ml_dtypes', which torch does not take) by its bits."""
    if o.dtype.name == "bfloat16":
        return torch.from_numpy(o.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(o)


def _as_numpy(a, spec):
    if isinstance(a, np.ndarray):
        return a
    try:
        if type(a).__module__.startswith("torch"):
            if a.requires_grad or a.device.type != "cpu":
                a = a.detach().cpu()
            if str(a.dtype) == "torch.bfloat16":          # numpy has no bfloat16: ml_dtypes' by its bits
                return a.view(sys.modules["torch"].int16).numpy().view(_np_dtype("bfloat16"))
            return a.numpy()
        return np.asarray(a)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"input {spec['name']!r}: expected an array of {spec['dtype']}{spec['shape']}, got a "
                        f"{type(a).__name__} that does not convert ({e})") from None
