"""ATen ops whose output size depends on the input's values -> IR: nonzero / argwhere, boolean-mask
indexing (x[mask]), masked_select, unique and unique_consecutive.

torch.export names such a size with an unbacked symbol (u0) bounded by the input's size. Each op here
computes a result padded to that bound plus the count, and `bind_dim` cuts it to the count: from there
on u0 is a run-time dim like a dynamic input dim (kernels loop to it, buffers are planned at its bound),
and the runtime returns each output at the size the run computed (manifest "data_dims")."""
from __future__ import annotations

import operator

import numpy as np

from ..ir import dims as D
from . import data_sized
from .aten import HANDLERS, Unsupported, aten, handles, static_sizes


_static = static_sizes("a data-dependent size over a symbolic input size")


def _flat(ctx, x):
    return ctx.add("reshape", [x], {"shape": [D.numel(list(x.shape))]})


def _compact(ctx, hit):
    return data_sized.compact(ctx.add, ctx.g.const, hit)


def _bind(ctx, padded, count, axis, output=None):
    """padded cut to count along axis, that dim the node's own data-dependent symbol (of its output
    number `output` where it has several)."""
    val = ctx.node.meta["val"] if output is None else ctx.node.meta["val"][output]
    return bind_to(ctx, padded, count, axis, ctx.dim(val.shape[axis]))


def bind_to(ctx, padded, count, axis, sym):
    if isinstance(sym, int):                 # export knew the size (an empty input): no symbol to bind
        return ctx.add("slice", [padded], {"axis": axis, "start": 0, "step": 1, "length": sym})
    if not getattr(sym, "is_Symbol", False):
        raise Unsupported(f"a data-dependent size {sym} that is not a plain symbol")
    # the bound is the padded size, not export's range for the symbol (it can be short: masked_select's
    # is the mask's own size when the mask broadcasts against x)
    return data_sized.bind(ctx.add, ctx.g, padded, count, axis, sym.name)


def _hits(ctx, x):
    return ctx.add("ne", [x, ctx.tensor(0, x.dtype)]) if x.dtype != "bool" else x


@handles(aten.nonzero.default, aten.argwhere.default)
def _nonzero(ctx, x):
    """The coordinates of x's nonzero elements in row-major order, [count, rank]."""
    _static(*x.shape)
    numel, rank = D.numel(list(x.shape)), x.type.rank
    if numel == 0:
        return _bind(ctx, ctx.g.const(np.zeros((0, rank), np.int64)), ctx.g.const(np.zeros((), np.int64)), 0)
    pos, count = _compact(ctx, _hits(ctx, _flat(ctx, x)))
    if rank == 0:                   # one row of no coordinates, or none
        return _bind(ctx, ctx.g.const(np.zeros((1, 0), np.int64)), count, 0)
    coords = np.stack(np.unravel_index(np.arange(numel), x.shape), axis=1).astype(np.int64)
    return _bind(ctx, ctx.add("gather", [ctx.g.const(coords), pos], {"axis": 0}), count, 0)


_index_plain = HANDLERS[aten.index.Tensor]


@handles(aten.index.Tensor)
def _index(ctx, x, indices):
    """x[mask] (a boolean index over consecutive dims): the masked entries in order; other index
    tensors as aten.py gathers them."""
    masks = [k for k, t in enumerate(indices) if t is not None and t.dtype == "bool"]
    if not masks:
        return _index_plain(ctx, x, indices)
    if len([t for t in indices if t is not None]) != 1:
        raise Unsupported("a boolean mask mixed with other index tensors")
    p, mask = masks[0], indices[masks[0]]
    _static(*mask.shape, *x.shape)
    n = D.numel(list(mask.shape))
    flat = ctx.add("reshape", [x], {"shape": [*x.shape[:p], n, *x.shape[p + mask.type.rank:]]})
    pos, count = _compact(ctx, _flat(ctx, mask))
    return _bind(ctx, ctx.add("gather", [flat, pos], {"axis": p}), count, p)


@handles(aten.masked_select.default)
def _masked_select(ctx, x, mask):
    shape = [ctx.dim(d) for d in np.broadcast_shapes(tuple(x.shape), tuple(mask.shape))]
    _static(*shape)
    x, mask = (v if list(v.shape) == shape else ctx.add("expand", [v], {"shape": shape}) for v in (x, mask))
    pos, count = _compact(ctx, _flat(ctx, mask))
    return _bind(ctx, ctx.add("gather", [_flat(ctx, x), pos], {"axis": 0}), count, 0)


def _unique_of(ctx, vals, n, order, return_inverse, return_counts, shape):
    """The distinct runs of vals [n] (sorted or consecutive), their inverse (at the original positions:
    `order` maps sorted -> original, None when unsorted) and counts."""
    first, run = data_sized.runs(ctx.add, ctx.g.const, vals)
    pos, count = _compact(ctx, first)
    values = _bind(ctx, ctx.add("gather", [vals, pos], {"axis": 0}), count, 0, output=0)
    sym = values.shape[0]
    inverse = counts = None
    if return_inverse:
        inv = run if order is None else ctx.add("scatter_elements", [run, order, run], {"axis": 0, "reduction": "none"})
        inverse = ctx.add("reshape", [inv], {"shape": shape})
    if return_counts:
        zeros, ones = ctx.g.const(np.zeros(n, np.int64)), ctx.g.const(np.ones(n, np.int64))
        tally = ctx.add("scatter_elements", [zeros, run, ones], {"axis": 0, "reduction": "add"})
        counts = bind_to(ctx, tally, count, 0, sym)
    return values, inverse, counts


def _with_empties(ctx, values, inverse, counts):
    """unique's three outputs, the ones not asked for as torch gives them (empty int64 tensors)."""
    return values, *(v if v is not None else ctx.g.const(np.zeros(0, np.int64)) for v in (inverse, counts))


@handles(aten._unique2.default)
def _unique2(ctx, x, sorted=True, return_inverse=False, return_counts=False):
    """Sorted distinct values (torch's CPU unique sorts even when asked not to)."""
    _static(*x.shape)
    n = D.numel(list(x.shape))
    if n == 0:
        raise Unsupported("unique of an empty tensor")
    flat = _flat(ctx, x)
    vals, order = ctx.add("topk", [flat], {"k": n, "axis": 0, "largest": False, "sorted": True})
    values, inverse, counts = _unique_of(ctx, vals, n, order, return_inverse, return_counts, list(x.shape))
    return _with_empties(ctx, values, inverse, counts)


@handles(aten.unique_consecutive.default)
def _unique_consecutive(ctx, x, return_inverse=False, return_counts=False, dim=None):
    if dim is not None and x.type.rank > 1:
        raise Unsupported("unique_consecutive along a dim")
    _static(*x.shape)
    n = D.numel(list(x.shape))
    if n == 0:
        raise Unsupported("unique_consecutive of an empty tensor")
    values, inverse, counts = _unique_of(ctx, _flat(ctx, x), n, None, return_inverse, return_counts, list(x.shape))
    return _with_empties(ctx, values, inverse, counts)


# the range checks torch.export puts on an unbacked size (u0 >= 0, u0 <= n): true by construction here
SIZE_CHECKS = (operator.ge, operator.le, operator.gt, operator.lt, operator.eq, operator.ne)


def is_size_check(node) -> bool:
    return node.target in SIZE_CHECKS and node.users and all(
        u.target is aten._assert_scalar.default for u in node.users)

