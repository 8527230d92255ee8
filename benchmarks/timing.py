"""Interleaved timing: every system runs once per round, so machine noise hits all alike."""
from __future__ import annotations

import os
import platform
import statistics
import time


def interleaved(fns: dict, rounds=20, warmup=3, min_seconds=0.0):
    """{name: callable} -> {name: median seconds}, calls interleaved round by round."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    times = {k: [] for k in fns}
    t_end = time.perf_counter() + min_seconds
    r = 0
    while r < rounds or time.perf_counter() < t_end:
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
        r += 1
    return {k: statistics.median(v) for k, v in times.items()}


def machine_line():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"torch {torch.__version__}")
