"""Movement jaxpr primitives -> IR: reshapes, broadcasts, transposes, slices (static, and dynamic ones
as a gather of clamped positions), concatenate, pad, rev, split, iota and the gathers that indexing
produces (x[idx], jnp.take, embedding lookups, jnp.take_along_axis)."""
from __future__ import annotations

import math

import numpy as np

from .jax_registry import Unsupported, handles


@handles("reshape")
def _reshape(ctx, x, *, dimensions=None, **_):
    if dimensions is not None:           # lax.reshape's dimensions: the order the input is read in
        x = ctx.transpose(x, dimensions)
    return ctx.reshape(x, ctx.out().shape)


@handles("squeeze")
def _squeeze(ctx, x, **_):
    return ctx.reshape(x, ctx.out().shape)


@handles("broadcast_in_dim")
def _broadcast_in_dim(ctx, x, *dyn, shape, broadcast_dimensions, **_):
    """Operand dim i becomes output dim broadcast_dimensions[i] (increasing): a reshape that puts size-1
    dims in between, then an expand."""
    if dyn:
        raise Unsupported("a broadcast to a shape computed at run time")
    keep = [1] * len(shape)
    for d, n in zip(broadcast_dimensions, x.shape):
        keep[d] = n
    return ctx.expand(ctx.reshape(x, keep), shape)


@handles("transpose")
def _transpose(ctx, x, *, permutation, **_):
    return ctx.transpose(x, permutation)


def _slice_axis(ctx, x, axis, start, step, length):
    if (start, step, length) == (0, 1, x.shape[axis]):
        return x
    return ctx.add("slice", [x], {"axis": axis, "start": start, "step": step, "length": length})


@handles("slice")
def _slice(ctx, x, *, start_indices, limit_indices, strides=None, **_):
    out = ctx.out().shape
    for ax, start in enumerate(start_indices):
        x = _slice_axis(ctx, x, ax, int(start), int(strides[ax]) if strides else 1, out[ax])
    return x


@handles("rev")
def _rev(ctx, x, *, dimensions, **_):
    for ax in dimensions:
        x = _slice_axis(ctx, x, ax, x.shape[ax] - 1, -1, x.shape[ax])
    return x


@handles("split")
def _split(ctx, x, *, sizes, axis, **_):
    starts = np.cumsum([0] + [int(s) for s in sizes])
    return tuple(_slice_axis(ctx, x, axis, int(s), 1, int(n)) for s, n in zip(starts, sizes))


@handles("concatenate")
def _concatenate(ctx, *xs, dimension, **_):
    return xs[0] if len(xs) == 1 else ctx.add("concat", list(xs), {"axis": dimension})


@handles("pad")
def _pad(ctx, x, value, *, padding_config, **_):
    """(low, high, interior) per dim; negative low / high crop, as the IR's pad does."""
    v = ctx.known(value)
    if v is None:
        raise Unsupported("a padding value computed at run time")
    if any(interior for _, _, interior in padding_config):
        raise Unsupported("interior padding")
    pads = [(int(lo), int(hi)) for lo, hi, _ in padding_config]
    return ctx.add("pad", [x], {"pads": pads, "value": v.item()}) if any(lo or hi for lo, hi in pads) else x


@handles("iota")
def _iota(ctx, *, shape, dimension, **_):
    line = ctx.add("iota", [], {"length": shape[dimension], "dtype": ctx.out().dtype})
    keep = [1] * len(shape)
    keep[dimension] = shape[dimension]
    return ctx.expand(ctx.reshape(line, keep), shape)


@handles("dynamic_slice")
def _dynamic_slice(ctx, x, *starts, slice_sizes):
    """jax clamps each start into [0, n - size]: a known start is a slice, one computed at run time a
    gather of the positions start + 0 .. size - 1 along its axis."""
    for ax, (start, size) in enumerate(zip(starts, slice_sizes)):
        n = x.shape[ax]
        if size == n:
            continue
        k = ctx.known(start)
        if k is not None:
            x = _slice_axis(ctx, x, ax, min(max(int(k), 0), n - size), 1, size)
            continue
        first = ctx.add("clip", [start], {"min": 0, "max": n - size})
        pos = ctx.add("add", [ctx.add("iota", [], {"length": size, "dtype": start.dtype}), first])
        x = ctx.add("gather", [x, pos], {"axis": ax})
    return x


# ---- gather ------------------------------------------------------------------------------------
def _mode(mode):
    name = getattr(mode, "name", str(mode))
    if name not in ("CLIP", "FILL_OR_DROP", "PROMISE_IN_BOUNDS"):
        raise Unsupported(f"gather mode {name}")
    return name


