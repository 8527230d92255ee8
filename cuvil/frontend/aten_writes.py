"""ATen writes into a copy and gathered reads -> IR: slice_scatter, select_scatter, index_put, scatter /
scatter_add / scatter_reduce (as the functional graph has them); as_strided over a contiguous source,
diagonal, unfold and flip (gathers of positions computed from the static shape); histc (a scatter-add
of ones); round to decimals; empty_permuted (its contents are undefined: zeros); the scatter twins of
the gathers (diagonal_scatter, as_strided_scatter), put and masked_scatter."""
from __future__ import annotations

import numpy as np

from ..ir import dims as D
from .aten import Unsupported, _out_dtype, aten, handles, outputs_read, static_sizes


_static = static_sizes("a symbolic size")


@handles(aten.slice_scatter.default)
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """x with x[..., start:end:step, ...] (along dim) replaced by src."""
    dim %= x.type.rank
    _static(x.shape[dim], *src.shape)
    idx = np.arange(*slice(start, end, step).indices(x.shape[dim]))
    shape = [1] * x.type.rank
    shape[dim] = len(idx)
    index = ctx.add("expand", [ctx.g.const(idx.reshape(shape).astype(np.int64))], {"shape": list(src.shape)})
    return ctx.add("scatter_elements", [x, index, ctx.tensor(src, x.dtype)], {"axis": dim})


@handles(aten.select_scatter.default)
def _select_scatter(ctx, x, src, dim, index):
    dim %= x.type.rank
    _static(x.shape[dim])
    src = ctx.add("reshape", [src], {"shape": list(src.shape[:dim]) + [1] + list(src.shape[dim:])})
    i = index % x.shape[dim]
    return _slice_scatter(ctx, x, src, dim, i, i + 1, 1)


@handles(aten.index_put.default)
def _index_put(ctx, x, indices, values, accumulate=False):
    """x[i0, i1, ...] = values (+= with accumulate), index tensors on the leading dims: one scatter_nd
    of the broadcast indices stacked along a last axis."""
    k = len(indices)
    if k > x.type.rank:
        raise Unsupported(f"index_put with {k} indices into a rank-{x.type.rank} tensor")
    if any(t is None for t in indices):
        return _index_put_skipping(ctx, x, indices, values, accumulate)
    if k == 1 and indices[0].dtype == "bool":
        return _masked_put(ctx, x, indices[0], values, accumulate)
    if any(t.dtype == "bool" for t in indices):
        raise Unsupported("index_put with several boolean masks")
    shapes = [tuple(t.shape) for t in indices]
    _static(*[d for s in shapes for d in s], *x.shape[:k])
    batch = np.broadcast_shapes(*shapes)
    cols = []
    for t, n in zip(indices, x.shape[:k]):
        t = ctx.tensor(t, "int64")
        t = ctx.add("where", [ctx.add("lt", [t, ctx.tensor(0, "int64")]), ctx.add("add", [t, ctx.tensor(n, "int64")]), t])
        if tuple(t.shape) != batch:
            t = ctx.add("expand", [t], {"shape": list(batch)})
        cols.append(ctx.add("reshape", [t], {"shape": list(batch) + [1]}))
    nd = cols[0] if k == 1 else ctx.add("concat", cols, {"axis": len(batch)})
    upd_shape = list(batch) + list(x.shape[k:])
    v = ctx.tensor(values, x.dtype)
    if tuple(v.shape) != tuple(upd_shape):
        v = ctx.add("expand", [v], {"shape": upd_shape})
    return ctx.add("scatter_nd", [x, nd, v], {"reduction": "add" if accumulate else "none"})


