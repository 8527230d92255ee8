"""Buffers on 2 MB pages (Linux transparent huge pages), for the memory a model reads on every call:
its weights when they are small enough to stay in cache, and its arena. On 4 KB pages such buffers
are walked page by page once they span more than the TLB holds (3072 entries on Zen 4: 12 MB).
Standard library and numpy only."""
from __future__ import annotations

import functools
import mmap
from pathlib import Path

import numpy as np

HUGE_PAGE = 1 << 21


@functools.lru_cache(None)
def huge_pages_available() -> bool:
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def huge_page_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 buffer starting on a 2 MB boundary, anonymous memory advised to huge
    pages (the array's base chain holds the mapping). Callers check huge_pages_available first."""
    n = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    region = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    region.madvise(mmap.MADV_HUGEPAGE, start, n)
    return whole[start:start + nbytes]
