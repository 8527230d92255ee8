"""C lowering of reductions, arg-reductions, cumulative sums and products, and top-k."""
from __future__ import annotations

import re

from ...ir import dims as D
from . import cexpr
from .ctypes_map import CTYPE, is_float
from .emit import lowering
from .loops import stored_shape

_IDENTITY_F = {"reduce_sum": "0", "reduce_mean": "0", "reduce_prod": "1", "reduce_max": "-INFINITY",
               "reduce_min": "INFINITY"}
_IDENTITY_I = {"reduce_sum": "0", "reduce_mean": "0", "reduce_prod": "1"}
_INT_LIMITS = {"int64_t": ("INT64_MIN", "INT64_MAX"), "int32_t": ("INT32_MIN", "INT32_MAX"),
               "int16_t": ("INT16_MIN", "INT16_MAX"), "int8_t": ("INT8_MIN", "INT8_MAX"), "uint8_t": ("0", "255"),
               "uint16_t": ("0", "UINT16_MAX"), "uint32_t": ("0", "UINT32_MAX"), "uint64_t": ("0", "UINT64_MAX")}


def _combine(op, acc, x):
    if op in ("reduce_sum", "reduce_mean"):
        return f"{acc} += {x};"
    if op == "reduce_prod":
        return f"{acc} *= {x};"
    cmp = ">" if op == "reduce_max" else "<"
    return f"{{ __typeof__({acc}) v_ = {x}; if (v_ {cmp} {acc} || v_ != v_) {acc} = v_; }}"


def _blocks(shape, axes):
    """Merge adjacent dims of the same kind: [(size, reduced?)] (size-1 dims dropped)."""
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, int) and d == 1:
            continue
        red = i in axes
        if out and out[-1][1] == red:
            out[-1] = (D.as_dim(out[-1][0] * d), red)
        else:
            out.append((d, red))
    return out


PARTS = 4          # partial accumulator rows of _kept_lanes' loop: an add's latency over, a load per cycle
MAX_LANES = 64     # the widest kept inner dim that loop takes (a blocked map's block is 4, 8 or 16)


def _kept_lanes(blocks, op, x) -> int:
    """The kept innermost dim's size where a reduction over the dim before it runs in lanes (0: not)."""
    if len(blocks) < 2 or blocks[-1][1] or not blocks[-2][1] or not is_float(x.dtype) or op == "reduce_prod":
        return 0
    lanes = blocks[-1][0]
    return lanes if isinstance(lanes, int) and lanes <= MAX_LANES else 0


