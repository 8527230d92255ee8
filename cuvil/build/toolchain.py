"""Find the C compiler, pick flags per target (what a target is: cuvil/target.py), build model.so
(the kernel library is compiled once per target and compiler, then reused from the cache)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:             # no POSIX file locks (Windows): builds may then run side by side
    fcntl = None

from ..errors import CompileError
from ..target import TARGETS, native_cpu

KERNELS_DIR = Path(__file__).resolve().parent.parent / "codegen" / "c" / "kernels"

# -fopenmp-simd: `omp simd` hints only (threads come from kernels/pool.c, not OpenMP);
# -fno-trapping-math lets loops with selects (relu, max, the NaN checks of smath.h) vectorize
COMMON_FLAGS = ["-O3", "-fPIC", "-pthread", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math",
                "-ffp-contract=fast", "-std=gnu11", "-falign-functions=64", "-falign-loops=64", "-Wno-unused-variable", "-Wno-unused-but-set-variable"]


def target_flags(target: str) -> list[str]:
    if target in TARGETS:
        return list(TARGETS[target].flags)
    return ["-march=native"]


def compile_flags(target: str) -> list[str]:
    """COMMON_FLAGS and the target's own; a target without threads (wasm32) drops -pthread and -fPIC
    and builds the pool's serial loops (CUVIL_SINGLE_THREAD)."""
    t = TARGETS.get(target)
    if t is not None and not t.threads:
        return [f for f in COMMON_FLAGS if f not in ("-pthread", "-fPIC")] + target_flags(target) + \
            ["-DCUVIL_SINGLE_THREAD"]
    return COMMON_FLAGS + target_flags(target)


# a foreign program's stack: wasm-ld gives 64 KB unless told (Linux threads get 8 MB)
RUNNER_LINK_FLAGS = {"wasm32": ["-Wl,-z,stack-size=8388608", "-Wl,--max-memory=4294967296"]}


def is_foreign(target: str) -> bool:
    return target in TARGETS and TARGETS[target].is_foreign()


@functools.lru_cache(None)
def find_compiler(target: str = "native") -> str:
    """The C compiler for `target`: $CC (or gcc, clang, cc) for this machine, the target's cross
    compiler for another (a clear CompileError naming the Debian package where it is missing)."""
    if is_foreign(target):
        t = TARGETS[target]
        for cc in t.compilers():
            if shutil.which(cc):
                return shutil.which(cc)
        raise CompileError(f"target {target!r} needs the cross compiler {' or '.join(t.compilers())}, which is "
                           f"not installed: apt-get install {' '.join(t.missing_packages() or t.packages)} "
                           "(or run `make setup` as root)")
    if is_foreign(target) and TARGETS[target].missing_packages():
        t = TARGETS[target]
        raise CompileError(f"target {target!r} needs {', '.join(t.missing_packages())} as well: apt-get install "
                           f"{' '.join(t.missing_packages())} (or run `make setup` as root)")
    for cc in (os.environ.get("CC"), "gcc", "clang", "cc"):
        if cc and shutil.which(cc):
            return shutil.which(cc)
    raise CompileError("no C compiler found: install gcc or clang, or set CC")


def binutil(target: str, name: str) -> str:
    """ar, objdump, ... for the target's object files (the cross binutils for a foreign target)."""
    return TARGETS[target].tool(name) if target in TARGETS else name


@functools.lru_cache(None)
def compiler_version(target: str = "native") -> str:
    cc = find_compiler(target)
    out = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else cc


def kernel_sources_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(KERNELS_DIR.iterdir()):
        if p.suffix in (".c", ".h"):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(None)
def cuvil_source_digest() -> str:
    """Digest of cuvil's own sources: a changed compiler never serves a stale cache entry."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".c", ".h"):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise CompileError(f"C compiler failed ({' '.join(cmd)}):\n{r.stderr[-4000:]}")


def _kernels_root(cache_dir: Path) -> Path:
    """Where kernel libraries live: one per machine and user ($CUVIL_KERNEL_CACHE, else the default
    cache's kernels/), shared by every model cache, since the library depends only on the target,
    the compiler and cuvil's kernel sources (its 4-5 s build used to repeat for each new cache
    directory); the model's own cache when that location is not writable."""
    from .cache import default_dir
    root = Path(os.environ.get("CUVIL_KERNEL_CACHE") or default_dir() / "kernels")
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    return cache_dir / "kernels"


