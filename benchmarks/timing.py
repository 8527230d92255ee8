"""Interleaved timing: every system runs once per round, so machine noise hits all alike."""
from __future__ import annotations

import os
import platform
import statistics
import time


def interleaved(fns: dict, rounds=20, warmup=3, min_seconds=0.0, gap=0.15, burst=0.05, min_calls=3):
    """{name: callable} -> {name: median seconds}, calls interleaved round by round.

    Before each system's turn the machine idles for `gap` seconds: OpenBLAS, ONNX Runtime and
    OpenMP keep their worker threads spinning after a call returns, and on a 2-core machine those
    spinning threads took a core from whichever system ran next. Each turn is then a burst of calls
    lasting about `burst` seconds and `min_calls` counted calls at least; the first call of a burst,
    which wakes the system's own thread pool after the gap, is not counted. (With one counted call a
    burst, a 35 ms network had 3 samples a system in a 3-round table, and one disturbed burst moved its
    median by 40%.)"""
    for _ in range(warmup):
        for f in fns.values():
            f()
    times = {k: [] for k in fns}
    t_end = time.perf_counter() + min_seconds
    r = 0
    while r < rounds or time.perf_counter() < t_end:
        for k, f in fns.items():
            if gap:
                time.sleep(gap)
            calls, start = [], time.perf_counter()
            while len(calls) <= min_calls or time.perf_counter() - start < burst:
                t = time.perf_counter()
                f()
                calls.append(time.perf_counter() - t)
            times[k].extend(calls[1:])
        r += 1
    return {k: statistics.median(v) for k, v in times.items()}


# CPU features that decide which kernels run and how the baselines compare, as /proc/cpuinfo names them
KEY_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def machine_line():
    cpu, flags, family = "unknown CPU", set(), ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and cpu == "unknown CPU":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("cpu family") and not family:   # a VM's bare "AMD EPYC": 25 Zen 3/4, 26 Zen 5
                family = f" family {line.split(':', 1)[1].strip()}"
            elif line.split(":", 1)[0].strip() == "model" and "model" not in family:   # 25/1 Zen 3, 25/17 Zen 4
                family += f" model {line.split(':', 1)[1].strip()}"
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    features = " ".join(f for f in KEY_FEATURES if f in flags)
    import torch
    return (f"{cpu}{family} ({features or 'no AVX2'}; {cache_line()}), {os.cpu_count()} cores{core_round_trip()}, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, torch {torch.__version__}")


def core_round_trip():
    """", core-to-core round trip N ns" (harness/core_latency.c, on the first two CPUs this process may
    use), or "" where it cannot be built or run. A shared host's vCPUs sat near (about 100 ns) or far apart (about 400 ns) by the
    minute, and two threads gained much less where far: say which held when a table was taken."""
    import subprocess
    import tempfile
    from pathlib import Path
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:              # one CPU: the two threads would take turns, not answer each other
        return ""
    src = Path(__file__).resolve().parent / "harness" / "core_latency.c"
    exe = Path(tempfile.gettempdir()) / "cuvil-core-latency"
    try:
        if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
            subprocess.run(["cc", "-O2", "-pthread", str(src), "-o", str(exe)], check=True, capture_output=True,
                           timeout=60)
        out = subprocess.run([str(exe), str(cpus[0]), str(cpus[1])], check=True, capture_output=True, text=True,
                             timeout=30).stdout
        return f", core-to-core round trip {int(out)} ns"
    except (OSError, ValueError, subprocess.SubprocessError):
        return ""


def cache_line():
    """L2 and last-level cache sizes from sysfs (the per-core bandwidth behind a model's weights)."""
    sizes = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            if d.startswith("index"):
                level = open(f"{base}/{d}/level").read().strip()
                kind = open(f"{base}/{d}/type").read().strip()
                if kind != "Instruction":
                    sizes[f"L{level}"] = open(f"{base}/{d}/size").read().strip()
    except OSError:
        return "caches unknown"
    return ", ".join(f"{k} {v}" for k, v in sorted(sizes.items()) if k != "L1")
