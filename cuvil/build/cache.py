"""Compile cache: artifacts keyed by the IR, weights digest, options, target, compiler and cuvil
version; a second key from the source model itself lets a repeat compile skip the frontend.
The cache keeps at most CUVIL_CACHE_MAX_GB (default 20) of artifacts: a new artifact evicts the
least recently used ones (an LLM artifact is gigabytes).

The cache heals itself: an entry that fails verification (a corrupt, truncated or edited file) is
removed with a warning and rebuilt, never used and never left to fail every later compile."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from ..errors import ArtifactError, CompileError
from ..runtime import artifact


def default_dir() -> Path:
    return Path(os.environ.get("CUVIL_CACHE_DIR") or Path.home() / ".cache" / "cuvil")


_fallback = None


def usable_dir(cache_dir=None) -> Path:
    """The cache folder to use, checked writable. A folder the caller named that cannot be used is a
    CompileError saying so; an unusable default one (a read-only home) falls back to a temporary
    cache for this process, with a warning."""
    global _fallback
    d = Path(cache_dir) if cache_dir else default_dir()
    try:
        tmp = tmp_dir(d)
        probe = tempfile.NamedTemporaryFile(dir=tmp, prefix="probe-")
        probe.close()
        return d
    except OSError as e:
        why = f"{e.strerror or e}" + (f": {e.filename}" if getattr(e, "filename", None) else "")
        if cache_dir or os.environ.get("CUVIL_CACHE_DIR"):
            raise CompileError(f"the compile cache {d} cannot be used ({why}); pass a writable folder as "
                               "cache_dir= (or --cache-dir, or CUVIL_CACHE_DIR)") from None
    if _fallback is None:
        _fallback = Path(tempfile.mkdtemp(prefix="cuvil-cache-"))
        warnings.warn(f"cuvil: the compile cache {d} cannot be used ({why}); caching in {_fallback} for this "
                      "process (set CUVIL_CACHE_DIR to a writable folder)", RuntimeWarning, stacklevel=3)
    return _fallback


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, (bytes, memoryview)) else str(p).encode())
        h.update(b"\x00")
    return h.hexdigest()[:32]


def artifact_dir(cache_dir: Path, key: str) -> Path:
    return cache_dir / "artifacts" / key


def lookup(cache_dir: Path, key: str) -> Path | None:
    """The verified entry for `key`, or None (a missing one, or a broken one, removed)."""
    d = artifact_dir(cache_dir, key)
    if not d.exists():
        return None
    try:
        m = artifact.read_manifest(d)
        if m.get("cache_key") != key:
            raise ArtifactError(f"artifact {d}: built for cache key {m.get('cache_key')!r}, not {key!r}")
        artifact.verify(d, m)
        artifact.map_weights(d, m)
    except (ArtifactError, OSError) as e:
        discard(d, e)
        return None
    try:
        os.utime(d / "manifest.json")            # last use, for eviction
    except OSError:
        pass
    return d


def discard(d: Path, why) -> None:
    """Remove a broken entry (moved aside first, so a concurrent reader never sees half of it)."""
    warnings.warn(f"cuvil: cache entry {d} failed verification ({why}); removing it and rebuilding",
                  RuntimeWarning, stacklevel=3)
    aside = d.with_name(f".{d.name}.broken-{os.getpid()}")
    try:
        os.replace(d, aside)
    except OSError:
        aside = d
    if aside.is_dir():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


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


def _source_record(source_key: str, key: str) -> dict:
    return {"source_key": source_key, "key": key, "check": digest("source", source_key, key)}


def lookup_source(cache_dir: Path, source_key: str) -> Path | None:
    """The artifact a source key was compiled to. A record that is not exactly what remember_source
    wrote for this key (edited, corrupt, renamed from another key's) is removed and ignored."""
    p = cache_dir / "sources" / f"{source_key}.json"
    try:
        rec = json.loads(p.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        rec = None
    if not (isinstance(rec, dict) and isinstance(rec.get("key"), str)
            and rec == _source_record(source_key, rec["key"])):
        discard(p, "a source record that does not check out")
        return None
    return lookup(cache_dir, rec["key"])


def remember_source(cache_dir: Path, source_key: str, key: str):
    p = cache_dir / "sources" / f"{source_key}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_source_record(source_key, key)))
    os.replace(tmp, p)


def store(cache_dir: Path, key: str, build_dir: Path) -> Path:
    """Move a finished build into the cache atomically (a concurrent identical build is harmless)."""
    dest = artifact_dir(cache_dir, key)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        if lookup(cache_dir, key):               # another process finished the same build first
            shutil.rmtree(build_dir, ignore_errors=True)
            return dest
        try:
            os.replace(build_dir, dest)          # atomic; fails if a (new) entry is already there
            break
        except OSError:
            continue
    else:
        raise CompileError(f"could not move the build {build_dir} into the cache at {dest}")
    evict(cache_dir, keep=dest)
    return dest


def tmp_dir(cache_dir: Path) -> Path:
    """Builds in progress: on the cache's file system, so finished files move in without a copy."""
    (cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
    return cache_dir / "tmp"


def new_build_dir(cache_dir: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix="build-", dir=tmp_dir(cache_dir)))
