"""Strided loop nests: the one generator behind every pointwise op, copy, transpose, expand,
slice and concat. Dims are collapsed where every operand is contiguous across them, so the
innermost loop has constant strides and the C compiler vectorizes it."""
from __future__ import annotations

from ...ir import dims as D
from ...ir.ops.movement import layout_block
from . import cexpr

PARALLEL_MIN = 32768   # elements below which a loop nest stays on one thread


def contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc = D.as_dim(acc * d)
    return list(reversed(strides))


def broadcast_strides(in_shape, out_shape):
    """Strides of an input read at output indices (0 along broadcast dims)."""
    pad = len(out_shape) - len(in_shape)
    st = contiguous_strides(in_shape)
    out = [0] * pad
    for d, o, s in zip(in_shape, out_shape[pad:], st):
        out.append(0 if (isinstance(d, int) and d == 1 and not (isinstance(o, int) and o == 1)) else s)
    return out


def stored_shape(v):
    """The shape v's elements are stored in: its own, or [N, C/B, H, W, B] in a blocked layout."""
    block = layout_block(v.layout)
    if not block:
        return list(v.type.shape)
    n, c, h, w = v.type.shape
    return [n, c // block, h, w, block]


def operand_strides(v, out):
    """Strides of operand v read at the stored indices of the pointwise output `out`: broadcast_strides
    where out is NCHW; where it is blocked, v is out's shape (and layout), one value per channel
    ([N or 1, C, 1, 1], the same bytes in any layout: channel cb * B + b) or a single element."""
    block = layout_block(out.layout)
    if not block:
        return broadcast_strides(v.type.shape, out.type.shape)
    if tuple(v.type.shape) == tuple(out.type.shape):
        assert v.layout == out.layout or out.type.shape[2] == out.type.shape[3] == 1, (v, out)
        return contiguous_strides(stored_shape(out))
    shape = (1,) * (4 - v.type.rank) + tuple(v.type.shape)
    if all(d == 1 for d in shape):
        return [0] * 5
    assert shape[1] == out.type.shape[1] and shape[2] == shape[3] == 1, (v, out)
    return [shape[1] if shape[0] != 1 else 0, block, 0, 0, 1]


def _collapse(shape, stride_sets):
    shape = list(shape)
    sets = [list(s) for s in stride_sets]
    keep = [i for i, d in enumerate(shape) if not (isinstance(d, int) and d == 1)]
    shape = [shape[i] for i in keep]
    sets = [[s[i] for i in keep] for s in sets]
    i = len(shape) - 2
    while i >= 0:
        if all(D.dims_equal(s[i], D.as_dim(s[i + 1] * shape[i + 1])) for s in sets):
            shape[i] = D.as_dim(shape[i] * shape[i + 1])
            for s in sets:
                s[i] = s[i + 1]
                del s[i + 1]
            del shape[i + 1]
        i -= 1
    return shape, sets


def loop_nest(shape, out, ins, expr, outline=None):
    """C lines for: out[idx] = expr(in_k[idx]) over `shape`.

    out: (pointer C expr, strides, base offset C expr); ins: list of the same;
    expr: callable taking the list of input element C exprs and returning the value C expr;
    outline: Emitter.parallel, to run large nests on the thread pool (None: one thread)."""
    shape, sets = _collapse(shape, [out[1]] + [i[1] for i in ins])
    rank = len(shape)
    idx = [f"i{k}" for k in range(rank)]

    def offset(base, strides):
        terms = [base] if base not in ("0", 0) else []
        for v, s in zip(idx, strides):
            if s == 0:
                continue
            terms.append(v if s == 1 else f"{v} * {D.to_c(s)}")
        return " + ".join(terms) or "0"

    loads = [f"{p}[{offset(b, s)}]" for (p, _, b), s in zip(ins, sets[1:])]
    store = f"{out[0]}[{offset(out[2], sets[0])}] = {expr(loads)};"
    if rank == 0:
        return ["{ " + store + " }"]
    total = cexpr.prod(shape)
    inner = D.to_c(shape[-1])
    if outline is not None and _may_be_large(shape):
        if rank == 1:   # blocks of a flat loop, so the inner one still vectorizes
            body = [f"for (int64_t i0 = blk * 4096; i0 < ({inner} < (blk + 1) * 4096 ? {inner} : (blk + 1) * 4096); "
                    f"i0++) {store}"]
            return outline("blk", f"({inner} + 4095) / 4096", total, body)
        # the leading outer dims flattened into one parallel index, enough of them for PARALLEL_TASKS
        # tasks; the dims after them looped inside each task (a blocked map's [C/B, H*W, B] had been
        # split per pixel, a division and a modulo for every 8 elements)
        outer = shape[:-1]
        par = next((k for k in range(1, len(outer) + 1) if _at_least(outer[:k], PARALLEL_TASKS)), len(outer))
        # the last flattened dim in runs of ROW_CHUNK: one division per run, not per row (a blocked map's
        # [C/B, H*W, B] scaled per channel had spent one on every 16 floats: a float a cycle)
        last = outer[par - 1]
        runs = -(-last // ROW_CHUNK) if par >= 2 and isinstance(last, int) and last > ROW_CHUNK else None
        dims = list(outer[:par - 1]) + [runs if runs else last]
        body, rest = [], "q"
        for k in range(par - 1, -1, -1):
            d = D.to_c(dims[k])
            name = "r_" if runs and k == par - 1 else idx[k]
            body.append(f"const int64_t {name} = {rest} % ({d});" if k else f"const int64_t {name} = {rest};")
            rest = f"({rest} / ({d}))"
        depth = 0
        if runs:
            k = par - 1
            body.append(f"for (int64_t {idx[k]} = r_ * {ROW_CHUNK}; {idx[k]} < (r_ + 1) * {ROW_CHUNK} && {idx[k]} < {last}; "
                        f"{idx[k]}++)")
            depth = 1
        for k in range(par, rank):
            if k == rank - 1:
                body.append("  " * (k - par + depth) + IVDEP)
            body.append("  " * (k - par + depth) + f"for (int64_t {idx[k]} = 0; {idx[k]} < {D.to_c(shape[k])}; {idx[k]}++)")
        body.append("  " * (rank - par + depth) + store)
        return outline("q", cexpr.prod(dims), total, body)
    lines = ["{"]
    for k, d in enumerate(shape):
        if k == rank - 1:
            lines.append("  " * (k + 1) + IVDEP)
        lines.append("  " * (k + 1) + f"for (int64_t {idx[k]} = 0; {idx[k]} < {D.to_c(d)}; {idx[k]}++)")
    lines.append("  " * (rank + 1) + store)
    lines.append("}")
    return lines


PARALLEL_TASKS = 64    # parallel iterations a loop nest's outlined task splits into, at least
ROW_CHUNK = 32         # rows of the last flattened dim a parallel iteration runs (loop_nest)
# the innermost loop of a nest, vectorized as it is: its operands and output are distinct buffers or the same
# element (an op in place), which GCC cannot prove of offsets from one arena pointer, and left to itself it
# vectorized the loop around it instead (a blocked map times its channels' gates, 16 floats a row, by
# permutes: 21.7 -> 8.6 us for 9 x 784 rows in a C harness)
IVDEP = "#pragma omp simd"


def _at_least(dims, n):
    """Whether the product of dims is at least n (a dynamic dim counts as large)."""
    p = 1
    for d in dims:
        if not isinstance(d, int):
            return True
        p *= d
    return p >= n


def _may_be_large(shape):
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return True
        n *= d
    return n > PARALLEL_MIN