def _column(ctx, idx, j, n, mode):
    """Index column j of idx[..., k] clamped into [0, n) (XLA's gather clamps; jnp made negative indices
    positive already), and with mode FILL_OR_DROP where it was in range (else None)."""
    col = ctx.reshape(_slice_axis(ctx, idx, idx.type.rank - 1, j, 1, 1), idx.shape[:-1])
    valid = None
    if mode == "FILL_OR_DROP":
        valid = ctx.add("and", [ctx.add("ge", [col, ctx.scalar(0, col.dtype)]),
                                ctx.add("lt", [col, ctx.scalar(n, col.dtype)])])
    return ctx.add("clip", [col], {"min": 0, "max": n - 1}), valid


def _fill(ctx, y, valid, fill_value):
    """y where valid (broadcast against it), else the fill value (jax's default: NaN, the most negative
    signed / largest unsigned integer, True)."""
    if fill_value is None:
        dt = np.dtype(y.dtype)
        fill_value = math.nan if dt.kind == "f" else True if dt.kind == "b" else \
            np.iinfo(dt).min if dt.kind == "i" else np.iinfo(dt).max
    return ctx.add("where", [valid, y, ctx.scalar(fill_value, y.dtype)])


@handles("gather")
def _gather(ctx, x, idx, *, dimension_numbers, slice_sizes, mode, fill_value=None, **_):
    dn, mode = dimension_numbers, _mode(mode)
    if dn.operand_batching_dims:
        return _take_along(ctx, x, idx, dn, slice_sizes, mode, fill_value)
    axes = list(dn.start_index_map)
    whole = all(slice_sizes[d] == (1 if d in axes else x.shape[d]) for d in range(x.type.rank))
    if not axes or not whole or axes != list(dn.collapsed_slice_dims) or axes != list(range(axes[0], axes[-1] + 1)):
        raise Unsupported("a gather other than whole slices along adjacent axes in order (x[idx], jnp.take, "
                          "embedding lookups, jnp.take_along_axis)")
    return _take(ctx, x, idx, axes, list(dn.offset_dims), mode, fill_value)


def _take(ctx, x, idx, axes, offset_dims, mode, fill_value):
    """One IR gather on x with the indexed axes merged into one, at their row-major linear index; then
    jax's output order: the operand's kept dims at offset_dims, the index batch dims elsewhere."""
    a0, a1 = axes[0], axes[-1] + 1
    sizes = [x.shape[a] for a in axes]
    lin, valid, stride = None, None, 1
    for j in reversed(range(len(axes))):
        col, ok = _column(ctx, idx, j, sizes[j], mode)
        term = col if stride == 1 else ctx.add("mul", [col, ctx.scalar(stride, col.dtype)])
        lin = term if lin is None else ctx.add("add", [lin, term])
        valid = ok if valid is None else ctx.add("and", [valid, ok])
        stride *= sizes[j]
    flat = ctx.reshape(x, list(x.shape[:a0]) + [stride] + list(x.shape[a1:]))
    y = ctx.add("gather", [flat, lin], {"axis": a0})
    batch = list(idx.shape[:-1])
    if valid is not None:
        y = _fill(ctx, y, ctx.reshape(valid, [1] * a0 + batch + [1] * (x.type.rank - a1)), fill_value)
    out_rank = y.type.rank
    batch_pos = [p for p in range(out_rank) if p not in offset_dims]
    dest = offset_dims[:a0] + batch_pos + offset_dims[a0:]      # where each of y's dims goes
    return ctx.transpose(y, np.argsort(dest).tolist())


def _take_along(ctx, x, idx, dn, slice_sizes, mode, fill_value):
    """The batched gather jnp.take_along_axis makes: every operand dim but one is a batch dim shared with
    the indices -> one IR gather_elements along that dim."""
    batch_rank = idx.type.rank - 1
    free = [d for d in range(batch_rank) if d not in dn.start_indices_batching_dims]
    axis = dn.start_index_map[0] if len(dn.start_index_map) == 1 else None
    every_dim = axis is not None and sorted([*dn.operand_batching_dims, axis]) == list(range(x.type.rank))
    if (not every_dim or dn.offset_dims or list(dn.collapsed_slice_dims) != [axis] or len(free) != 1
            or any(s != 1 for s in slice_sizes)):
        raise Unsupported("a batched gather other than jnp.take_along_axis's")
    col, valid = _column(ctx, idx, 0, x.shape[axis], mode)
    src = {o: s for o, s in zip(dn.operand_batching_dims, dn.start_indices_batching_dims)}
    src[axis] = free[0]
    perm = [src[p] for p in range(x.type.rank)]                  # operand dim p <- index dim perm[p]
    y = ctx.add("gather_elements", [x, ctx.transpose(col, perm)], {"axis": axis})
    y = ctx.transpose(y, np.argsort(perm).tolist())
    return _fill(ctx, y, valid, fill_value) if valid is not None else y
