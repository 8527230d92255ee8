"""The artifact directory: manifest.json, weights.bin, model.so, model.h, model.c.
Imports nothing but numpy and the standard library."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from ..errors import ArtifactError

FORMAT_VERSION = 1
FILES = ("manifest.json", "weights.bin", "model.so", "model.h", "model.c")


def checksum(data) -> str:
    """crc32 over the weights, in 64 MiB slices (fast enough to run at every load)."""
    mv = memoryview(data).cast("B")
    crc = 0
    for i in range(0, len(mv), 1 << 26):
        crc = zlib.crc32(mv[i:i + (1 << 26)], crc)
    return crc_text(crc)


def crc_text(crc: int) -> str:
    return f"crc32:{crc:08x}"


def write_manifest(path: Path, manifest: dict):
    manifest = dict(manifest, format_version=FORMAT_VERSION)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1))


def read_manifest(path: Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path} is not a cuvil artifact directory")
    missing = [f for f in FILES if not (path / f).exists()]
    if missing:
        raise ArtifactError(f"artifact {path} is missing {', '.join(missing)}")
    try:
        m = json.loads((path / "manifest.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(f"artifact {path}: manifest.json is not valid JSON ({e})") from None
    if not isinstance(m, dict) or m.get("format_version") != FORMAT_VERSION:
        got = m.get("format_version") if isinstance(m, dict) else None
        raise ArtifactError(f"artifact {path}: format version {got}, this cuvil reads {FORMAT_VERSION}")
    for k in ("inputs", "outputs", "weights", "arena_bytes", "target"):
        if k not in m:
            raise ArtifactError(f"artifact {path}: manifest.json lacks {k!r}")
    return m


def map_weights(path: Path, manifest: dict, verify=True) -> np.ndarray:
    """Memory-map weights.bin read-only (64-byte aligned by mmap's page alignment)."""
    f = Path(path) / "weights.bin"
    size = f.stat().st_size
    want = manifest["weights"]["bytes"]
    if size != want:
        raise ArtifactError(f"artifact {path}: weights.bin is {size} bytes, manifest says {want}")
    w = np.memmap(f, dtype=np.uint8, mode="r") if size else np.zeros(64, np.uint8)[:0]
    if verify and size and checksum(w) != manifest["weights"]["checksum"]:
        raise ArtifactError(f"artifact {path}: weights.bin checksum mismatch (corrupt or modified file)")
    return w