@lowering("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod")
def lower_reduce(em, node):
    x, y, op = node.inputs[0], node.outputs[0], node.op
    t = CTYPE[x.dtype]
    ident = (_IDENTITY_F if is_float(x.dtype) else _IDENTITY_I).get(op)
    if ident is None:
        lo, hi = _INT_LIMITS[t] if x.dtype != "bool" else ("0", "1")   # bool: any / all, stored as 0 or 1
        ident = lo if op == "reduce_max" else hi
    acc_t = "double" if is_float(x.dtype) and op in ("reduce_sum", "reduce_mean") else t
    # a blocked map (passes/layout.py: reads_in_place) reduced over its stored [N, C/B, H, W, B], the
    # channel axis being both C/B and B: over (H, W) the kept n, cb and b run in the output's order
    shape, axes = stored_shape(x), {a % x.type.rank for a in node.attrs["axes"]}
    if len(shape) == 5:
        axes = {p for a in axes for p in ((1, 4) if a == 1 else (a,))}
    blocks = _blocks(shape, axes)
    ycount = cexpr.prod(y.type.shape)
    rcount = cexpr.prod(x.type.shape[a] for a in node.attrs["axes"])
    X, Y = em.ptr(x), em.ptr(y)
    lines = ["{", f"  for (int64_t q = 0; q < {ycount}; q++) {Y}[q] = ({t})({ident});"]
    tail_reduced = bool(blocks) and blocks[-1][1]
    lanes = _kept_lanes(blocks, op, x)
    loop_blocks = blocks[:-2] if lanes else blocks[:-1] if tail_reduced else blocks
    # input index and output index as running linear indices over the blocks
    iv = [f"b{k}" for k in range(len(blocks))]
    in_idx, out_idx = "0", "0"
    for k, (d, red) in enumerate(blocks):
        in_idx = f"({in_idx}) * ({D.to_c(d)}) + {iv[k]}"
        if not red:
            out_idx = f"({out_idx}) * ({D.to_c(d)}) + {iv[k]}"
    # the first block, when it is kept, runs on the thread pool: its rows write disjoint outputs
    par = bool(loop_blocks) and not loop_blocks[0][1]
    nest = []
    depth = 0
    for k, (d, red) in enumerate(loop_blocks):
        if not (par and k == 0):
            nest.append("  " * depth + f"for (int64_t {iv[k]} = 0; {iv[k]} < {D.to_c(d)}; {iv[k]}++)")
            depth += 1
    if lanes:
        # [..., R reduced, L kept] (a blocked map's global pool: L = its block): L accumulators side by side in
        # PARTS partial rows, a vector each, where one sum per element through memory ran a float a cycle
        kr, kl, R = len(blocks) - 2, len(blocks) - 1, D.to_c(blocks[-2][0])
        lane = lambda e: re.sub(rf"\b{iv[kl]}\b", "l_", e)     # noqa: E731
        part_idx = lane(re.sub(rf"\b{iv[kr]}\b", f"({iv[kr]} + p_)", in_idx))
        one_idx, y_idx = lane(in_idx), lane(out_idx)
        d = "  " * depth
        init = "0" if op in ("reduce_sum", "reduce_mean") else ident
        nest += [d + f"{{ {acc_t} part_[{PARTS}][{lanes}]; int64_t {iv[kr]} = 0;",
                 d + f"  for (int p_ = 0; p_ < {PARTS}; p_++) for (int l_ = 0; l_ < {lanes}; l_++) part_[p_][l_] = {init};",
                 d + f"  for (; {iv[kr]} + {PARTS} <= {R}; {iv[kr]} += {PARTS}) for (int p_ = 0; p_ < {PARTS}; p_++) "
                     f"for (int l_ = 0; l_ < {lanes}; l_++) " + _combine(op, "part_[p_][l_]", f"{X}[{part_idx}]"),
                 d + f"  for (; {iv[kr]} < {R}; {iv[kr]}++) for (int l_ = 0; l_ < {lanes}; l_++) "
                     + _combine(op, "part_[0][l_]", f"{X}[{one_idx}]"),
                 d + f"  for (int p_ = 1; p_ < {PARTS}; p_++) for (int l_ = 0; l_ < {lanes}; l_++) "
                     + _combine(op, "part_[0][l_]", "part_[p_][l_]"),
                 # into Y, which an outer reduced dim (a batch summed over) may add to again
                 d + f"  for (int l_ = 0; l_ < {lanes}; l_++) " + _combine(op, f"{Y}[{y_idx}]", f"({t})part_[0][l_]") + " }"]
    elif tail_reduced:
        k = len(blocks) - 1
        acc_init = "0" if op in ("reduce_sum", "reduce_mean") else f"{Y}[{out_idx}]"
        nest.append("  " * depth + f"{{ {acc_t} acc = {acc_init};")
        n, b = D.to_c(blocks[k][0]), iv[k]
        if op in ("reduce_sum", "reduce_mean") and acc_t == "double":
            # eight partial sums (one double chain had held a 56x56 plane's mean to one add per 4 cycles)
            nest.append("  " * depth + f"  int64_t {b} = 0; double part[8] = {{0}};")
            nest.append("  " * depth + f"  for (; {b} + 8 <= {n}; {b} += 8) for (int l_ = 0; l_ < 8; l_++) "
                        f"part[l_] += {X}[({in_idx}) + l_];")
            nest.append("  " * depth + "  acc = ((part[0] + part[4]) + (part[1] + part[5])) + "
                        "((part[2] + part[6]) + (part[3] + part[7]));")
            nest.append("  " * depth + f"  for (; {b} < {n}; {b}++) acc += {X}[{in_idx}];")
        else:
            nest.append("  " * depth + f"  for (int64_t {b} = 0; {b} < {n}; {b}++) " + _combine(op, "acc", f"{X}[{in_idx}]"))
        final = f"{Y}[{out_idx}] += ({t})acc;" if op in ("reduce_sum", "reduce_mean") else f"{Y}[{out_idx}] = acc;"
        nest.append("  " * depth + f"  {final} }}")
    else:
        nest.append("  " * depth + _combine(op, f"{Y}[{out_idx}]", f"{X}[{in_idx}]"))
    if par:
        lines += ["  " + x for x in em.parallel(iv[0], D.to_c(loop_blocks[0][0]), f"{ycount} * {rcount}", nest)]
    else:
        lines += ["  " + x for x in nest]
    if op == "reduce_mean":
        lines.append(f"  {{ const {t} inv = ({t})1 / ({t})({rcount}); for (int64_t q = 0; q < {ycount}; q++) {Y}[q] *= inv; }}")
    lines.append("}")
    return lines


