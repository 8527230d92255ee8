"""Shape helpers shared by the op declarations."""
from __future__ import annotations

from ...errors import ShapeError
from .. import dims as D


def broadcast(*shapes):
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        ds = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        non1 = [d for d in ds if not (isinstance(d, int) and d == 1)]
        if not non1:
            out.append(1)
            continue
        pick = next((d for d in non1 if isinstance(d, int)), non1[0])
        for d in non1:
            if isinstance(d, int) and isinstance(pick, int) and d != pick:
                raise ShapeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast (dim {i}: {d} vs {pick})")
        out.append(pick)
    return tuple(out)


def norm_axis(axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def norm_axes(axes, rank):
    return tuple(sorted(norm_axis(a, rank) for a in axes))


def slice_len(n, start, end, step):
    """Length of range(start, end, step) clamped to [0, n) the numpy way; n may be symbolic."""
    if all(isinstance(x, int) for x in (n, start, end)):
        return len(range(*slice(start, end, step).indices(n)))
    if step == 1:
        return D.as_dim(end - start)
    raise ShapeError("symbolic slice with step != 1 is not supported")
