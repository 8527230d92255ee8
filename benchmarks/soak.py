"""Soak: a long-running process must not grow. Two phases, each reporting resident memory, open
file descriptors, memory mappings and threads at its start and end (and along the way):

1. calls: `--calls` runs (default 10^6) of a small model from `--threads` Python threads (default 8)
   sharing one loaded artifact, each thread checking a sample of its answers;
2. artifacts: `--artifacts` cycles (default 10^4) of load / run / drop, each of a distinct artifact.
   Distinct libraries without 10^4 C compiles: each cycle's model.so is the built one with 8 bytes
   of its own appended (an ELF loader ignores bytes past the sections; the file, its hash and so
   its private copy are new), the manifest resealed by the artifact writer.

    python -m benchmarks.soak                    # both phases at full size (about 10 minutes here)
    python -m benchmarks.soak --calls 20000 --artifacts 300    # a quick look

Prints a table and writes it to benchmarks/soak.md with the machine line."""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def process_state() -> dict:
    """Resident memory (MiB), open fds, mappings and threads of this process, from /proc."""
    status = Path("/proc/self/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")) / 1024
    return {"rss_mib": round(rss, 1), "fds": len(os.listdir("/proc/self/fd")),
            "maps": len(Path("/proc/self/maps").read_text().splitlines()),
            "threads": len(os.listdir("/proc/self/task"))}


def build(tmp: Path):
    import torch

    import cuvil
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16)).eval()
    x = torch.randn(4, 64)
    with torch.no_grad():
        want = model(x).numpy()
    path = cuvil.compile(model, (x,), cache_dir=tmp / "cache").save(tmp / "model")
    return path, x.numpy(), want


def phase_calls(path, x, want, calls, threads, log):
    import cuvil
    mod = cuvil.load(path, num_threads=1)
    per = calls // threads
    errors = []

    def worker(seed):
        out = np.empty_like(want)
        for i in range(per):
            mod.run(x, out=[out])
            if i % 4096 == 0 and not np.allclose(out, want, rtol=1e-4, atol=1e-4):
                errors.append(seed)
                return

    for t in [threading.Thread(target=worker, args=(s,)) for s in range(threads)] or ():
        t.start()
        log.append(t)
    t0 = time.perf_counter()
    for t in log:
        t.join()
    dt = time.perf_counter() - t0
    log.clear()
    mod.close()
    return dt, errors


def variant(src: Path, dest: Path, i: int):
    """A distinct artifact: src's files, model.so with i appended, the manifest resealed."""
    from cuvil.runtime import artifact
    shutil.copytree(src, dest)
    with open(dest / "model.so", "ab") as f:
        f.write(i.to_bytes(8, "little"))
    m = json.loads((dest / "manifest.json").read_text())
    for k in ("files", "content_hash", "format_version"):
        m.pop(k)
    artifact.write_manifest(dest, m)


def phase_artifacts(path, x, want, n, tmp, samples):
    import cuvil
    for i in range(n):
        d = tmp / f"v{i}"
        variant(path, d, i)
        mod = cuvil.load(d)
        got = mod.run(x)[0]
        if i % 500 == 0:
            assert np.allclose(got, want, rtol=1e-4, atol=1e-4), f"cycle {i}: wrong answer"
        del mod
        shutil.rmtree(d)
        if (i + 1) % max(n // 5, 1) == 0:
            gc.collect()
            samples.append((i + 1, process_state()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10**6)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--artifacts", type=int, default=10**4)
    ap.add_argument("--out", default=str(Path(__file__).with_name("soak.md")))
    a = ap.parse_args()
    from benchmarks.timing import machine_line
    tmp = Path(tempfile.mkdtemp(prefix="cuvil-soak-"))
    rows = []
    try:
        path, x, want = build(tmp)
        phase_calls(path, x, want, a.threads * 100, a.threads, [])      # one-time costs out of the way
        phase_artifacts(path, x, want, 20, tmp, [])
        gc.collect()
        start = process_state()
        dt, errors = phase_calls(path, x, want, a.calls, a.threads, [])
        gc.collect()
        rows.append(("calls: start", start))
        rows.append((f"calls: after {a.calls:,} from {a.threads} threads ({dt:.1f} s, "
                     f"{a.calls / dt:,.0f} calls/s, wrong answers: {len(errors)})", process_state()))
        samples = []
        t0 = time.perf_counter()
        phase_artifacts(path, x, want, a.artifacts, tmp, samples)
        dt = time.perf_counter() - t0
        rows += [(f"artifacts: after {k:,} load/run/drop cycles", s) for k, s in samples]
        rows[-1] = (rows[-1][0] + f" ({dt:.1f} s)", rows[-1][1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = ["# Soak", "", "Produced by:", "", "```", f"python -m benchmarks.soak --calls {a.calls} --threads "
             f"{a.threads} --artifacts {a.artifacts}", "```", "", f"Machine: {machine_line()}", "",
             "| point | RSS (MiB) | open fds | mappings | threads |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {s['rss_mib']} | {s['fds']} | {s['maps']} | {s['threads']} |" for name, s in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
