"""The benchmark suite: cuvil against eager PyTorch, torch.compile, ONNX Runtime and OpenVINO,
interleaved, medians, ratios per workload; writes benchmarks/README.md.

    python -m benchmarks.run [--threads 1,2] [--workloads "MLP b1,ResNet-50"] [--skip torch.compile]
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks import gemm_sweep
from benchmarks.systems import BASELINES, SYSTEMS, WARM_COMPILE
from benchmarks.timing import interleaved, machine_line
from benchmarks.workloads import WORKLOADS


def bench_workload(name, build, threads, systems, rounds):
    model, args = build()
    runs, compile_secs, errors = {}, {}, {}
    for s in systems:
        try:
            run, secs = SYSTEMS[s](model, args, threads)
            run()
            runs[s], compile_secs[s] = run, secs
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run this model is reported
            errors[s] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            traceback.print_exc(limit=1, file=sys.stderr)
    med = interleaved(runs, rounds=rounds, warmup=2, min_seconds=2.0)
    if id(model) in WARM_COMPILE:
        compile_secs["cuvil (warm)"] = WARM_COMPILE[id(model)]
    return med, compile_secs, errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--skip", default="", help="comma-separated systems to leave out")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--output", default="benchmarks/README.md")
    a = ap.parse_args(argv)
    systems = [s for s in SYSTEMS if s not in a.skip.split(",")]
    rows, compile_rows, notes = [], [], []
    kernel_build = build_kernel_library() if "cuvil" in systems else None
    for threads in [int(t) for t in a.threads.split(",")]:
        for w in a.workloads.split(","):
            w = w.strip()
            t0 = time.perf_counter()
            med, csecs, errors = bench_workload(w, WORKLOADS[w], threads, systems, a.rounds)
            base = {s: med[s] for s in BASELINES if s in med}
            best = min(base, key=base.get) if base else None
            ratio = med["cuvil"] / base[best] if best and "cuvil" in med else float("nan")
            rows.append((threads, w, med, best, ratio))
            if threads == 1:
                compile_rows.append((w, csecs))
            for s, e in errors.items():
                notes.append(f"{w} ({threads}t): {s} failed: {e}")
            cells = "  ".join(f"{s} {1000 * v:.2f}" for s, v in med.items())
            print(f"[{threads}t] {w}: {cells} ms  -> cuvil / best({best}) = {ratio:.2f}x   "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    gemm = [] if a.no_gemm else gemm_sweep.run([int(t) for t in a.threads.split(",")])
    write_readme(a.output, " ".join(["python -m benchmarks.run"] + (argv if argv is not None else sys.argv[1:])),
                 systems, rows, compile_rows, gemm, notes, kernel_build)


def build_kernel_library():
    """cuvil's kernel library, built once per machine (toolchain._kernels_root), timed here into a
    fresh directory that every cuvil compile of this run then shares: the compile table's cold
    column is a model's own cold compile, this is the one-time cost beside it."""
    import os

    from benchmarks.scratch import temp_dir
    from cuvil.build import toolchain
    from cuvil.target import resolve_target
    os.environ["CUVIL_KERNEL_CACHE"] = temp_dir("cuvil-bench-kernels-")
    t = time.perf_counter()
    toolchain.kernels_object(resolve_target("native"), Path(temp_dir()))
    secs = time.perf_counter() - t
    print(f"cuvil kernel library (once per machine): {secs:.2f} s", flush=True)
    return secs


def write_readme(path, command, systems, rows, compile_rows, gemm, notes, kernel_build=None):
    cols = [s for s in systems if s != "cuvil"] + ["cuvil"]
    out = ["# Benchmarks", "",
           "Produced by:", "", "```", command, "```", "",
           f"Machine: {machine_line()}", "",
           "Median latency in ms (systems interleaved round by round, so noise hits all alike). "
           "`ratio` is cuvil divided by the fastest of ONNX Runtime, OpenVINO and torch.compile in the same run "
           "(below 1.0 means cuvil is faster).", "",
           "| threads | workload | " + " | ".join(cols) + " | ratio |",
           "|---|---|" + "---|" * len(cols) + "---|"]
    for threads, w, med, best, ratio in rows:
        cells = [f"{1000 * med[s]:.2f}" if s in med else "—" for s in cols]
        out.append(f"| {threads} | {w} | " + " | ".join(cells) + f" | {ratio:.2f} vs {best} |")
    ccols = [c for c in cols if c != "eager"] + ["cuvil (warm)"]      # eager compiles nothing
    out += ["", "## Compile time (s, cold cache, 1 thread)", "",
            "torch.compile: its first call, with Inductor's on-disk caches disabled. ONNX Runtime / OpenVINO: "
            "torch.onnx.export plus session creation. cuvil: an empty model cache; its kernel library is built once "
            "per machine and shared by every model cache"
            + (f" (built at the start of this run: {kernel_build:.2f} s)." if kernel_build is not None else "."), "",
            "| workload | " + " | ".join(ccols) + " |", "|---|" + "---|" * len(ccols)]
    for w, csecs in compile_rows:
        out.append(f"| {w} | " + " | ".join(f"{csecs[c]:.2f}" if c in csecs else "—" for c in ccols) + " |")
    try:
        old = open(path).read()
    except OSError:
        old = ""
    gemm_head = "## GEMM sweep (GFLOP/s, B is a constant weight, fp32)"
    if gemm:
        out += ["", gemm_head, "", "`python -m benchmarks.gemm_sweep` alone, or this command without `--no-gemm`.", "",
                "| threads | M | N | K | numpy/OpenBLAS | cuvil | ratio |", "|---|---|---|---|---|---|---|"]
        for threads, M, N, K, np_g, cv_g in gemm:
            out.append(f"| {threads} | {M} | {N} | {K} | {np_g:.1f} | {cv_g:.1f} | {cv_g / np_g:.2f} |")
    elif gemm_head in old:                          # --no-gemm: keep the last sweep, marked as earlier
        kept = old.split(gemm_head, 1)[1].split("\n## ", 1)[0].split("<!--", 1)[0].rstrip()
        earlier = "" if kept.startswith(" (an earlier run)") else " (an earlier run)"
        out += ["", gemm_head + earlier + kept]
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    from benchmarks.llm import MARK_BEGIN, MARK_END
    if MARK_BEGIN in old:                           # keep the LLM section benchmarks.llm wrote
        out += ["", MARK_BEGIN + old.split(MARK_BEGIN, 1)[1].split(MARK_END, 1)[0] + MARK_END]
        tail = old.split(MARK_END, 1)[1].strip() if MARK_END in old else ""
        if tail:                                    # and the notes written by hand after it
            out += ["", tail]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
