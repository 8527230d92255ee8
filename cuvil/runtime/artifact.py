"""The artifact directory: manifest.json, weights.bin, model.so, model.h, model.c.
Imports nothing but numpy and the standard library."""
from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import ArtifactError
from ..target import host_arch
from .pages import huge_page_empty, huge_pages_available

FORMAT_VERSION = 2                 # 2: sealed (files, content_hash) and cross-checked (cuvil_signature)
FILES = ("manifest.json", "weights.bin", "model.so", "model.h", "model.c")     # a native artifact's
# wasm32 has no shared libraries: its artifact's program is the C runner, a WASI module
MODULE_ONLY_ARCHES = ("wasm32",)


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


# --- the manifest: written sealed, read checked -----------------------------------------------------
# An artifact is native code: load only artifacts you trust. The hashes below catch corruption, edits
# and stale copies (no one can sign here); what keeps an edited manifest from turning into a buffer
# overflow is the cross-check against the signature the library itself reports (signature()).
# what the library reports about itself; data_dims (the symbols computed at run time) only where present
SIGNED = ("inputs", "outputs", "symbols", "data_dims", "symbol_products")
HASHED = ("model.so", "model.c", "model.h")     # weights.bin has its own (parallel) checksum
RUNNER = ("cuvil_run", "cuvil_run_main.c", "cuvil_run_io.h")   # the C runner, where one was built
PREFIX = re.compile(r"cuvil_([A-Za-z][A-Za-z0-9_]{0,31}_)?\Z")
DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")     # numpy's and ml_dtypes' names (float8_e4m3fn, int4)
MAX_IO = 4096


def signature(manifest: dict) -> str:
    """The canonical text of what the library's cuvil_signature() returns: its inputs, outputs and
    dim symbols exactly as the manifest states them."""
    return json.dumps(signed_part(manifest), sort_keys=True, separators=(",", ":"))


def signed_part(manifest: dict) -> dict:
    return {k: manifest.get(k, {} if k == "symbols" else None) for k in SIGNED
            if manifest.get(k) is not None or k == "symbols"}


def file_digest(path: Path) -> str:
    return "sha256:" + _hash_file(Path(path))


def _hash_file(f: Path) -> str:
    st = f.stat()
    seen = (st.st_ino, st.st_size, st.st_mtime_ns)
    key = str(f.resolve())
    hit = _HASHED.get(key)
    if hit and hit[0] == seen:
        return hit[1]
    h = hashlib.sha256(f.read_bytes()).hexdigest()
    _HASHED[key] = (seen, h)
    return h


def _content_hash(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "content_hash"}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(path: Path, manifest: dict):
    """Seal a finished artifact: sizes and hashes of its files, then a hash over the whole manifest."""
    path = Path(path)
    manifest = dict(manifest, format_version=FORMAT_VERSION)
    manifest["files"] = {f: {"bytes": (path / f).stat().st_size, "digest": file_digest(path / f)}
                         for f in HASHED + RUNNER if f in required_hashed(manifest) or (path / f).is_file()}
    manifest["content_hash"] = _content_hash(manifest)
    _replace_manifest(path, manifest)


def _replace_manifest(path: Path, manifest: dict):
    """manifest.json written whole beside the old one and renamed over it (a name of this process's
    own, so two processes writing at once never share a half-written file)."""
    tmp = path / f"manifest.json.{os.getpid()}-{id(manifest)}.tmp"
    try:
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, path / "manifest.json")
    finally:
        tmp.unlink(missing_ok=True)


def amend_manifest(path: Path, **fields):
    """Add fields to a finished artifact's manifest (the compile's accuracy report): its file digests
    stay the ones sealed when it was built; only the manifest's own hash is computed again."""
    m = {**read_manifest(path), **fields}
    m["content_hash"] = _content_hash(m)
    _replace_manifest(Path(path), m)