def _index_put_skipping(ctx, x, indices, values, accumulate):
    """x[:, i] = values and the like (None: a whole dim; F.fold's col2im exports so): the indexed dims moved
    to the front, the put there, moved back. The values take the shape of x[indices] as torch places the
    indexed dims (where the first one is when they are adjacent, else in front), reordered alike."""
    rank = x.type.rank
    where = [d for d, t in enumerate(indices) if t is not None]
    if not where or any(indices[d].dtype == "bool" for d in where):
        raise Unsupported("index_put of a boolean mask beside whole dims")
    rest = [d for d in range(rank) if d not in where]
    perm = where + rest
    _static(*x.shape, *[d for i in where for d in indices[i].shape])
    batch = list(np.broadcast_shapes(*[tuple(indices[d].shape) for d in where]))
    adjacent = where == list(range(where[0], where[-1] + 1))
    pre = [d for d in rest if adjacent and d < where[0]]
    post = [d for d in rest if d not in pre]
    shape = [x.shape[d] for d in pre] + batch + [x.shape[d] for d in post]      # x[indices]'s
    v = ctx.tensor(values, x.dtype)
    if tuple(v.shape) != tuple(shape):
        v = ctx.add("expand", [v], {"shape": shape})
    nb, npre = len(batch), len(pre)
    v_perm = list(range(npre, npre + nb)) + list(range(npre)) + list(range(npre + nb, len(shape)))
    if v_perm != list(range(len(shape))):
        v = ctx.add("transpose", [v], {"perm": v_perm})
    xt = ctx.add("transpose", [x], {"perm": perm})
    y = _index_put(ctx, xt, [indices[d] for d in where], v, accumulate)
    return ctx.add("transpose", [y], {"perm": list(np.argsort(perm))})


