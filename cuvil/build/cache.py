"""Compile cache: artifacts keyed by the IR, weights digest, options, target, compiler and cuvil
version; a second key from the source model itself lets a repeat compile skip the frontend."""
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
    return d if (d / "manifest.json").exists() and (d / "model.so").exists() else None


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
    return dest


def new_build_dir(cache_dir: Path) -> Path:
    (cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="build-", dir=cache_dir / "tmp"))