def read_manifest(path: Path) -> dict:
    """manifest.json, parsed and checked field by field (ArtifactError names the field)."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path} is not a cuvil artifact directory")
    missing = [f for f in ("manifest.json", "weights.bin", "model.h", "model.c") if not (path / f).is_file()]
    if missing:                # what every artifact has; model.so or cuvil_run by its arch, below
        raise ArtifactError(f"artifact {path} is missing {', '.join(missing)}")
    try:
        m = json.loads((path / "manifest.json").read_bytes())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ArtifactError(f"artifact {path}: manifest.json is not valid JSON ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise ArtifactError(f"artifact {path}: cannot read manifest.json ({e})") from None
    if not isinstance(m, dict):
        raise ArtifactError(f"artifact {path}: manifest.json holds a {type(m).__name__}, not an object")
    got = m.get("format_version")
    if got != FORMAT_VERSION or type(got) is not int:
        raise ArtifactError(f"artifact {path}: format version {got!r}; this cuvil reads only version "
                            f"{FORMAT_VERSION} (recompile the model with this cuvil)")
    try:
        _check_schema(m)
    except _Bad as e:
        raise ArtifactError(f"artifact {path}: manifest.json: {e}") from None
    missing = [f for f in required_hashed(m) if not (path / f).is_file()]
    if missing:
        raise ArtifactError(f"artifact {path} is missing {', '.join(missing)}")
    return m


def required_hashed(manifest: dict) -> tuple:
    """The hashed files an artifact must have: model.so and its sources, or for a target without
    shared libraries (wasm32) the sources and the runner module."""
    if arch(manifest) in MODULE_ONLY_ARCHES:
        return ("model.c", "model.h", "cuvil_run")
    return HASHED


class _Bad(Exception):
    pass


def _need(ok, where, what, got):
    if not ok:
        raise _Bad(f"{where} must be {what}, got {_short(got)}")


def _short(v):
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _is_int(v, lo=0, hi=1 << 62):
    return type(v) is int and lo <= v <= hi


def _check_schema(m):
    for k in ("inputs", "outputs", "weights", "arena_bytes", "target", "files", "content_hash"):
        _need(k in m, k, "present", None)
    for side in ("inputs", "outputs"):
        specs = m[side]
        _need(isinstance(specs, list) and len(specs) <= MAX_IO, side, f"a list of at most {MAX_IO} entries", specs)
        for i, s in enumerate(specs):
            where = f"{side}[{i}]"
            _need(isinstance(s, dict), where, "an object", s)
            _need(isinstance(s.get("name"), str), f"{where}.name", "a string", s.get("name"))
            _need(isinstance(s.get("dtype"), str) and DTYPE_NAME.match(s["dtype"]), f"{where}.dtype",
                  "a dtype name", s.get("dtype"))
            shape = s.get("shape")
            _need(isinstance(shape, list) and len(shape) <= 16, f"{where}.shape", "a list of at most 16 dims", shape)
            for j, d in enumerate(shape):
                _need(_is_int(d) or (isinstance(d, str) and 0 < len(d) <= 256), f"{where}.shape[{j}]",
                      "an int >= 0 or a dim expression", d)
    syms = m.get("symbols", {})
    _need(isinstance(syms, dict), "symbols", "an object", syms)
    for k, b in syms.items():
        _need(k.isidentifier() and isinstance(b, list) and len(b) == 2 and all(_is_int(x) for x in b)
              and b[0] <= b[1], f"symbols[{k!r}]", "[lo, hi] with 0 <= lo <= hi", b)
    prods = m.get("symbol_products")
    _need(prods is None or (isinstance(prods, list) and all(
        isinstance(p, list) and len(p) == 3 and p[0] in syms and p[1] in syms and _is_int(p[2]) for p in prods)),
          "symbol_products", "null or a list of [symbol, symbol, int >= 0]", prods)
    dd = m.get("data_dims")
    _need(dd is None or (isinstance(dd, list) and all(isinstance(k, str) and k in syms for k in dd)), "data_dims",
          "null or a list of names from symbols", dd)
    w = m["weights"]
    _need(isinstance(w, dict) and _is_int(w.get("bytes")) and isinstance(w.get("checksum"), str), "weights",
          '{"bytes": int >= 0, "checksum": str}', w)
    _need(_is_int(m["arena_bytes"]), "arena_bytes", "an int >= 0", m["arena_bytes"])
    _need(m.get("num_threads") is None or _is_int(m["num_threads"], 1, 4096), "num_threads",
          "null or an int in [1, 4096]", m.get("num_threads"))
    feats = m.get("cpu_features", [])
    _need(isinstance(feats, list) and all(isinstance(f, str) for f in feats), "cpu_features", "a list of strings",
          feats)
    _need(m.get("treespec") is None or isinstance(m["treespec"], str), "treespec", "null or a string",
          m.get("treespec"))
    names = m.get("output_names")
    _need(names is None or (isinstance(names, list) and len(names) == len(m["outputs"])
                            and all(isinstance(n, str) for n in names)),
          "output_names", "a list of one string per output", names)
    seqs = m.get("output_sequences")
    _need(seqs is None or _sequences_ok(seqs, len(m["outputs"])), "output_sequences",
          "an object of name -> [first output, count], the ranges inside the outputs and apart", seqs)
    files = m["files"]
    _need(isinstance(m["target"], str) and len(m["target"]) <= 64, "target", "a target name", m["target"])
    _need(m.get("arch") is None or (isinstance(m["arch"], str) and m["arch"] in ELF_MACHINE), "arch",
          f"one of {', '.join(ELF_MACHINE)}", m.get("arch"))
    need = required_hashed(m)
    _need(isinstance(files, dict) and set(need) <= set(files) <= set(HASHED + RUNNER), "files",
          f"an object with {', '.join(need)} (and {', '.join(RUNNER)} where a runner was built)", files)
    for f, e in files.items():
        _need(isinstance(e, dict) and _is_int(e.get("bytes")) and isinstance(e.get("digest"), str), f"files[{f!r}]",
              '{"bytes": int, "digest": str}', e)
    _need(isinstance(m["content_hash"], str), "content_hash", "a string", m["content_hash"])
    ops = m.get("precision_ops", {})
    _need(isinstance(ops, dict) and len(ops) <= 64 and all(isinstance(k, str) and len(k) <= 128 and _is_int(v)
                                                           for k, v in ops.items()),
          "precision_ops", "an object of format name -> count", ops)
    _check_accuracy(m.get("accuracy"))
    prefix = m.get("symbol_prefix", "cuvil_")
    _need(isinstance(prefix, str) and PREFIX.match(prefix), "symbol_prefix", "cuvil_ or cuvil_<name>_", prefix)


def _is_num(v):
    return type(v) in (int, float)             # NaN and inf included: a broken output is reported as such


def _check_accuracy(acc):
    """The compile's accuracy report (accuracy.py), where one was measured."""
    if acc is None:
        return
    _need(isinstance(acc, dict) and _is_int(acc.get("inputs")) and isinstance(acc.get("outputs"), list)
          and len(acc["outputs"]) <= MAX_IO, "accuracy", '{"inputs": int, "outputs": [...]}', acc)
    for i, o in enumerate(acc["outputs"]):
        _need(isinstance(o, dict) and all(_is_num(o.get(k)) for k in ("max_abs", "scale", "rel", "cosine", "mean_cosine"))
              and all(o.get(k) is None or _is_num(o[k]) for k in ("top1", "mismatch")), f"accuracy.outputs[{i}]",
              "numbers max_abs, scale, rel, cosine, mean_cosine, and top1 and mismatch (or null)", o)


