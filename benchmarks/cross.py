"""Foreign targets (issue 42), measured where they can be: for each zoo model (tests/models.py, small
configs), the cross-compile time per target (kernel library already built), the code size, the
share of aarch64's instructions that are NEON vector ones in the model's code, and under wasmtime the
SIMD128 build's run time against the scalar build of the same model (best of N runs inside the
module, rounds interleaved, the median ratio). Absolute speed under emulation means nothing: ratios
only.

    python -m benchmarks.cross [--models mlp,resnet,...] [--rounds 3] [--runs 20]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import cuvil
from benchmarks.timing import machine_line
from cuvil.build import toolchain
from cuvil.runtime import wasi
from cuvil.target import TARGETS
from tests import models

TARGET_NAMES = ("aarch64-neon", "wasm32-wasi", "wasm32-wasi-scalar")
ZOO = ("mlp", "resnet", "bert", "minilm", "gpt2", "llama")
BEST = re.compile(r"best of \d+ runs ([0-9.]+) ms")
NEON = re.compile(r"\tv\d+\.(4s|2d|8h|16b)|\tq\d+")      # an operand in a 128-bit vector register


def neon_share(binary: Path) -> tuple[int, float]:
    """(instructions, share with a 128-bit vector operand) of the aarch64 code in `binary`."""
    dump = subprocess.run([TARGETS["aarch64-neon"].tool("objdump"), "-d", "--no-show-raw-insn", str(binary)],
                          capture_output=True, text=True, check=True).stdout
    insns = [ln for ln in dump.splitlines() if re.match(r"\s+[0-9a-f]+:\t", ln)]
    return len(insns), sum(bool(NEON.search(ln)) for ln in insns) / max(len(insns), 1)


def wasm_ms(path: Path, inputs, runs: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for i, a in enumerate(inputs):
            np.save(Path(tmp, f"in{i}.npy"), a)
            names.append(f"/io/in{i}.npy")
        code, err = wasi.run(wasi.load(path / "cuvil_run"), ["-w", "/model/weights.bin", "-n", str(runs), "-o", "/io", *names],
                             {path: "/model", tmp: "/io"})
        if code:
            raise RuntimeError(err)
        return float(BEST.search(err).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="cuvil-cross-bench-"))
    os.environ["CUVIL_KERNEL_CACHE"] = str(cache / "kernels")     # a fresh one: its build is timed
    kernel_secs = {}
    for t in TARGET_NAMES:                              # kernel libraries first: not part of a model's time
        t0 = time.perf_counter()
        toolchain.kernels_object(t, cache)
        kernel_secs[t] = time.perf_counter() - t0
    print(f"machine: {machine_line()}")
    print(f"compilers: {toolchain.compiler_version('aarch64-neon')}; {toolchain.compiler_version('wasm32-wasi')}")
    print("kernel library build (once per machine and target): "
          + ", ".join(f"{t} {s:.1f} s" for t, s in kernel_secs.items()))
    print()
    print("| model | compile aarch64 / wasm (s) | aarch64 code (KB) | NEON share | wasm module (KB) | "
          "wasm SIMD128 / scalar time |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for name in a.models.split(","):
        model, args = models.ALL[name]()
        inputs = [x.numpy() for x in args]
        built, secs = {}, {}
        for t in TARGET_NAMES:
            t0 = time.perf_counter()
            built[t] = cuvil.compile(model, args, target=t, cache_dir=cache / t).path
            secs[t] = time.perf_counter() - t0
        n, share = neon_share(built["aarch64-neon"] / "model.so")
        per = {t: [] for t in TARGET_NAMES[1:]}
        for _ in range(a.rounds):                      # interleaved
            for t in per:
                per[t].append(wasm_ms(built[t], inputs, a.runs))
        ratio = statistics.median(s / v for s, v in zip(per["wasm32-wasi"], per["wasm32-wasi-scalar"]))
        ratios.append(ratio)
        print(f"| {name} | {secs['aarch64-neon']:.1f} / {secs['wasm32-wasi']:.1f} | "
              f"{(built['aarch64-neon'] / 'model.so').stat().st_size / 1024:.0f} | {share:.0%} of {n} | "
              f"{(built['wasm32-wasi'] / 'cuvil_run').stat().st_size / 1024:.0f} | {ratio:.2f} "
              f"({statistics.median(per['wasm32-wasi']):.2f} / {statistics.median(per['wasm32-wasi-scalar']):.2f} ms) |")
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"\nwasm SIMD128 / scalar time: geometric mean {geo:.2f}, worst {max(ratios):.2f}")


if __name__ == "__main__":
    main()
