"""The artifact directory: manifest.json, weights.bin, model.so, model.h, model.c.
Imports nothing but numpy and the standard library."""
from __future__ import annotations

import functools
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import ArtifactError
from .pages import huge_page_empty, huge_pages_available

FORMAT_VERSION = 1
FILES = ("manifest.json", "weights.bin", "model.so", "model.h", "model.c")


SLICE = 1 << 26          # 64 MiB


def checksum(data) -> str:
    """crc32 over the weights: 64 MiB slices on all cores (zlib releases the GIL), joined as one
    crc32 over the whole buffer would be."""
    mv = memoryview(data).cast("B")
    slices = [mv[i:i + SLICE] for i in range(0, len(mv), SLICE)]
    if len(slices) > 1:
        with ThreadPoolExecutor(min(len(slices), os.cpu_count() or 1)) as pool:
            crcs = list(pool.map(zlib.crc32, slices))
    else:
        crcs = [zlib.crc32(x) for x in slices]
    crc = 0
    for c, x in zip(crcs, slices):
        crc = _append_zeros(crc, len(x)) ^ c
    return crc_text(crc)


def _gf2_times(mat, vec):
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


@functools.lru_cache(None)
def _zeros_operators():
    """[k]: the crc32 state's linear map (over GF(2), 32 columns) for 2**k zero bytes."""
    op = [0xEDB88320] + [1 << n for n in range(31)]        # one zero bit
    ops = []
    for k in range(3 + 48):
        if k >= 3:
            ops.append(op)
        op = [_gf2_times(op, m) for m in op]               # squared: twice as many zeros
    return ops


def _append_zeros(crc: int, n: int) -> int:
    """The crc register after n more zero bytes (so crc32(A + B) = _append_zeros(crc32(A), len(B)) ^ crc32(B))."""
    ops, k = _zeros_operators(), 0
    while n:
        if n & 1:
            crc = _gf2_times(ops[k], crc)
        n >>= 1
        k += 1
    return crc


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


# weights of at most this size are copied into anonymous memory on 2 MB pages (Linux THP): a model
# small enough to stay in the cache from call to call otherwise spends its time in page walks (MLP
# b1's 16 MB are 4100 small pages, more than Zen 4's 3072-entry L2 TLB holds: 0.915x the time on huge
# pages, 1 and 2 threads). Larger ones stream from DRAM, where the walks hide behind the transfer
# (ResNet-50's 100 MB: 1.00x); they stay mapped from the file, never copied.
HUGE_PAGE_COPY_MAX = 64 << 20


def load_weights(path: Path, manifest: dict, verify=True) -> np.ndarray:
    """weights.bin, checked (map_weights), as the model will read it: small ones on huge pages."""
    w = map_weights(path, manifest, verify)
    if 0 < w.size <= HUGE_PAGE_COPY_MAX and huge_pages_available():
        copy = huge_page_empty(w.size)
        copy[:] = w
        copy.flags.writeable = False
        return copy
    return w


def map_weights(path: Path, manifest: dict, verify=True) -> np.ndarray:
    """Memory-map weights.bin read-only (64-byte aligned by mmap's page alignment)."""
    f = Path(path) / "weights.bin"
    size = f.stat().st_size
    want = manifest["weights"]["bytes"]
    if size != want:
        raise ArtifactError(f"artifact {path}: weights.bin is {size} bytes, manifest says {want}")
    w = np.memmap(f, dtype=np.uint8, mode="r") if size else np.zeros(64, np.uint8)[:0]
    want_crc = manifest["weights"]["checksum"]
    if verify and size:
        st = f.stat()
        seen = (st.st_ino, st.st_size, st.st_mtime_ns, want_crc)
        if _VERIFIED.get(str(f.resolve())) != seen:       # not already checked, unchanged, in this process
            if checksum(w) != want_crc:
                raise ArtifactError(f"artifact {path}: weights.bin checksum mismatch (corrupt or modified file)")
            _VERIFIED[str(f.resolve())] = seen
    return w


# weights.bin files this process has checked: path -> (inode, size, mtime, checksum). A repeat load of
# an unchanged file (a cache hit after the compile that wrote it) skips re-reading every byte.
_VERIFIED: dict = {}