ELF_MACHINE = {"x86_64": 62, "aarch64": 183, "wasm32": None}     # wasm32: a WASI module, not ELF


def arch(manifest: dict) -> str:
    """The machine an artifact's code is for: the manifest's "arch" (older ones: this machine's)."""
    return manifest.get("arch") or host_arch()


def is_foreign(manifest: dict) -> bool:
    return arch(manifest) != host_arch()


def _check_machine(path: Path, name: str, want: str):
    """`name` is a WebAssembly module for wasm32, else ELF code of the arch's machine number."""
    with open(path / name, "rb") as fh:
        head = fh.read(20)
    if want in MODULE_ONLY_ARCHES:
        if head[:4] != b"\0asm":
            raise ArtifactError(f"artifact {path}: {name} is not a WebAssembly module, but the manifest says {want}")
        return
    if head[:4] != b"\x7fELF":
        raise ArtifactError(f"artifact {path}: {name} is not machine code (no ELF header)")
    machine = int.from_bytes(head[18:20], "little")
    if ELF_MACHINE.get(want, machine) != machine:
        raise ArtifactError(f"artifact {path}: {name} is machine code for ELF machine {machine}, but the "
                            f"manifest says {want} (mixed-up files)")


def verify(path: Path, manifest: dict, full: bool = True):
    """The artifact's files against its manifest: sizes and the library's header always; with `full`,
    every file's hash and the hash over the manifest (weights.bin is checked by map_weights)."""
    path = Path(path)
    for f, e in manifest["files"].items():
        size = (path / f).stat().st_size
        if size != e["bytes"]:
            raise ArtifactError(f"artifact {path}: {f} is {size} bytes, but the manifest records {e['bytes']} "
                                "(truncated or replaced)")
    for f in ("model.so", "cuvil_run"):        # machine code for the arch the manifest states
        if f in manifest["files"]:
            _check_machine(path, f, arch(manifest))
    if not full:
        return
    if _content_hash(manifest) != manifest["content_hash"]:
        raise ArtifactError(f"artifact {path}: manifest.json was modified after the artifact was built "
                            "(its content hash does not match)")
    for f, e in manifest["files"].items():
        if file_digest(path / f) != e["digest"]:
            raise ArtifactError(f"artifact {path}: {f} does not match the hash in manifest.json (corrupt or modified)")