def kernels_object(target: str, cache_dir: Path) -> Path:
    """kernels.a for this target and compiler, built once per machine and kept (see _kernels_root)."""
    key = hashlib.sha256(f"{target}|{compiler_version(target)}|{kernel_sources_digest()}|{native_cpu(target)}|"
                         f"{' '.join(compile_flags(target))}".encode()).hexdigest()[:20]
    dest = _kernels_root(cache_dir) / key / "libcuvil_kernels.a"
    if _kernels_intact(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(dest.parent):
        _kernels_intact.cache_clear()
        if not _kernels_intact(dest):      # not built by another process while this one waited
            _build_kernels(target, dest)
    return dest


@contextlib.contextmanager
def _build_lock(folder: Path):
    """One kernel build at a time per library: processes that start together (a test run's workers, a
    server's replicas) had each built the same library, side by side on the same cores."""
    with open(folder / "build.lock", "w") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _build_kernels(target: str, dest: Path):
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        objs = []
        cc = find_compiler(target)
        srcs = sorted(KERNELS_DIR.glob("*.c"))
        procs = []
        for src in srcs:
            obj = Path(tmp) / (src.stem + ".o")
            objs.append(str(obj))
            procs.append((subprocess.Popen([cc, *compile_flags(target), "-c", str(src), "-o", str(obj)],
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), src))
        for p, src in procs:
            _, err = p.communicate()
            if p.returncode:
                raise CompileError(f"C compiler failed on {src.name}:\n{err[-4000:]}")
        _run([binutil(target, "ar"), "rcs", str(Path(tmp) / "lib.a"), *objs], tmp)
        Path(tmp, "lib.sha256").write_text(hashlib.sha256(Path(tmp, "lib.a").read_bytes()).hexdigest())
        os.replace(Path(tmp) / "lib.sha256", _digest_file(dest))
        os.replace(Path(tmp) / "lib.a", dest)
    _kernels_intact.cache_clear()


def _digest_file(lib: Path) -> Path:
    return lib.with_suffix(".sha256")


@functools.lru_cache(None)
def _kernels_intact(lib: Path) -> bool:
    """A kernel library that is there and matches the digest written beside it (checked once per
    process): a truncated or corrupt one is rebuilt, not linked into every later model."""
    try:
        return hashlib.sha256(lib.read_bytes()).hexdigest() == _digest_file(lib).read_text().strip()
    except OSError:
        return False


def build_shared(model_dir: Path, target: str, cache_dir: Path, verbose=False, runner=False) -> Path | None:
    """Compile model_dir/model.c against the kernel library into model_dir/model.so; with `runner`,
    also link model_dir/cuvil_run_main.c with the same object into a static program, cuvil_run (the
    way a foreign target's artifact runs: on the device, or here under its emulator). A target with
    no shared libraries (wasm32) gets only the runner (a WASI module); returns None then."""
    lib = kernels_object(target, cache_dir)
    cc = find_compiler(target)
    t = TARGETS.get(target)
    flags = [*compile_flags(target), f"-I{KERNELS_DIR.parent}", f"-I{model_dir}"]
    tail = [str(lib), "-lm"]
    shared = ["-shared", "-o", "model.so.tmp", "-Wl,--exclude-libs,ALL"]   # the kernels stay private
    program = [*flags, "-static", "cuvil_run_main.c", "model.o", "-o", "cuvil_run", *tail,
               *RUNNER_LINK_FLAGS.get(t.arch if t else "", [])]
    if t is not None and not t.shared_library:
        steps = [[cc, *flags, "-c", "model.c", "-o", "model.o"], [cc, *program]]
    elif runner:
        steps = [[cc, *flags, "-c", "model.c", "-o", "model.o"], [cc, *flags, "model.o", *shared, *tail], [cc, *program]]
    else:
        steps = [[cc, *flags, "model.c", *shared, *tail]]
    for cmd in steps:
        if verbose:
            print("  $", " ".join(cmd))
        _run(cmd, model_dir)
    (model_dir / "model.o").unlink(missing_ok=True)
    if not (model_dir / "model.so.tmp").exists():
        return None
    out = model_dir / "model.so"
    os.replace(model_dir / "model.so.tmp", out)
    return out
