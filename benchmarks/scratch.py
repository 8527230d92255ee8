"""Temporary directories the benchmarks write (compile caches, ONNX exports, probe builds), removed
when the process exits: each full run used to leave gigabytes behind in /tmp."""
from __future__ import annotations

import atexit
import shutil
import tempfile


def temp_dir(prefix: str = "cuvil-bench-") -> str:
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d