def _masked_put(ctx, x, mask, values, accumulate):
    """x[mask] = values (+=) where values is one value or one row of x's trailing dims: the same
    for every selected position, so a where, whatever the number of them."""
    trailing = list(x.shape[mask.type.rank:])
    v = ctx.tensor(values, x.dtype)
    shape = list(v.shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    if D.numel(v.shape) == 1:
        v = ctx.add("reshape", [v], {"shape": []})
    elif not trailing or shape != trailing:
        raise Unsupported("index_put of one value per selected position (data-dependent count)")
    m = ctx.add("reshape", [mask], {"shape": list(mask.shape) + [1] * len(trailing)})
    if accumulate:
        return ctx.add("add", [x, ctx.add("where", [m, v, ctx.tensor(0, x.dtype)])])
    return ctx.add("where", [m, v, x])


def _strided_positions(ctx, x, size, stride, storage_offset):
    """The flat positions of x's memory a strided view (size, stride, offset) reads."""
    src = ctx.node.args[0].meta.get("val")
    if src is None or not src.is_contiguous():
        raise Unsupported("as_strided of a tensor that is not contiguous in memory")
    _static(*x.shape, *size)
    pos = np.full(tuple(size), storage_offset or 0, np.int64)
    for axis, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = n
        pos = pos + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    numel = D.numel(x.shape)
    if pos.size and (pos.min() < 0 or pos.max() >= numel):
        raise Unsupported(f"as_strided reaching outside its source's {numel} elements")
    return pos


@handles(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(ctx, x, size, stride, storage_offset=None):
    """A strided view of a contiguous tensor's memory: one gather of the flat positions it reads."""
    return _gather_positions(ctx, x, _strided_positions(ctx, x, size, stride, storage_offset))


@handles(aten.as_strided_scatter.default)
def _as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
    return _scatter_positions(ctx, x, _strided_positions(ctx, x, size, stride, storage_offset), src)


def _scatter_positions(ctx, x, pos, src, indices=None, accumulate=False):
    """x with src written at flat (row-major) positions pos (a constant) or run-time `indices`."""
    numel = D.numel(x.shape)
    flat = ctx.add("reshape", [x], {"shape": [numel]})
    idx = indices if indices is not None else ctx.g.const(np.ascontiguousarray(pos, np.int64).reshape(-1))
    vals = ctx.add("reshape", [ctx.tensor(src, x.dtype)], {"shape": [D.numel(idx.shape)]})
    out = ctx.add("scatter_elements", [flat, idx, vals], {"axis": 0, "reduction": "add" if accumulate else "none"})
    return ctx.add("reshape", [out], {"shape": list(x.shape)})


@handles(aten.put.default)
def _put(ctx, x, index, source, accumulate=False):
    """x's flat elements at index (negative from the end) set to source (+= with accumulate)."""
    numel = D.numel(x.shape)
    _static(numel)
    idx = ctx.add("reshape", [index], {"shape": [D.numel(index.shape)]})
    idx = ctx.add("where", [ctx.add("lt", [idx, ctx.tensor(0, "int64")]),
                            ctx.add("add", [idx, ctx.tensor(numel, "int64")]), idx])
    return _scatter_positions(ctx, x, None, source, idx, accumulate)


@handles(aten.masked_scatter.default)
def _masked_scatter(ctx, x, mask, source):
    """The positions where mask is true (row-major) take source's elements in order: each reads
    source at its running count of trues, so the count need not be known ahead."""
    _static(*x.shape)
    m = mask if tuple(mask.shape) == tuple(x.shape) else ctx.add("expand", [mask], {"shape": list(x.shape)})
    numel = D.numel(x.shape)
    flat_m = ctx.add("reshape", [m], {"shape": [numel]})
    k = ctx.add("sub", [ctx.add("cumsum", [ctx.add("cast", [flat_m], {"to": "int64"})], {"axis": 0}),
                        ctx.tensor(1, "int64")])
    k = ctx.add("clip", [k], {"min": 0.0, "max": float(max(D.numel(source.shape) - 1, 0))})
    src = ctx.add("reshape", [source], {"shape": [D.numel(source.shape)]})
    taken = ctx.add("reshape", [ctx.add("gather", [src, k], {"axis": 0})], {"shape": list(x.shape)})
    return ctx.add("where", [m, taken, x])


@handles(aten.empty_permuted.default)
def _empty_permuted(ctx, size, physical_layout, **kw):
    return ctx.add("full", [], {"shape": [ctx.dim(d) for d in size], "value": 0, "dtype": _out_dtype(ctx)})


@handles(aten.histc.default)
def _histc(ctx, x, bins=100, min=0, max=0):
    """Counts of x in `bins` equal bins over [min, max] (the data's own range where min == max; a
    range of one value widened by 1 each way), values outside ignored, max in the last bin."""
    dt = x.dtype
    flat = ctx.add("reshape", [x], {"shape": [D.numel(x.shape)]})
    if min == max:
        lo = ctx.add("reduce_min", [flat], {"axes": [0], "keepdims": True})
        hi = ctx.add("reduce_max", [flat], {"axes": [0], "keepdims": True})
        same = ctx.add("eq", [lo, hi])
        one = ctx.tensor(1.0, dt)
        lo = ctx.add("where", [same, ctx.add("sub", [lo, one]), lo])
        hi = ctx.add("where", [same, ctx.add("add", [hi, one]), hi])
    else:
        lo, hi = ctx.tensor(float(min), dt), ctx.tensor(float(max), dt)
    width = ctx.add("sub", [hi, lo])
    pos = ctx.add("div", [ctx.add("mul", [ctx.add("sub", [flat, lo]), ctx.tensor(float(bins), dt)]), width])
    idx = ctx.add("cast", [ctx.add("floor", [pos])], {"to": "int64"})
    last = ctx.tensor(bins - 1, "int64")
    idx = ctx.add("where", [ctx.add("eq", [flat, hi]), last, idx])
    inside = ctx.add("and", [ctx.add("ge", [flat, lo]), ctx.add("le", [flat, hi])])
    idx = ctx.add("where", [inside, idx, ctx.tensor(bins, "int64")])        # outside: a spare bin
    counts = ctx.add("full", [], {"shape": [bins + 1], "value": 0, "dtype": dt})
    ones = ctx.add("full", [], {"shape": list(flat.shape), "value": 1, "dtype": dt})
    counts = ctx.add("scatter_elements", [counts, idx, ones], {"axis": 0, "reduction": "add"})
    return ctx.add("slice", [counts], {"axis": 0, "start": 0, "step": 1, "length": bins})


def _gather_positions(ctx, x, pos):
    """x's elements at flat (row-major) positions pos, shaped as pos: one gather."""
    numel = D.numel(x.shape)
    flat = ctx.add("reshape", [x], {"shape": [numel]})
    return ctx.add("gather", [flat, ctx.g.const(np.ascontiguousarray(pos, np.int64))], {"axis": 0})


@handles(aten.flip.default)
def _flip(ctx, x, dims):
    for d in dims:
        d %= x.type.rank
        n = x.shape[d]
        _static(n)
        x = ctx.add("slice", [x], {"axis": d, "start": n - 1, "step": -1, "length": n})
    return x


@handles(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    """The diagonal of dims dim1, dim2 (offset above it when positive) as a last axis."""
    _static(*x.shape)
    r = x.type.rank
    dim1, dim2 = dim1 % r, dim2 % r
    pos = np.arange(int(np.prod(x.shape)), dtype=np.int64).reshape(x.shape)
    return _gather_positions(ctx, x, np.diagonal(pos, offset, dim1, dim2))


@handles(aten.diagonal_scatter.default)
def _diagonal_scatter(ctx, x, src, offset=0, dim1=0, dim2=1):
    _static(*x.shape)
    r = x.type.rank
    pos = np.arange(int(np.prod(x.shape)), dtype=np.int64).reshape(x.shape)
    return _scatter_positions(ctx, x, np.diagonal(pos, offset, dim1 % r, dim2 % r), src)


@handles(aten.unfold.default)
def _unfold(ctx, x, dim, size, step):
    """Windows of `size` every `step` along dim: that dim counts the windows, a new last one the taps."""
    _static(*x.shape)
    if x.type.rank == 0:
        return ctx.add("reshape", [x], {"shape": [1]})
    pos = np.arange(int(np.prod(x.shape)), dtype=np.int64).reshape(x.shape)
    d = dim % x.type.rank
    starts = np.arange(0, x.shape[d] - size + 1, step)
    windows = np.stack([np.take(pos, starts + t, axis=d) for t in range(size)], axis=-1)
    return _gather_positions(ctx, x, windows)


SCATTER_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}
# include_self=False: the value a scattered-to place starts from
SCATTER_IDENTITY = {"sum": lambda dt: 0, "mean": lambda dt: 0, "prod": lambda dt: 1,
                    "amax": lambda dt: -np.inf if dt.kind == "f" else np.iinfo(dt).min,
                    "amin": lambda dt: np.inf if dt.kind == "f" else np.iinfo(dt).max}


@handles(aten.scatter_reduce.two, aten.scatter_add.default, aten.scatter.src, aten.scatter.value)
def _scatter_reduce(ctx, x, dim, index, src, reduce="sum", include_self=True):
    target = ctx.node.target
    if target == aten.scatter.value:
        src = ctx.add("full", [], {"shape": list(index.shape), "value": src, "dtype": x.dtype})
    red = ("add" if target == aten.scatter_add.default else "none" if target in (aten.scatter.src, aten.scatter.value)
           else "add" if reduce == "mean" else SCATTER_REDUCE.get(reduce))
    if red is None or (x.dtype == "bool" and (reduce == "mean" or not include_self)):
        raise Unsupported(f"scatter_reduce with reduce={reduce!r}, include_self={include_self} on {x.dtype}")
    if x.type.rank == 0:
        raise Unsupported("scatter into a 0-d tensor")
    src = ctx.tensor(src, x.dtype)
    if tuple(src.shape) != tuple(index.shape):          # src may be larger than index: its leading block
        src = _leading_block(ctx, src, index.shape)
    idx, attrs = ctx.tensor(index, "int64"), {"axis": dim % x.type.rank, "reduction": red}
    hit = count = None
    if not include_self or reduce == "mean":            # where src lands, and how often
        ones = ctx.add("full", [], {"shape": list(index.shape), "value": 1, "dtype": "int64"})
        zeros = ctx.add("full", [], {"shape": list(x.shape), "value": 0, "dtype": "int64"})
        count = ctx.add("scatter_elements", [zeros, idx, ones], dict(attrs, reduction="add"))
        hit = ctx.add("gt", [count, ctx.tensor(0, "int64")])
    start = x
    if not include_self:                                # those places start from the reduction's identity
        start = ctx.add("where", [hit, ctx.tensor(SCATTER_IDENTITY[reduce](np.dtype(x.dtype)), x.dtype), x])
    y = ctx.add("scatter_elements", [start, idx, src], attrs)
    if reduce != "mean":
        return y
    n = count if not include_self else ctx.add("add", [count, ctx.tensor(1, "int64")])
    n = ctx.add("cast", [ctx.add("where", [hit, n, ctx.tensor(1, "int64")])], {"to": x.dtype})
    floating = x.dtype.startswith(("float", "bfloat"))
    mean = ctx.add("div" if floating else "floordiv", [y, n])      # torch floors an integer mean
    return ctx.add("where", [hit, mean, x])


@handles(aten.index_reduce.default)
def _index_reduce(ctx, x, dim, index, source, reduce, include_self=True):
    """x's slices index[j] along dim reduced with source's slice j: a scatter_reduce with the index
    spread over source's shape."""
    if x.type.rank == 0:                                # a 0-d x (and source): as one element of a 1-d one
        one = lambda v: ctx.add("reshape", [v], {"shape": [1]})      # noqa: E731
        y = _index_reduce(ctx, one(x), 0, index, one(source), reduce, include_self)
        return ctx.add("reshape", [y], {"shape": []})
    dim %= x.type.rank
    shape = [1] * source.type.rank
    shape[dim] = index.shape[0]
    idx = ctx.add("expand", [ctx.add("reshape", [index], {"shape": shape})], {"shape": list(source.shape)})
    return _scatter_reduce(ctx, x, dim, idx, source, reduce, include_self)


def _leading_block(ctx, v, shape):
    for axis, n in enumerate(shape):
        if v.shape[axis] != n:
            v = ctx.add("slice", [v], {"axis": axis, "start": 0, "step": 1, "length": n})
    return v


@handles(aten.round.decimals)
def _round_decimals(ctx, x, decimals=0):
    """torch's rule: round half to even of x * 10^d, divided back (x / 10^-d, multiplied, for d < 0)."""
    if decimals >= 0:
        k = ctx.tensor(float(10 ** decimals), x.dtype)
        return ctx.add("div", [ctx.add("round", [ctx.add("mul", [x, k])]), k])
    k = ctx.tensor(float(10 ** -decimals), x.dtype)
    return ctx.add("mul", [ctx.add("round", [ctx.add("div", [x, k])]), k])


EMBEDDING_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}
BAG_COMPARES_MAX = 1 << 26


@handles(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def _embedding_bag(ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """(bags [B, D], each index's bag, each bag's size, the max's rows): the rows of weight at indices,
    times per_sample_weights, summed / averaged / maxed per bag (a row of 2-d indices, or the run from
    each offset of 1-d ones); padding_idx entries left out; an empty bag is zeros. The max mode's row
    indices (for the gradient) are not computed."""
    from .aten import _count_below
    _static(*weight.shape, *indices.shape, *offsets.shape)
    if mode not in EMBEDDING_BAG_MODES:
        raise Unsupported(f"embedding_bag mode {mode!r}")
    if 3 in outputs_read(ctx):
        raise Unsupported("embedding_bag's max indices (its gradient's)")
    if indices.type.rank == 1 and D.numel(indices.shape) * offsets.shape[0] > BAG_COMPARES_MAX:
        raise Unsupported(f"embedding_bag over {D.numel(indices.shape)} indices in {offsets.shape[0]} bags "
                          f"(each index's bag is found by comparing it with every offset: up to {BAG_COMPARES_MAX})")
    reduce = EMBEDDING_BAG_MODES[mode]
    rows, dim = weight.shape
    flat = ctx.add("reshape", [indices], {"shape": [D.numel(indices.shape)]})
    n = flat.shape[0]
    if indices.type.rank == 2:
        bags, per = indices.shape
        bag = ctx.g.const(np.repeat(np.arange(bags, dtype=np.int64), per))
    else:
        starts = _slice_of(ctx, offsets, offsets.shape[0] - 1) if include_last_offset else offsets
        bags = starts.shape[0]
        bag = ctx.add("sub", [_count_below(ctx, ctx.tensor(starts, "int64"), ctx.g.const(np.arange(n, dtype=np.int64)),
                                           True, False), ctx.scalar(1, "int64")])
    flat = ctx.tensor(flat, "int64")
    keep = ctx.g.const(np.ones(n, bool)) if padding_idx is None or padding_idx < 0 else \
        ctx.add("ne", [flat, ctx.scalar(padding_idx, "int64")])
    bag = ctx.add("where", [keep, bag, ctx.scalar(bags, "int64")])        # a left-out entry goes to a spare bag
    vals = ctx.add("gather", [weight, flat], {"axis": 0})                  # [n, D]
    if per_sample_weights is not None:
        w = ctx.add("reshape", [per_sample_weights], {"shape": [n, 1]})
        vals = ctx.add("mul", [vals, ctx.tensor(w, weight.dtype)])
    target = ctx.add("expand", [ctx.add("reshape", [bag], {"shape": [n, 1]})], {"shape": [n, dim]})
    start = np.full((bags + 1, dim), -np.inf if reduce == "max" else 0, weight.dtype)
    out = ctx.add("scatter_elements", [ctx.g.const(start), target, vals], {"axis": 0, "reduction":
                                                                           "max" if reduce == "max" else "add"})
    out = _slice_of(ctx, out, bags)
    size = ctx.add("scatter_elements", [ctx.g.const(np.zeros(bags + 1, np.int64)), bag,
                                        ctx.add("cast", [keep], {"to": "int64"})], {"axis": 0, "reduction": "add"})
    size = _slice_of(ctx, size, bags)
    if reduce == "mean":
        count = ctx.add("max", [ctx.add("cast", [size], {"to": weight.dtype}), ctx.scalar(1, weight.dtype)])
        out = ctx.add("div", [out, ctx.add("reshape", [count], {"shape": [bags, 1]})])
    elif reduce == "max":
        empty = ctx.add("reshape", [ctx.add("eq", [size, ctx.scalar(0, "int64")])], {"shape": [bags, 1]})
        out = ctx.add("where", [empty, ctx.scalar(0, weight.dtype), out])
    return out, bag, size, ctx.g.const(np.zeros(bags, np.int64))


def _slice_of(ctx, x, length):
    """x's first `length` entries along axis 0."""
    return ctx.add("slice", [x], {"axis": 0, "start": 0, "step": 1, "length": length})


@handles(aten.nonzero_static.default)
def _nonzero_static(ctx, x, *, size, fill_value=-1):
    """The coordinates of x's first `size` nonzero elements in row-major order, [size, rank], the rows
    past their count filled with fill_value: each nonzero element's rank among them (a running count)
    picks its row, the others go to a spare row."""
    _static(*x.shape)
    numel, rank = D.numel(x.shape), x.type.rank
    if rank == 0 or size == 0:                 # no coordinates, or no rows: nothing to compute
        return ctx.g.const(np.full((size, rank), fill_value, np.int64))
    flat = ctx.add("reshape", [x], {"shape": [numel]})
    hit = ctx.add("ne", [flat, ctx.tensor(0, x.dtype)]) if x.dtype != "bool" else flat
    order = ctx.add("sub", [ctx.add("cumsum", [ctx.add("cast", [hit], {"to": "int64"})], {"axis": 0}),
                            ctx.scalar(1, "int64")])
    row = ctx.add("where", [ctx.add("and", [hit, ctx.add("lt", [order, ctx.scalar(size, "int64")])]), order,
                            ctx.scalar(size, "int64")])
    coords = np.stack(np.unravel_index(np.arange(numel), x.shape), axis=1).astype(np.int64).reshape(numel, rank)
    target = ctx.add("expand", [ctx.add("reshape", [row], {"shape": [numel, 1]})], {"shape": [numel, rank]})
    out = ctx.g.const(np.full((size + 1, rank), fill_value, np.int64))
    out = ctx.add("scatter_elements", [out, target, ctx.g.const(coords)], {"axis": 0, "reduction": "none"})
    return _slice_of(ctx, out, size)


def _linspace(ctx, lo, hi, steps, dt):
    """torch.linspace(lo, hi, steps) of run-time ends, with torch's rounding: the first half stepped
    from lo, the second back from hi."""
    i = np.arange(steps, dtype=np.float64)
    step = ctx.add("div", [ctx.add("sub", [hi, lo]), ctx.tensor(float(max(steps - 1, 1)), dt)])
    up = ctx.add("add", [lo, ctx.add("mul", [ctx.g.const(i.astype(dt)), step])])
    down = ctx.add("sub", [hi, ctx.add("mul", [ctx.g.const((steps - 1 - i).astype(dt)), step])])
    return ctx.add("where", [ctx.g.const(i < steps // 2), up, down])


def _edges(ctx, vals, bins, lohi):
    """bins + 1 edges over lohi (a pair of numbers) or over the values' own [min, max] (a single value
    widened by 0.5 each way), with torch's linspace rounding; a tensor of edges is taken as it is."""
    dt = vals.dtype
    if not isinstance(bins, int):
        _static(*bins.shape)
        return ctx.tensor(bins, dt), bins.shape[0] - 1
    if lohi is not None:
        lo, hi = ctx.tensor(float(lohi[0]), dt), ctx.tensor(float(lohi[1]), dt)
    else:
        lo = ctx.add("reduce_min", [vals], {"axes": [0], "keepdims": False})
        hi = ctx.add("reduce_max", [vals], {"axes": [0], "keepdims": False})
        same, half = ctx.add("eq", [lo, hi]), ctx.tensor(0.5, dt)
        lo = ctx.add("where", [same, ctx.add("sub", [lo, half]), lo])
        hi = ctx.add("where", [same, ctx.add("add", [hi, half]), hi])
    return _linspace(ctx, lo, hi, bins + 1, dt), bins


def _bin_of(ctx, vals, edges, n):
    """(each value's bin: edges[i] <= v < edges[i + 1], the last bin closed; whether it is inside)."""
    from .aten import _count_below
    first, last = (ctx.add("slice", [edges], {"axis": 0, "start": k, "step": 1, "length": 1}) for k in (0, n))
    idx = ctx.add("sub", [_count_below(ctx, edges, vals, True, False), ctx.scalar(1, "int64")])
    idx = ctx.add("where", [ctx.add("eq", [vals, last]), ctx.scalar(n - 1, "int64"), idx])
    return idx, ctx.add("and", [ctx.add("ge", [vals, first]), ctx.add("le", [vals, last])])


def _widths(ctx, edges, n):
    return ctx.add("sub", [ctx.add("slice", [edges], {"axis": 0, "start": 1, "step": 1, "length": n}),
                           _slice_of(ctx, edges, n)])


def _tally(ctx, idx, inside, weight, cells, dt, shape):
    """Counts (or summed weights) per cell; values outside go to a spare cell that is dropped."""
    idx = ctx.add("where", [inside, idx, ctx.scalar(cells, "int64")])
    w = ctx.add("reshape", [ctx.tensor(weight, dt)], {"shape": list(idx.shape)}) if weight is not None else \
        ctx.add("full", [], {"shape": list(idx.shape), "value": 1, "dtype": dt})
    hist = ctx.add("scatter_elements", [ctx.g.const(np.zeros(cells + 1, dt)), idx, w], {"axis": 0, "reduction": "add"})
    return ctx.add("reshape", [_slice_of(ctx, hist, cells)], {"shape": shape})


@handles(aten.histogram.bin_ct, aten.histogram.bins_tensor)
def _histogram(ctx, x, bins, *, range=None, weight=None, density=False):
    """(hist, bin_edges): counts (or summed weights) of x in the bins, values outside ignored; density
    divides by the total and the bins' widths."""
    _static(*x.shape)
    flat = ctx.add("reshape", [x], {"shape": [D.numel(x.shape)]})
    edges, n = _edges(ctx, flat, bins, range)
    idx, inside = _bin_of(ctx, flat, edges, n)
    hist = _tally(ctx, idx, inside, weight, n, x.dtype, [n])
    if density:
        total = ctx.add("reduce_sum", [hist], {"axes": [0], "keepdims": True})
        hist = ctx.add("div", [hist, ctx.add("mul", [total, _widths(ctx, edges, n)])])
    return hist, edges


def _histogramdd_edges(ctx, x, bins, range):
    """Per dim of x [..., D]: (its values [N], its edges, its bin count)."""
    _static(*x.shape)
    dims = x.shape[-1]
    rows = ctx.add("reshape", [x], {"shape": [D.numel(x.shape) // max(dims, 1), dims]})
    out = []
    for d in builtins_range(dims):
        col = ctx.add("slice", [rows], {"axis": 1, "start": d, "step": 1, "length": 1})
        col = ctx.add("reshape", [col], {"shape": [rows.shape[0]]})
        b = bins[d] if isinstance(bins, (list, tuple)) else bins
        lohi = None if range is None else (range[2 * d], range[2 * d + 1])
        out.append((col, *_edges(ctx, col, b, lohi)))
    return out


@handles(aten._histogramdd_bin_edges.default)
def _histogramdd_bin_edges(ctx, x, bins, range=None, weight=None, density=False):
    return [e for _, e, _ in _histogramdd_edges(ctx, x, bins, range)]


@handles(aten._histogramdd_from_bin_cts.default, aten._histogramdd_from_bin_tensors.default)
def _histogramdd(ctx, x, bins, range=None, weight=None, density=False):
    """The D-dimensional histogram of x's rows: each row's cell is its bins' row-major index."""
    per_dim = _histogramdd_edges(ctx, x, bins, range)
    sizes = [n for _, _, n in per_dim]
    cell, inside, stride = None, None, 1
    for col, edges, n in reversed(per_dim):
        idx, ok = _bin_of(ctx, col, edges, n)
        term = idx if stride == 1 else ctx.add("mul", [idx, ctx.scalar(stride, "int64")])
        cell = term if cell is None else ctx.add("add", [cell, term])
        inside = ok if inside is None else ctx.add("and", [inside, ok])
        stride *= n
    hist = _tally(ctx, cell, inside, weight, stride, x.dtype, sizes)
    if density:
        volume = None
        for k, (_, edges, n) in enumerate(per_dim):
            shape = [1] * len(sizes)
            shape[k] = n
            w = ctx.add("reshape", [_widths(ctx, edges, n)], {"shape": shape})
            volume = w if volume is None else ctx.add("mul", [volume, w])
        total = ctx.add("reduce_sum", [hist], {"axes": list(builtins_range(len(sizes))), "keepdims": True})
        hist = ctx.add("div", [hist, ctx.add("mul", [total, volume])])
    return hist


builtins_range = range


SEGMENT_REDUCE = {"sum": "add", "mean": "add", "prod": "mul", "max": "max", "min": "min"}
SEGMENT_EMPTY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}


@handles(aten.segment_reduce.default)
def _segment_reduce(ctx, data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Consecutive segments of data along axis 0 reduced: each element's segment (how many segment
    ends lie at or before it) scatters it into its row, which starts from `initial` (or the
    reduction's identity: what an empty segment keeps; an empty mean is NaN without an initial)."""
    if reduce not in SEGMENT_REDUCE or indices is not None or (lengths is None) == (offsets is None):
        raise Unsupported(f"segment_reduce with reduce={reduce!r} and these segment arguments")
    if axis % data.type.rank != 0 or (lengths if lengths is not None else offsets).type.rank != 1:
        raise Unsupported("segment_reduce along an axis other than 0")
    if initial is None and not data.dtype.startswith("float") and reduce in ("max", "min"):
        raise Unsupported("segment_reduce max / min of integers without an initial value")
    if offsets is not None:
        nseg = offsets.shape[0] - 1
        ends = ctx.add("slice", [offsets], {"axis": 0, "start": 1, "step": 1, "length": nseg})
        lengths = ctx.add("sub", [ends, _slice_of(ctx, offsets, nseg)])
        first = ctx.add("slice", [offsets], {"axis": 0, "start": 0, "step": 1, "length": 1})
    else:
        nseg = lengths.shape[0]
        ends = ctx.add("cumsum", [lengths], {"axis": 0})
        first = ctx.tensor(0, ends.dtype)
    n, inner = data.shape[0], list(data.shape[1:])
    if nseg == 0:
        return ctx.add("full", [], {"shape": [0] + inner, "value": 0, "dtype": data.dtype})
    pos = ctx.add("iota", [], {"length": n, "start": 0, "step": 1, "dtype": ends.dtype})
    col = ctx.add("reshape", [pos], {"shape": [n, 1]})
    seg = ctx.add("reduce_sum", [ctx.add("cast", [ctx.add("le", [ends, col])], {"to": "int64"})],
                  {"axes": [1], "keepdims": False})                      # [n]: the segment of each element
    last = ctx.add("slice", [ends], {"axis": 0, "start": nseg - 1, "step": 1, "length": 1})
    inside = ctx.add("and", [ctx.add("ge", [pos, first]), ctx.add("lt", [pos, last])])
    seg = ctx.add("where", [inside, seg, ctx.tensor(nseg, "int64")])       # outside every segment: a spare row
    seg = ctx.add("reshape", [seg], {"shape": [n] + [1] * len(inner)})
    seg = ctx.add("expand", [seg], {"shape": list(data.shape)})
    start = SEGMENT_EMPTY[reduce] if initial is None else float(initial)
    rows = ctx.add("full", [], {"shape": [nseg + 1] + inner, "value": start, "dtype": data.dtype})
    y = ctx.add("scatter_elements", [rows, seg, data], {"axis": 0, "reduction": SEGMENT_REDUCE[reduce]})
    y = _slice_of(ctx, y, nseg)
    if reduce in ("max", "min") and data.dtype.startswith("float"):   # the scatter's compare skips NaN; torch keeps it
        nan = ctx.add("cast", [ctx.add("isnan", [data])], {"to": data.dtype})
        zeros = ctx.add("full", [], {"shape": [nseg + 1] + inner, "value": 0, "dtype": data.dtype})
        hits = ctx.add("scatter_elements", [zeros, seg, nan], {"axis": 0, "reduction": "add"})
        y = ctx.add("where", [ctx.add("gt", [_slice_of(ctx, hits, nseg), ctx.tensor(0.0, data.dtype)]),
                              ctx.tensor(float("nan"), data.dtype), y])
    if reduce != "mean":
        return y
    count = ctx.add("reshape", [ctx.add("cast", [lengths], {"to": data.dtype})], {"shape": [nseg] + [1] * len(inner)})
    mean = ctx.add("div", [y, count])
    if initial is None:
        return mean
    return ctx.add("where", [ctx.add("eq", [count, ctx.tensor(0.0, data.dtype)]), ctx.tensor(float(initial), data.dtype),
                             mean])
