"""An artifact built for another machine (an aarch64 one on an x86 host, or wasm32-wasi), run here
through its C runner (cuvil_run, built with it) under the target's emulator (qemu-user, or wasmtime's
Python API): slow, but the very code the device runs, so its answers can be checked. Same checks and calls as Module; numpy and the
standard library only."""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, CuvilError
from ..target import TARGETS
from . import artifact
from .module import Module, check_threads

# dtypes numpy's .npy format has no descr for travel as raw bytes of their size (codegen/c/runner.py)
_RAW = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


class EmulatedModule(Module):
    """A foreign-target artifact: run(*arrays) writes the inputs as .npy files, runs cuvil_run under
    the emulator and reads the outputs back."""

    def __init__(self, path, num_threads: int | None = None, verify_checksum: bool = True):
        m = self._open(path, num_threads, verify_checksum)
        target = TARGETS.get(m["target"])
        if target is None or target.arch != artifact.arch(m) or not target.is_foreign():
            raise ArtifactError(f"artifact {self.path}: manifest.json's target {m['target']!r} and arch "
                                f"{artifact.arch(m)!r} do not describe a target this cuvil emulates")
        if "cuvil_run" not in m["files"]:
            raise ArtifactError(f"artifact {self.path} ({m['target']}) holds no C runner to run it with; "
                                "recompile it with this cuvil")
        self._runner = target.runner_command()
        if self._runner is None:
            how = ("pip install 'cuvil[wasm]'" if target.runner == ("wasmtime",) else
                   f"apt-get install {dict(target.tools).get(target.runner[0])} (or run `make setup` as root)")
            raise ArtifactError(f"artifact {self.path} was built for {m['target']}; running it on this machine "
                                f"needs the emulator {target.runner[0]}: {how}, or copy it to the device and run "
                                "cuvil_run there")
        self.target = target.name
        self._wasm = None
        if self._runner == ["wasmtime"]:         # compiled once here, not at every run
            from . import wasi
            self._wasm = wasi.load(self.path / "cuvil_run")
        self.num_threads = num_threads or m.get("num_threads") or 1
        self._handle = True

    def close(self):
        self._handle = None

    def set_num_threads(self, n: int):
        self.num_threads = check_threads(n)

    def profile_counters(self):
        raise ArtifactError(f"artifact {self.path}: profiling needs the artifact loaded natively, not emulated")

    def run(self, *arrays, out=None) -> list:
        self._check_open()
        conv, shapes, _ = self._checked(arrays)
        outs = self._check_out(out, shapes) if out is not None else None
        with tempfile.TemporaryDirectory(prefix="cuvil-emulated-") as tmp:
            files = []
            for i, (spec, a) in enumerate(zip(self.inputs, conv)):
                files.append(str(Path(tmp, "in", f"input{i}.npy")))
                Path(files[-1]).parent.mkdir(exist_ok=True)
                np.save(files[-1], _raw(a, spec["dtype"]), allow_pickle=False)
            code, err = self._execute(tmp, files)
            if code:
                raise CuvilError(f"cuvil_run ({self.target}, emulated) failed: {err.strip()[-2000:]}")
            got = [np.load(Path(tmp, f"output{i}.npy"), allow_pickle=False) for i in range(len(self.outputs))]
            for i, (a, c) in enumerate(zip(arrays, conv)):
                self._write_back(a, c, np.load(Path(tmp, f"input{i}.npy"), allow_pickle=False))
        results = []
        for i, (g, s, dt) in enumerate(zip(got, shapes, self._out_dtypes)):
            g = g.view(dt) if g.dtype.kind == "V" else g
            if g.shape != s or g.dtype != dt:
                raise CuvilError(f"cuvil_run wrote output {i} as {g.dtype}{list(g.shape)}, expected {dt}{list(s)}")
            if outs is not None:
                outs[i][...] = g
                g = outs[i]
            results.append(g)
        return results

    def _execute(self, tmp, files) -> tuple[int, str]:
        """cuvil_run on the input files, outputs into tmp: under qemu-user, or wasmtime for wasm32
        (whose program sees only the artifact, as /model, and tmp, as /io)."""
        opts = ["-t", str(self.num_threads), "-i", "1"]
        if self._wasm is not None:
            from . import wasi
            guest = ["/io/" + str(Path(f).relative_to(tmp)) for f in files]
            return wasi.run(self._wasm, ["-w", "/model/weights.bin", *opts, "-o", "/io", *guest],
                            {self.path: "/model", tmp: "/io"})
        try:
            r = subprocess.run([*self._runner, str(self.path / "cuvil_run"), "-w", str(self.path / "weights.bin"),
                                *opts, "-o", tmp, *files], capture_output=True, text=True)
        except OSError as e:         # the emulator vanished, or the program cannot be started
            return 127, f"cannot start {self._runner[0]}: {e}"
        return r.returncode, r.stderr

    @staticmethod
    def _write_back(caller, passed, after):
        """An input the model changed in place (an LLM's KV cache) changes in the caller's array too,
        as it does natively, where the caller's array was the buffer the model was handed."""
        after = after.view(passed.dtype) if after.dtype.kind == "V" else after
        if caller is passed and passed.flags.writeable and not np.array_equal(after, passed, equal_nan=True):
            passed[...] = after

    def __repr__(self):
        return f"<cuvil.EmulatedModule {self.path} ({self.target} under {self._runner[0]})>"


def _raw(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.view(f"V{a.dtype.itemsize}") if dtype in _RAW else a
