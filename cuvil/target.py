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
    triple: str = ""           # the GNU triple of its cross toolchain ("" : the host's own compiler)
    packages: tuple = ()       # Debian packages that bring its cross compiler and emulator
    runner: tuple = ()         # the command that runs one of its programs on another machine (an emulator)
    sysroot: str = ""          # where the runner finds the target's C library

    def is_foreign(self) -> bool:
        """Built by a cross compiler: this machine cannot load what it builds (it may emulate it)."""
        return self.arch != host_arch()

    def compilers(self) -> tuple:
        return (f"{self.triple}-gcc",) if self.is_foreign() and self.triple else ()

    def tool(self, name: str) -> str:
        """A binutils program (ar, objdump) for this target: the cross one where there is a triple."""
        return f"{self.triple}-{name}" if self.is_foreign() and self.triple else name

    def runner_command(self) -> list | None:
        """The emulator command line prefix, or None where it is not installed."""
        if not self.is_foreign():
            return []
        if not self.runner or not shutil.which(self.runner[0]):
            return None
        return [shutil.which(self.runner[0]), *self.runner[1:], *(("-L", self.sysroot) if self.sysroot else ())]


_AARCH64 = dict(triple="aarch64-linux-gnu", packages=("gcc-aarch64-linux-gnu", "qemu-user"),
                runner=("qemu-aarch64",), sysroot="/usr/aarch64-linux-gnu")

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
    """This machine's CPU features (/proc/cpuinfo); empty where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_features() -> list[str]:
    f = cpu_flags()
    return [x for x in ("avx512f", "avx2", "fma", "avx") if x in f] + (["asimd"] if "asimd" in f else [])


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
    out = []
    for t in TARGETS.values():
        if not t.is_foreign():
            continue
        need = [p for cmd, p in zip((*t.compilers(), *t.runner[:1]), t.packages) if not shutil.which(cmd)]
        out += [p for p in need if p not in out]
    return out


if __name__ == "__main__":          # `python3 cuvil/target.py`: what `make toolchains` installs
    print(" ".join(missing_packages()))
