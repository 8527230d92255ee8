"""Graph -> C: one model.c with a create/run/destroy API over the kernel library.

Each op's C lowering lives in lower_*.py and is registered in LOWERINGS (all of them, when this
package is imported: __init__.py); this file holds the context the lowerings share (buffers, dims,
packed weights) and the model.c frame."""
from __future__ import annotations

import hashlib
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...errors import CompileError
from ...ir import dims as D
from ...passes import memplan
from ...runtime.artifact import crc_text
from . import cexpr, cstr
from .ctypes_map import CTYPE

WEIGHT_ALIGN = 64


@dataclass
class Lowering:
    emit: Callable                       # (Emitter, node) -> list of C lines
    scratch: Callable | None = None      # (node, bounds) -> bytes of scratch the node needs
    supports: Callable | None = None     # node -> None if lowerable, else a reason


LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops, scratch=None, supports=None):
    def deco(fn):
        for op in ops:
            LOWERINGS[op] = Lowering(fn, scratch, supports)
        return fn
    return deco


class Weights:
    """Constants and their compile-time transformed copies (packed panels), 64-byte aligned, written
    to a file as they are laid out: an 8B-parameter artifact is gigabytes, and holding the blob in
    memory next to the graph's constants tripled the peak memory of the build."""

    def __init__(self, directory=None):
        self.offsets, self.size = {}, 0
        self._file = tempfile.NamedTemporaryFile(dir=directory, prefix="weights-", suffix=".bin", delete=False)
        self._sha, self._crc = hashlib.sha256(), 0

    def _write(self, data):
        try:
            self._file.write(data)
        except OSError as e:        # a full disk: say so, and leave no partial file behind
            self._file.close()
            Path(self._file.name).unlink(missing_ok=True)
            raise CompileError(f"writing the weights to {self._file.name} ({self.size} bytes written): "
                               f"{e.strerror or e}") from e
        self._sha.update(data)
        self._crc = zlib.crc32(data, self._crc)

    def add(self, key, array: np.ndarray) -> int:
        if key in self.offsets:
            return self.offsets[key]
        off = (self.size + WEIGHT_ALIGN - 1) // WEIGHT_ALIGN * WEIGHT_ALIGN
        a = np.ascontiguousarray(array)
        self._write(bytes(off - self.size))
        self._write(memoryview(a.reshape(-1).view(np.uint8)))
        self.offsets[key] = off
        self.size = off + a.nbytes
        return off

    def finish(self) -> "WeightsFile":
        self._file.close()
        return WeightsFile(Path(self._file.name), self.size, self._sha.hexdigest(), crc_text(self._crc))


@dataclass
class WeightsFile:
    """The laid-out weights on disk (a temporary file until moved into an artifact)."""
    path: Path
    nbytes: int
    sha256: str
    checksum: str

    def move_to(self, dest: Path):
        shutil.move(str(self.path), str(dest))

    def discard(self):
        self.path.unlink(missing_ok=True)


@dataclass
class Emitter:
    graph: object
    plan: memplan.MemoryPlan
    weights: Weights
    node_index: int = 0
    target: str = "native"
    tasks: list = field(default_factory=list)     # outlined parallel loops (C functions)
    weights_cached: bool = False    # all constants fit in the last-level cache (weights_fit_in_cache)
    shift: int = 0                  # where this graph's plan starts in the arena (a region's: its node's scratch)

    def ctype(self, v):
        return CTYPE[v.dtype]

    def ptr(self, v):
        """Typed C pointer expression of a value's buffer."""
        t = self.ctype(v)
        if v.is_const:
            off = self.weights.add(("const", id(v)), v.data)
            return f"((const {t} *)(W + {off}))"
        if v.name in self.io:
            return self.io[v.name]
        name = self.plan.alias.get(v.name, v.name)
        src = self.by_name.get(name)
        if src is not None and src.is_const:
            return self.ptr(src)
        if src is not None and src.name in self.io:
            return f"(({t} *){self.io[src.name]})"
        return f"(({t} *)(A + {self.shift + self.plan.offsets[name] + self.plan.alias_offset.get(v.name, 0)}))"

    def packed(self, key, v, transform, ctype="float") -> str:
        """Pointer to a compile-time transformed copy of constant v (e.g. GEMM panels)."""
        off = self.weights.add((key, id(v)), transform(v.data))
        return f"((const {ctype} *)(W + {off}))"

    def parallel(self, var, n, cost, body, prologue=()):
        """Outline a loop `for var in [0, n)` into a task on the thread pool; returns the call site.
        The task sees the same names as cuvil_run (buffers, inputs, outputs, symbols) via CUVIL_LOCALS."""
        from .loops import PARALLEL_MIN
        name = f"cuvil_task_{len(self.tasks)}"
        fn = [f"static void {name}(void *vctx, int64_t lo_, int64_t hi_) {{",
              "  CUVIL_LOCALS((const cuvil_ctx *)vctx)"]
        fn += ["  " + p for p in prologue]
        fn.append(f"  for (int64_t {var} = lo_; {var} < hi_; {var}++) {{")
        fn += ["    " + b for b in body]
        fn += ["  }", "}"]
        self.tasks.append("\n".join(fn))
        return [f"cuvil_parallel_for(({cost}) > {PARALLEL_MIN} ? NT : 1, {n}, 1, {name}, &cuvil_ctx_);"]

    def scratch(self, ctype="float"):
        if self.node_index not in self.plan.scratch:   # the node asked for 0 bytes (e.g. K = 0): never read
            return f"(({ctype} *)0)"
        off, _ = self.plan.scratch[self.node_index]
        return f"(({ctype} *)(A + {self.shift + off}))"

    @staticmethod
    def dim(d):
        return D.to_c(d)


