"""An artifact's model.so, loaded from a private copy named by its content, and unloaded again.

dlopen hands back the library already loaded under the same path, whatever the file now holds, and
a library mapped from the artifact crashes its process if the file is overwritten in place. So the
bytes are read once, hashed, written to `<private dir>/<sha256>.so` and loaded from there: one name
per content, and nothing outside this process can change what it runs. Standard library only."""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ..errors import ArtifactError

_P = ctypes.c_void_p
# the C API (model.h), each function named <prefix><name>: name -> (restype, argtypes)
API = {
    "create": (_P, [_P, ctypes.c_int64, ctypes.c_int]),
    "run": (ctypes.c_int, [_P, _P, _P, _P, _P]),
    "last_error": (ctypes.c_char_p, []),
    "destroy": (None, [_P]),
    "set_num_threads": (None, [_P, ctypes.c_int]),
    "arena_size": (ctypes.c_int64, []),
    "signature": (ctypes.c_char_p, []),
}
DEFAULT_PREFIX = "cuvil_"

_private_dir = None
_dir_lock = threading.Lock()
_load_lock = threading.Lock()


def private_dir() -> Path:
    """This process's folder for library copies (mode 0700), removed at exit."""
    global _private_dir
    with _dir_lock:
        if _private_dir is None or not _private_dir.is_dir():
            _private_dir = Path(tempfile.mkdtemp(prefix="cuvil-lib-"))
            atexit.register(shutil.rmtree, _private_dir, True)
        return _private_dir


class _Functions:
    """The C API's functions, typed, under their short names (fn.run is <prefix>run)."""

    def __init__(self, cdll, prefix):
        for name, (res, args) in API.items():
            f = getattr(cdll, prefix + name)
            f.restype, f.argtypes = res, args
            setattr(self, name, f)


class Library:
    """model.so of one artifact; `fn` holds its typed C API. close() unloads it (once)."""

    def __init__(self, so_path: Path, expected_digest: str | None = None, prefix: str = DEFAULT_PREFIX):
        try:
            data = Path(so_path).read_bytes()
        except OSError as e:
            raise ArtifactError(f"cannot read {so_path} ({e})") from None
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if expected_digest is not None and digest != expected_digest:
            raise ArtifactError(f"{so_path} does not match the hash in manifest.json (changed while loading?)")
        copy = private_dir() / f"{digest[7:]}.so"
        with _load_lock:       # two threads loading one content: neither unlinks the other's copy first
            tmp = copy.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, copy)
            try:
                self.cdll = ctypes.CDLL(str(copy))
            except OSError as e:
                raise ArtifactError(f"cannot load {so_path} ({e})") from None
            finally:
                copy.unlink(missing_ok=True)      # mapped now; the next load of this content copies again
        self._lock = threading.Lock()
        self.prefix = prefix
        try:
            self.fn = _Functions(self.cdll, prefix)
        except AttributeError as e:
            self.close()
            raise ArtifactError(f"{so_path} is not a cuvil model library of this version ({e})") from None

    def check_signature(self, manifest: dict, where) -> None:
        """The manifest's inputs, outputs and symbols must be what the library was built for: an
        edited shape or dtype would otherwise size buffers the library writes past."""
        from .artifact import SIGNED, signed_part
        try:
            own = json.loads(self.fn.signature().decode())
        except (ValueError, UnicodeDecodeError):
            own = None
        stated = signed_part(manifest)
        if own != stated:
            bad = [k for k in SIGNED if not isinstance(own, dict) or own.get(k) != stated.get(k)]
            raise ArtifactError(f"artifact {where}: manifest.json's {', '.join(bad)} do not match model.so "
                                "(the manifest was edited, or belongs to another build)")

    def close(self):
        with self._lock:
            cdll, self.cdll = self.cdll, None
        if cdll is not None:
            self.fn = None
            _dlclose(cdll._handle)


def _dlclose(handle):
    import _ctypes
    _ctypes.dlclose(handle)
