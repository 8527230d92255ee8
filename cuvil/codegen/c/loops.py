"""Strided loop nests: the one generator behind every pointwise op, copy, transpose, expand,
slice and concat. Dims are collapsed where every operand is contiguous across them, so the
innermost loop has constant strides and the C compiler vectorizes it."""
from __future__ import annotations

from ...ir import dims as D

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


def loop_nest(shape, out, ins, expr, nthreads="NT", parallel=True):
    """C lines for: out[idx] = expr(in_k[idx]) over `shape`.

    out: (pointer C expr, strides, base offset C expr); ins: list of the same;
    expr: callable taking the list of input element C exprs and returning the value C expr."""
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
    lines = ["{"]
    total = " * ".join(f"(int64_t)({D.to_c(d)})" for d in shape)
    if parallel and _may_be_large(shape):
        if rank == 1:   # split a flat loop into blocks so the inner one still vectorizes
            n = D.to_c(shape[0])
            lines += [f"  #pragma omp parallel for num_threads({nthreads}) schedule(static) if ({total} > {PARALLEL_MIN})",
                      f"  for (int64_t b0 = 0; b0 < {n}; b0 += 4096)",
                      f"    for (int64_t i0 = b0; i0 < ({n} < b0 + 4096 ? {n} : b0 + 4096); i0++) {store}",
                      "}"]
            return lines
        clause = f" collapse({rank - 1})" if rank > 2 else ""
        lines.append(f"  #pragma omp parallel for{clause} num_threads({nthreads}) schedule(static) "
                     f"if ({total} > {PARALLEL_MIN})")
    for k, d in enumerate(shape):
        lines.append("  " * (k + 1) + f"for (int64_t {idx[k]} = 0; {idx[k]} < {D.to_c(d)}; {idx[k]}++)")
    lines.append("  " * (rank + 1) + store)
    lines.append("}")
    return lines


def _may_be_large(shape):
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return True
        n *= d
    return n > PARALLEL_MIN