# share of the last-level cache that a model's constants may fill and still be read from it call
# after call (the activations and the other cores' data take the rest)
CACHED_WEIGHTS_SHARE = 0.75


def weights_fit_in_cache(graph, target) -> bool:
    """Whether the model's constants are small enough to stay in the last-level cache between calls
    (MLP b1's 16 MB in a 32 MB L3): its GEMVs then read them without software prefetch."""
    from ...target import last_level_cache_bytes
    total = sum(v.data.nbytes for v in graph.constants())
    return total <= CACHED_WEIGHTS_SHARE * last_level_cache_bytes(target)


def generate(graph, plan, target="native", profile=False, weights_dir=None, signature="", prefix="cuvil_"):
    """Returns (model.c text, WeightsFile) for a graph the backend lowers whole (C_BACKEND.unsupported
    is empty) and its memory plan (passes.pipeline.plan_memory); the weights file is written in
    weights_dir (default: the system's temporary directory) and belongs to the caller. `signature` is
    what the library's cuvil_signature() returns (the runtime checks the manifest against it);
    `prefix` names the API functions (frame.symbol_prefix)."""
    _check_symbol_names(graph)
    em = Emitter(graph, plan, weights=Weights(weights_dir), target=target,
                 weights_cached=weights_fit_in_cache(graph, target))
    body = []
    out_copies = bind_io(em, [f"in{i}" for i in range(len(graph.inputs))], [f"out{i}" for i in range(len(graph.outputs))])
    try:
        emit_body(em, graph, body, out_copies, profile)
    except BaseException:
        em.weights.finish().discard()
        raise
    return _frame(graph, em, body, plan, profile, signature, prefix), em.weights.finish()


def bind_io(em, inputs, outputs) -> list:
    """Point the graph's inputs and outputs at the C pointer expressions given; returns the outputs
    that must be copied there at the end (constants, inputs, views, a value returned twice)."""
    graph = em.graph
    em.by_name = {v.name: v for v in list(graph.inputs) + graph.constants()}
    for n in graph.nodes:
        for o in n.outputs:
            em.by_name[o.name] = o
    em.io = {v.name: expr for v, expr in zip(graph.inputs, inputs)}
    out_copies, seen = [], set()
    for i, v in enumerate(graph.outputs):
        if v.is_const or v.name in em.io or em.plan.alias.get(v.name) is not None or v.name in seen:
            out_copies.append((i, v))
        else:
            em.io[v.name] = outputs[i]
        seen.add(v.name)
    em.out_exprs = list(outputs)
    return out_copies


def _check_symbol_names(graph):
    """Dim symbols become C variables (S_name): each must be a plain identifier (cstr.ident)."""
    for name in graph.symbols:
        cstr.ident(name)
    for v in graph.inputs + graph.outputs + [o for n in graph.nodes for o in n.outputs]:
        for d in v.type.shape:
            for s in getattr(d, "free_symbols", ()):
                cstr.ident(s.name)


def emit_body(em, graph, body, out_copies, profile=False):
    """C lines of the graph's nodes in order, then the output copies (bind_io)."""
    for idx, n in enumerate(graph.nodes):
        em.node_index = idx
        body.append(f"  /* {cstr.comment(n.op + (' @ ' + n.loc if n.loc else ''))} */")
        if profile:
            body.append("  { const int64_t t0_ = cuvil_now_ns();")
        body += ["  " + line for line in LOWERINGS[n.op].emit(em, n)]
        if profile:   # per-node time, summed over runs: cuvil_profile() reads it
            body.append(f"  cuvil_prof_ns[{idx}] += cuvil_now_ns() - t0_; }}")
    for i, v in out_copies:
        nbytes = cexpr.nbytes(v.type.shape, np.dtype(v.dtype).itemsize)
        body.append(f"  memcpy({em.out_exprs[i]}, {em.ptr(v)}, (size_t)({nbytes}));")


def _frame(graph, em, body, plan, profile, signature, prefix):
    from .frame import PRELUDE, model_c, profile_c
    text = model_c(graph, em, body, plan, signature, prefix)
    return text.replace(PRELUDE, PRELUDE + profile_c(graph, prefix), 1) if profile else text
