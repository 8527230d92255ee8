"""load(): an artifact as the Module that runs it: natively (runtime/module.py), or, built for another
machine, through its C runner under the target's emulator (runtime/emulated.py)."""
from __future__ import annotations

from pathlib import Path

from ..errors import ArtifactError
from . import artifact
from .emulated import EmulatedModule
from .module import Module, missing_cpu_features


def load(path, num_threads: int | None = None, verify_checksum: bool = True, runnable_here: bool = True) -> Module:
    """Load a saved artifact (needs only numpy). One built for another machine (target="aarch64-neon"
    on an x86 host, or wasm32-wasi) runs through its C runner under the target's emulator. With
    runnable_here=False (compile's own load), an artifact for CPU features this machine lacks
    (x86_64-avx512 on an AVX2 host) is returned unloaded: it can be saved, and running it says why not."""
    m = artifact.read_manifest(Path(path))
    if artifact.is_foreign(m):
        return EmulatedModule(path, num_threads=num_threads, verify_checksum=verify_checksum)
    missing = missing_cpu_features(m.get("cpu_features", []))
    if missing and not runnable_here:
        return BuiltForAnotherCPU(path, num_threads, verify_checksum, missing)
    return Module(path, num_threads=num_threads, verify_checksum=verify_checksum)


class BuiltForAnotherCPU(Module):
    """An artifact this CPU cannot run (it lacks features the target's code uses): checked and
    savable, and a run is an ArtifactError naming what is missing."""

    def __init__(self, path, num_threads, verify_checksum, missing):
        m = self._open(path, num_threads, verify_checksum)
        self.num_threads = num_threads or m.get("num_threads") or 1
        self._why = (f"artifact {self.path} was built for {m['target']} (CPU features "
                     f"{', '.join(m['cpu_features'])}); this CPU lacks {', '.join(missing)}: run it on a machine "
                     "that has them")
        self._handle = True

    def run(self, *arrays, out=None):
        raise ArtifactError(self._why)

    def close(self):
        self._handle = None

    def set_num_threads(self, n):
        self.num_threads = n
