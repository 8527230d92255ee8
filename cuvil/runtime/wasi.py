"""Run a WASI program (a wasm32-wasi artifact's cuvil_run) through wasmtime's Python API: the
module compiled once when loaded (load), each run in a fresh store with only the given folders
visible to it. Needs the `wasmtime` package (the wasm extra)."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from ..errors import ArtifactError


@functools.lru_cache(None)
def _engine():
    import wasmtime
    return wasmtime.Engine()


def load(program: Path):
    """The compiled module of a WASI program file (compile once; run it many times)."""
    import wasmtime
    try:
        return wasmtime.Module(_engine(), Path(program).read_bytes())
    except wasmtime.WasmtimeError as e:
        raise ArtifactError(f"{program} is not a valid WebAssembly module ({e})") from None


def run(module, args: list, dirs: dict) -> tuple[int, str]:
    """Run a loaded module with argv [cuvil_run, *args], host folders dirs {host path: guest path}
    preopened; returns (exit code, stderr text). A trap (out of bounds, unreachable) is exit code -1."""
    import wasmtime
    with tempfile.TemporaryDirectory(prefix="cuvil-wasi-") as tmp:
        err_file = Path(tmp, "stderr")
        cfg = wasmtime.WasiConfig()
        cfg.argv = ["cuvil_run", *map(str, args)]
        for host, guest in dirs.items():
            cfg.preopen_dir(str(host), guest)
        cfg.stderr_file = str(err_file)
        store = wasmtime.Store(_engine())
        store.set_wasi(cfg)
        linker = wasmtime.Linker(_engine())
        linker.define_wasi()
        code = 0
        try:
            linker.instantiate(store, module).exports(store)["_start"](store)
        except wasmtime.ExitTrap as e:
            code = e.code
        except wasmtime.Trap as e:
            err_file.write_text(f"{err_file.read_text() if err_file.exists() else ''}trap: {e}")
            code = -1
        return code, err_file.read_text(errors="replace") if err_file.exists() else ""
