"""What a target is: the machine it runs on, the compiler flags that pick its instruction set, the
floats a vector register holds, the CPU features an artifact built for it needs at load, the C
compilers that build for it (and the Debian package that brings one), the emulator that runs it on
another machine, and (for "native") what this machine's CPU has. Data only, stdlib only:
build/toolchain.py drives the compiler with these facts, codegen sizes its kernels by them, options.py
checks target names against them, the runtime runs a foreign target's artifact through its runner."""
from __future__ import annotations

import functools
import glob
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    name: str
    arch: str                  # the machine it runs on, as platform.machine() spells it
    flags: tuple               # compiler flags that select its instruction set
    vector_floats: int         # float32 lanes of one vector register
    features: tuple            # CPU features an artifact built for it checks at load
    cc: tuple = ()             # its cross compilers, the first one installed wins (() : the host's own)
    binutils: str = ""         # the prefix of its ar and objdump ("aarch64-linux-gnu-", "llvm-")
    tools: tuple = ()          # (command or file glob, Debian package) that building and running it need
    runner: tuple = ()         # the command that runs its programs here (an emulator); "wasmtime": Python's
    sysroot: str = ""          # where the runner finds the target's C library
    threads: bool = True       # False: no threads (wasm32-wasi), loops run on the caller
    shared_library: bool = True    # False: no dlopen (wasm32): the artifact's program is its C runner

    def is_foreign(self) -> bool:
        """Built by a cross compiler: this machine cannot load what it builds (it may emulate it)."""
        return self.arch != host_arch()

    def compilers(self) -> tuple:
        return self.cc if self.is_foreign() else ()

    def tool(self, name: str) -> str:
        """A binutils program (ar, objdump) for this target: the cross one where there is one."""
        return f"{self.binutils}{name}" if self.is_foreign() else name

    @property
    def packages(self) -> tuple:
        return tuple(dict.fromkeys(p for _, p in self.tools))

    def missing_packages(self) -> list:
        """The Debian packages of the tools not found here."""
        return list(dict.fromkeys(p for what, p in self.tools if not _found(what)))

    def runner_command(self) -> list | None:
        """The emulator command line prefix, or None where it is not installed."""
        if not self.is_foreign():
            return []
        if self.runner == ("wasmtime",):
            import importlib.util
            return ["wasmtime"] if importlib.util.find_spec("wasmtime") else None
        if not self.runner or not shutil.which(self.runner[0]):
            return None
        return [shutil.which(self.runner[0]), *self.runner[1:], *(("-L", self.sysroot) if self.sysroot else ())]


def _found(what: str) -> bool:
    return bool(glob.glob(what)) if "/" in what else bool(shutil.which(what))


_AARCH64 = dict(cc=("aarch64-linux-gnu-gcc",), binutils="aarch64-linux-gnu-",
                tools=(("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"), ("qemu-aarch64", "qemu-user")),
                runner=("qemu-aarch64",), sysroot="/usr/aarch64-linux-gnu")
# clang with Debian's wasi-libc and compiler-rt; run by wasmtime (PyPI, the wasm extra)
_WASM = dict(cc=("clang",), binutils="llvm-", threads=False, shared_library=False, runner=("wasmtime",),
             tools=(("clang", "clang"), ("wasm-ld", "lld"), ("llvm-ar", "llvm"),
                    ("/usr/lib/wasm32-wasi/libc.a", "wasi-libc"),
                    ("/usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a", "libclang-rt-14-dev-wasm32")))