def save(src: Path, dest: Path) -> Path:
    """Copy an artifact to `dest` as one step: written beside it under a temporary name, then renamed
    into place, so a process that has `dest` loaded, or loads it meanwhile, never sees half a copy.
    An existing `dest` is replaced only if it is an artifact (or empty): never a folder of other files."""
    src, dest = Path(src), Path(dest)
    if dest.exists():
        if not dest.is_dir():
            raise ArtifactError(f"cannot save to {dest}: it is a file, not an artifact directory")
        if any(dest.iterdir()) and not (dest / "manifest.json").is_file():
            raise ArtifactError(f"cannot save to {dest}: the folder holds files and is not an artifact; "
                                "choose a new or empty folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.saving-", dir=dest.parent))
    try:
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith(".tmp"):
                shutil.copy(f, tmp / f.name)        # with its mode: cuvil_run stays executable
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}-{id(tmp)}"
            os.replace(dest, old)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dest


class _Recent(collections.OrderedDict):
    """A dict that keeps only its `limit` most recently set entries: a process that loads thousands
    of distinct artifacts must not grow by what it remembers of each."""

    def __init__(self, limit=512):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


# file -> ((inode, size, mtime), sha256) for files this process has hashed: a repeat load of an
# unchanged artifact (a cache hit right after the compile that wrote it) does not re-read it
_HASHED = _Recent()


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
        raise ArtifactError(f"artifact {path}: weights.bin is {size} bytes, but the manifest records {want} "
                            "(truncated or replaced)")
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
_VERIFIED = _Recent()


def _sequences_ok(seqs, n_outputs):
    if not isinstance(seqs, dict) or not all(
            isinstance(r, list) and len(r) == 2 and all(_is_int(x) for x in r) for r in seqs.values()):
        return False
    ranges = sorted(tuple(r) for r in seqs.values())
    ends = [0] + [f + c for f, c in ranges]
    return all(isinstance(k, str) for k in seqs) and all(f >= e for (f, _), e in zip(ranges, ends)) \
        and ends[-1] <= n_outputs

