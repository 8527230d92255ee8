"""Compile cache: artifacts keyed by the IR, weights digest, options, target, compiler and cuvil
version; a second key from the source model itself lets a repeat compile skip the frontend.
The cache keeps at most CUVIL_CACHE_MAX_GB (default 20) of artifacts: a new artifact evicts the
least recently used ones (an LLM artifact is gigabytes)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path


def default_dir() -> Path:
    return Path(os.environ.get("CUVIL_CACHE_DIR") or Path.home() / ".cache" / "cuvil")


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, (bytes, memoryview)) else str(p).encode())
        h.update(b"\x00")
    return h.hexdigest()[:32]


def artifact_dir(cache_dir: Path, key: str) -> Path:
    return cache_dir / "artifacts" / key


def lookup(cache_dir: Path, key: str) -> Path | None:
    d = artifact_dir(cache_dir, key)
    if not ((d / "manifest.json").exists() and (d / "model.so").exists()):
        return None
    try:
        os.utime(d / "manifest.json")            # last use, for eviction
    except OSError:
        pass
    return d


def max_bytes() -> int:
    try:
        return int(float(os.environ.get("CUVIL_CACHE_MAX_GB", "20")) * (1 << 30))
    except ValueError:
        return 20 << 30


def evict(cache_dir: Path, keep: Path | None = None, limit: int | None = None) -> list:
    """Remove least recently used artifacts until the cache fits in `limit` bytes; never `keep`.
    A loaded artifact stays usable: its mapped files outlive the unlink."""
    limit = max_bytes() if limit is None else limit
    entries = []
    for d in (cache_dir / "artifacts").glob("*"):
        try:
            size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
            entries.append(((d / "manifest.json").stat().st_mtime, d, size))
        except OSError:
            continue
    total = sum(e[2] for e in entries)
    removed = []
    for _, d, size in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if keep is not None and d == keep:
            continue
        shutil.rmtree(d, ignore_errors=True)
        total -= size
        removed.append(d)
    return removed


def lookup_source(cache_dir: Path, source_key: str) -> Path | None:
    p = cache_dir / "sources" / f"{source_key}.json"
    try:
        key = json.loads(p.read_text())["key"]
    except (OSError, ValueError, KeyError):
        return None
    return lookup(cache_dir, key)


def remember_source(cache_dir: Path, source_key: str, key: str):
    p = cache_dir / "sources" / f"{source_key}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key}))
    os.replace(tmp, p)


def store(cache_dir: Path, key: str, build_dir: Path) -> Path:
    """Move a finished build into the cache atomically (a concurrent identical build is harmless)."""
    dest = artifact_dir(cache_dir, key)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if lookup(cache_dir, key):
        shutil.rmtree(build_dir, ignore_errors=True)
        return dest
    try:
        os.replace(build_dir, dest)
    except OSError:
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(build_dir), str(dest))
    evict(cache_dir, keep=dest)
    return dest


def tmp_dir(cache_dir: Path) -> Path:
    """Builds in progress: on the cache's file system, so finished files move in without a copy."""
    (cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
    return cache_dir / "tmp"


def new_build_dir(cache_dir: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix="build-", dir=tmp_dir(cache_dir)))