@lowering("argmax", "argmin")
def lower_arg(em, node):
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    outer, n, inner = cexpr.outer_n_inner(x.type.shape, a["axis"])
    cmp = (">" if node.op == "argmax" else "<") + ("=" if a["select_last_index"] else "")
    X, Y = em.ptr(x), em.ptr(y)
    # NaN is the extreme for both (numpy, torch): the first NaN wins, or the last with select_last_index
    nan = "v != v" if a["select_last_index"] else "(v != v && b == b)"
    return ["{", f"  const int64_t nO = {outer}, nN = {n}, nI = {inner};",
            "  for (int64_t o = 0; o < nO; o++) for (int64_t i = 0; i < nI; i++) {",
            f"    int64_t best = 0; for (int64_t k = 1; k < nN; k++) {{ "
            f"__typeof__(*{X}) v = {X}[(o * nN + k) * nI + i], b = {X}[(o * nN + best) * nI + i]; "
            f"if (v {cmp} b || {nan}) best = k; }}",
            f"    {Y}[o * nI + i] = best;", "  }", "}"]


@lowering("cumsum", "cumprod")
def lower_cumulative(em, node):
    """Running sums or products along an axis (inclusive or exclusive, either direction)."""
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    outer, n, inner = cexpr.outer_n_inner(x.type.shape, a["axis"])
    X, Y = em.ptr(x), em.ptr(y)
    t = CTYPE[x.dtype]
    op, init = ("+=", 0) if node.op == "cumsum" else ("*=", 1)
    k = "(nN - 1 - kk)" if a["reverse"] else "kk"
    body = (f"{Y}[(o * nN + {k}) * nI + i] = s; s {op} {X}[(o * nN + {k}) * nI + i];" if a["exclusive"]
            else f"s {op} {X}[(o * nN + {k}) * nI + i]; {Y}[(o * nN + {k}) * nI + i] = s;")
    return ["{", f"  const int64_t nO = {outer}, nN = {n}, nI = {inner};",
            "  for (int64_t o = 0; o < nO; o++) for (int64_t i = 0; i < nI; i++) {",
            f"    {t} s = {init}; for (int64_t kk = 0; kk < nN; kk++) {{ {body} }}", "  }", "}"]


def _topk_supports(node):
    return None if isinstance(node.attrs["k"], int) else "symbolic k"


# k up to which top-k selects by repeated scans (O(k * k * N), no scratch); above it, and for sorts, a
# stable merge sort of the lane's indices (O(N log N)): the scans had taken 80 s to sort 8000 floats
TOPK_SCAN_MAX = 16


def _topk_merges(node):
    return node.attrs["k"] > TOPK_SCAN_MAX and isinstance(node.inputs[0].shape[node.attrs["axis"]], int)


def _topk_scratch(node, bounds):
    return 2 * 8 * node.inputs[0].shape[node.attrs["axis"]] if _topk_merges(node) else 0


