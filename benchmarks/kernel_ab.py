"""GEMM kernels alone, two revisions interleaved: the C harness (benchmarks/harness/gemm_bench.c) built
against the kernels of a git revision and against the working tree's, run in alternation, median of
the per-run medians and the new/old time. This is how the "C harness" numbers in benchmarks/README.md
("Kernel notes") were taken; rerun one after changing a kernel or a row of codegen/c/tuning.py.

    python -m benchmarks.kernel_ab --base HEAD~1 [--threads 1,2] [--shapes 128x384x384,1x1024x1024]
        [--rows-written] [--rounds 7] [--target native]
"""
from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
from pathlib import Path

from cuvil.build.toolchain import COMMON_FLAGS, find_compiler, target_flags

from .scratch import temp_dir
from .timing import machine_line

ROOT = Path(__file__).resolve().parent.parent
HARNESS = Path(__file__).resolve().parent / "harness" / "gemm_bench.c"
KERNELS = "cuvil/codegen/c/kernels"
# shapes the kernel notes cite: MiniLM/BERT projections, a large square, 1x1-conv-like, GEMVs
DEFAULT_SHAPES = "128x384x384,128x384x1536,128x1536x384,4096x1536x384,1024x1024x1024,16x4096x1024,1x1024x1024,1x5632x2048"


def _kernels_at(rev: str, dest: Path) -> Path:
    """The kernel sources of git revision rev, unpacked under dest (as dest/kernels)."""
    tar = subprocess.run(["git", "archive", rev, KERNELS], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    return dest / KERNELS


def build(kernels: Path, out: Path, target: str, harness: Path = HARNESS, archive: Path | None = None) -> Path:
    """The harness against the kernels in `kernels`, compiled from their sources, or linked from `archive`
    (cuvil.build.toolchain.kernels_object: the same sources, already built) where given."""
    srcs = [str(archive)] if archive else sorted(str(p) for p in kernels.glob("*.c"))
    cmd = [find_compiler(), *COMMON_FLAGS, *target_flags(target), f"-I{kernels.parent}", str(harness), *srcs,
           "-lm", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"building the harness against {kernels} failed:\n{r.stderr[-3000:]}")
    return out


def time_once(binary: Path, shape, threads: int, calls: int, rows_written: bool) -> float:
    args = [str(binary), *map(str, shape), str(threads), str(calls), str(int(rows_written))]
    return float(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def calls_for(shape) -> int:
    """About 0.3 s of calls at ~50 GFLOP/s, 5 at the least."""
    m, n, k = shape
    return max(5, min(2000, int(0.3 * 50e9 / (2 * m * n * k))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision whose kernels are the 'old' side")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="MxNxK, comma separated")
    ap.add_argument("--rows-written", action="store_true", help="the threads write A by rows before each call")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target", default="native")
    a = ap.parse_args(argv)
    shapes = [tuple(int(d) for d in s.lower().split("x")) for s in a.shapes.split(",")]
    if any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes: each shape is MxNxK with positive sizes, got {a.shapes!r}")
    work = Path(temp_dir("cuvil-kernel-ab-"))
    old = build(_kernels_at(a.base, work / "old"), work / "bench_old", a.target)
    new = build(ROOT / KERNELS, work / "bench_new", a.target)
    print(f"# {machine_line()}\n# base {a.base}, {a.rounds} rounds interleaved, rows written: {a.rows_written}")
    print("| threads | M x N x K | old us | new us | new/old |\n|---|---|---|---|---|")
    for threads in (int(t) for t in a.threads.split(",")):
        for shape in shapes:
            runs = {"old": [], "new": []}
            for _ in range(a.rounds):
                for side, binary in (("old", old), ("new", new)):
                    runs[side].append(time_once(binary, shape, threads, calls_for(shape), a.rows_written))
            o, n = statistics.median(runs["old"]), statistics.median(runs["new"])
            print(f"| {threads} | {'x'.join(map(str, shape))} | {o:.1f} | {n:.1f} | {n / o:.3f} |", flush=True)


if __name__ == "__main__":
    main()
