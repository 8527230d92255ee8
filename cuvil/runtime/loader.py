"""load(): an artifact as the Module that runs it: natively (runtime/module.py), or, built for another
machine, through its C runner under the target's emulator (runtime/emulated.py)."""
from __future__ import annotations

from pathlib import Path

from . import artifact
from .emulated import EmulatedModule
from .module import Module


def load(path, num_threads: int | None = None, verify_checksum: bool = True) -> Module:
    """Load a saved artifact (needs only numpy). One built for another machine (target="aarch64-neon"
    on an x86 host, or wasm32-wasi) runs through its C runner under the target's emulator."""
    cls = EmulatedModule if artifact.is_foreign(artifact.read_manifest(Path(path))) else Module
    return cls(path, num_threads=num_threads, verify_checksum=verify_checksum)