@lowering("topk", scratch=_topk_scratch, supports=_topk_supports)
def lower_topk(em, node):
    x = node.inputs[0]
    yv, yi = node.outputs
    a = node.attrs
    outer, n, inner = cexpr.outer_n_inner(x.type.shape, a["axis"])
    X, V, IX = em.ptr(x), em.ptr(yv), em.ptr(yi)
    t = CTYPE[x.dtype]
    k = a["k"]
    # v (index j) comes before bv (index bj): NaN is the largest value (as the reference and torch.topk),
    # first when largest, last otherwise; ties keep index order
    better = ("((v != v && bv == bv) || v > bv || (v == bv && j < bj))" if a["largest"] else
              "((bv != bv && v == v) || v < bv || (v == bv && j < bj))")
    head = ["{", f"  const int64_t nO = {outer}, nN = {n}, nI = {inner}, nK = {k};",
            "  if (nK > 0) for (int64_t o = 0; o < nO; o++) for (int64_t i = 0; i < nI; i++) {"]
    at = f"{X}[(o * nN + (J)) * nI + i]"
    if _topk_merges(node):
        scratch = em.scratch("int64_t")
        return head + [
            f"    int64_t *ix = {scratch}, *tmp = ix + nN;",
            "    for (int64_t j = 0; j < nN; j++) ix[j] = j;",
            "    for (int64_t w = 1; w < nN; w *= 2) {          /* bottom-up merges, left first on ties */",
            "      for (int64_t lo = 0; lo < nN; lo += 2 * w) {",
            "        int64_t mid = lo + w < nN ? lo + w : nN, hi = lo + 2 * w < nN ? lo + 2 * w : nN, p = lo, q = mid, d = lo;",
            "        while (p < mid && q < hi) {",
            f"          int64_t j = ix[q], bj = ix[p]; {t} v = {at.replace('(J)', 'j')}, bv = {at.replace('(J)', 'bj')};",
            f"          tmp[d++] = {better} ? ix[q++] : ix[p++];",
            "        }",
            "        while (p < mid) tmp[d++] = ix[p++];",
            "        while (q < hi) tmp[d++] = ix[q++];",
            "      }",
            "      int64_t *sw = ix; ix = tmp; tmp = sw;",
            "    }",
            f"    for (int64_t r = 0; r < nK; r++) {{ {V}[(o * nK + r) * nI + i] = {at.replace('(J)', 'ix[r]')}; "
            f"{IX}[(o * nK + r) * nI + i] = ix[r]; }}",
            "  }", "}"]
    # one pass keeping the best k so far in order (an element past the k-th best is one compare); the lanes
    # (o, i) in parallel. k scans, each checking the taken indices, had run at 17 ns an element
    best = better.replace("bv", "kv[p - 1]").replace("bj", "kj[p - 1]")
    body = [
        "const int64_t o = oi / nI, i = oi % nI;",
        f"{t} kv[{TOPK_SCAN_MAX}]; int64_t kj[{TOPK_SCAN_MAX}], c = 0;",
        "for (int64_t j = 0; j < nN; j++) {",
        f"  {t} v = {at.replace('(J)', 'j')};",
        "  int64_t p = c;",
        f"  if (c == nK && !({best})) continue;",
        f"  if (c < nK) c++; else p = nK - 1;",
        f"  for (; p > 0 && ({best}); p--) {{ kv[p] = kv[p - 1]; kj[p] = kj[p - 1]; }}",
        "  kv[p] = v; kj[p] = j;",
        "}",
        f"for (int64_t r = 0; r < nK; r++) {{ {V}[(o * nK + r) * nI + i] = kv[r]; {IX}[(o * nK + r) * nI + i] = kj[r]; }}"]
    decl = f"const int64_t nO = {outer}, nN = {n}, nI = {inner}, nK = {k};"
    # a symbolic dim shorter than k at run time (a static one is checked by the IR): no row to fill
    check = ('  if (nN < nK) CUVIL_FAIL("topk: k=%lld for a dim of size %lld", (long long)nK, (long long)nN);')
    return ["{", "  " + decl, check, "  if (nK > 0) {"] + \
        ["    " + b for b in em.parallel("oi", "nO * nI", "nO * nI * nN", body, [decl])] + ["  }", "}"]