TARGETS = {t.name: t for t in (
    Target("x86_64-avx512", "x86_64", ("-march=skylake-avx512", "-mprefer-vector-width=512"), 16,
           ("avx512f", "avx2", "fma")),
    Target("x86_64-avx2", "x86_64", ("-march=haswell",), 8, ("avx2", "fma")),
    # the x86-64 baseline: SSE2's 4-float vectors, the width of NEON and of the portable kernels, built
    # and run on any x86 host (the tests check the 4-wide paths with it)
    Target("x86_64-sse2", "x86_64", ("-march=x86-64",), 4, ()),
    # any ARMv8-A (Raspberry Pi 3/4, Graviton 1); -dotprod: Armv8.2 with SDOT (Pi 5 / Cortex-A76,
    # Graviton 2+, Jetson Orin), which the int8/int4 kernels use
    Target("aarch64-neon", "aarch64", ("-march=armv8-a",), 4, ("asimd",), **_AARCH64),
    Target("aarch64-neon-dotprod", "aarch64", ("-march=armv8.2-a+dotprod",), 4, ("asimd", "asimddp"), **_AARCH64),
    # WebAssembly for WASI runtimes and browsers: SIMD128's 4 floats; -scalar: no SIMD (the baseline the
    # benchmarks compare against, and for runtimes without it)
    Target("wasm32-wasi", "wasm32", ("--target=wasm32-wasi", "-msimd128"), 4, (), **_WASM),
    Target("wasm32-wasi-scalar", "wasm32", ("--target=wasm32-wasi",), 4, (), **_WASM),
)}
TARGET_NAMES = ("native", "cpu") + tuple(TARGETS)


def resolve_target(target: str) -> str:
    if target in ("native", "cpu"):
        return "native"
    return target


def host_arch() -> str:
    m = platform.machine()
    return {"arm64": "aarch64", "AMD64": "x86_64"}.get(m, m)


def target_arch(target: str) -> str:
    return TARGETS[target].arch if target in TARGETS else host_arch()


def cpu_flags() -> set:
    """This machine's CPU features (/proc/cpuinfo); empty where unknown. A copy: callers may change it."""
    return set(_cpuinfo_flags())


@functools.lru_cache(None)
def _cpuinfo_flags() -> frozenset:
    """/proc/cpuinfo read once a process (the code generator asks per conv, through tuning.plan_value)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(None)
@functools.lru_cache(None)
def cpu_vendor() -> str:
    """This machine's CPU vendor as /proc/cpuinfo names it (AuthenticAMD, GenuineIntel), "" where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("vendor_id")), "")
    except OSError:
        return ""


# what a native build may use and a loading CPU must have: -march=native lets GCC and the kernels
# (qgemm.c's VNNI, bf16dot.c's vdpbf16ps and AMX tiles) use any of them
NATIVE_FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                   "amx_bf16", "amx_int8", "avx2", "fma", "avx", "asimd")


# what the dot kernels' AMX tiles need (kernels/amx.h: a native build on such a CPU compiles them in)
AMX_FEATURES = ("amx_tile", "amx_bf16", "amx_int8")


def native_features() -> list[str]:
    f = cpu_flags()
    return [x for x in NATIVE_FEATURES if x in f]


def has_features(target: str, features) -> bool:
    """Whether code built for `target` may use every one of `features` (cpuinfo names)."""
    have = cpu_flags() if resolve_target(target) == "native" else set(TARGETS[target].features)
    return all(f in have for f in features)


@functools.lru_cache(None)
def vector_floats(target: str = "native") -> int:
    if target in TARGETS:
        return TARGETS[target].vector_floats
    f = cpu_flags()
    return 16 if "avx512f" in f else 8 if "avx" in f else 4


def required_features(target: str) -> list[str]:
    return list(TARGETS[target].features) if target in TARGETS else native_features()


def last_level_cache_bytes(target: str = "native") -> int:
    """The largest CPU cache of this machine (sysfs), for a native build; 0 where unknown or the
    artifact may run on another machine (a portable target)."""
    if resolve_target(target) != "native":
        return 0
    best = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            size = Path(d, "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        n = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size or 0)
        best = max(best, n)
    return best


@functools.lru_cache(None)
def native_cpu(target: str) -> str:
    """For -march=native, the CPU it resolves to (model name and feature flags): a cache shared by
    machines of different kinds (a home directory that moved with its user) must not hand one CPU's
    kernel library to another."""
    if target in TARGETS:
        return ""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith(("model name", "CPU part"))), "")
    except OSError:
        pass
    return f"{model}|{' '.join(sorted(cpu_flags()))}"


def missing_packages() -> list[str]:
    """The Debian packages that would bring the cross compilers and emulators not installed here."""
    return list(dict.fromkeys(p for t in TARGETS.values() if t.is_foreign() for p in t.missing_packages()))


if __name__ == "__main__":          # `python3 cuvil/target.py`: what `make toolchains` installs
    print(" ".join(missing_packages()))
