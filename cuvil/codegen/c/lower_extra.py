"""C lowering of the ops in ir/ops/extra.py: bitwise ops and shifts, cumprod, scatter, top-k."""
from __future__ import annotations

from ...ir import dims as D
from . import cexpr
from .ctypes_map import CTYPE
from .emit import lowering
from .loops import broadcast_strides, contiguous_strides, loop_nest

_BIT = {"bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
        "shift_left": "(({1}) < 0 || ({1}) >= (T)(8 * sizeof(T)) ? (T)0 : (T)((T){0} << {1}))",
        "shift_right": "(({1}) < 0 || ({1}) >= (T)(8 * sizeof(T)) ? (T)({0} < 0 ? -1 : 0) : (T)({0} >> {1}))",
        "bitwise_not": "((T)~{0})"}


@lowering(*_BIT)
def lower_bitwise(em, node):
    out = node.outputs[0]
    shape = out.type.shape
    t = CTYPE[out.dtype]
    tmpl = _BIT[node.op].replace("(T)", f"({t})").replace("sizeof(T)", f"sizeof({t})")
    ins = [(em.ptr(v), broadcast_strides(v.type.shape, shape), "0") for v in node.inputs]

    def expr(loads):
        e = tmpl
        for k, a in enumerate(loads):
            e = e.replace("{%d}" % k, f"({a})")
        return e
    return loop_nest(shape, (em.ptr(out), contiguous_strides(shape), "0"), ins, expr, em.parallel)


@lowering("cumprod")
def lower_cumprod(em, node):
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    outer, n, inner = cexpr.outer_n_inner(x.type.shape, a["axis"])
    X, Y = em.ptr(x), em.ptr(y)
    t = CTYPE[x.dtype]
    k = "(nN - 1 - kk)" if a["reverse"] else "kk"
    body = (f"{Y}[(o * nN + {k}) * nI + i] = s; s *= {X}[(o * nN + {k}) * nI + i];" if a["exclusive"]
            else f"s *= {X}[(o * nN + {k}) * nI + i]; {Y}[(o * nN + {k}) * nI + i] = s;")
    return ["{", f"  const int64_t nO = {outer}, nN = {n}, nI = {inner};",
            "  for (int64_t o = 0; o < nO; o++) for (int64_t i = 0; i < nI; i++) {",
            f"    {t} s = 1; for (int64_t kk = 0; kk < nN; kk++) {{ {body} }}", "  }", "}"]


def _combine(red, dst, src):
    if red == "none":
        return f"{dst} = {src};"
    if red == "add":
        return f"{dst} += {src};"
    if red == "mul":
        return f"{dst} *= {src};"
    cmp = ">" if red == "max" else "<"
    return f"if ({src} {cmp} {dst}) {dst} = {src};"


def _nbytes(v):
    return f"(size_t)({cexpr.prod(v.type.shape)}) * sizeof({CTYPE[v.dtype]})"


@lowering("scatter_elements")
def lower_scatter_elements(em, node):
    x, idx, upd = node.inputs
    y = node.outputs[0]
    ax = node.attrs["axis"]
    X, IDX, U, Y = em.ptr(x), em.ptr(idx), em.ptr(upd), em.ptr(y)
    xst = contiguous_strides(x.type.shape)
    ish = idx.type.shape
    ist = contiguous_strides(ish)
    r = len(ish)
    iv = [f"i{k}" for k in range(r)]
    n = D.to_c(x.type.shape[ax])
    flat = " + ".join(f"{iv[k]} * {D.to_c(ist[k])}" for k in range(r)) or "0"
    tgt = " + ".join((f"j * {D.to_c(xst[k])}" if k == ax else f"{iv[k]} * {D.to_c(xst[k])}") for k in range(r)) or "0"
    lines = ["{", f"  if ({Y} != {X}) memcpy({Y}, {X}, {_nbytes(x)});"]
    for k in range(r):
        lines.append("  " * (k + 1) + f"for (int64_t {iv[k]} = 0; {iv[k]} < {D.to_c(ish[k])}; {iv[k]}++)")
    lines.append("  " * (r + 1) + f"{{ int64_t j = {IDX}[{flat}]; if (j < 0) j += {n}; "
                 f"if (j < 0 || j >= {n}) CUVIL_FAIL(\"scatter_elements: index out of range\"); "
                 + _combine(node.attrs["reduction"], f"{Y}[{tgt}]", f"{U}[{flat}]") + " }")
    lines.append("}")
    return lines


@lowering("scatter_nd")
def lower_scatter_nd(em, node):
    x, idx, upd = node.inputs
    y = node.outputs[0]
    X, IDX, U, Y = em.ptr(x), em.ptr(idx), em.ptr(upd), em.ptr(y)
    xs = x.type.shape
    k = idx.type.shape[-1]
    xst = contiguous_strides(xs)
    nupd = cexpr.prod(idx.type.shape[:-1])
    slice_n = cexpr.prod(xs[k:])
    lines = ["{", f"  if ({Y} != {X}) memcpy({Y}, {X}, {_nbytes(x)});",
             f"  for (int64_t q = 0; q < {nupd}; q++) {{", "    int64_t off = 0;"]
    for d in range(k):
        lines.append(f"    {{ int64_t j = {IDX}[q * {k} + {d}]; if (j < 0) j += {D.to_c(xs[d])}; "
                     f"if (j < 0 || j >= {D.to_c(xs[d])}) CUVIL_FAIL(\"scatter_nd: index out of range\"); "
                     f"off += j * {D.to_c(xst[d])}; }}")
    lines.append(f"    for (int64_t e = 0; e < {slice_n}; e++) "
                 + _combine(node.attrs["reduction"], f"{Y}[off + e]", f"{U}[q * {slice_n} + e]"))
    lines += ["  }", "}"]
    return lines


def _topk_supports(node):
    return None if isinstance(node.attrs["k"], int) else "symbolic k"


@lowering("topk", supports=_topk_supports)
def lower_topk(em, node):
    x = node.inputs[0]
    yv, yi = node.outputs
    a = node.attrs
    outer, n, inner = cexpr.outer_n_inner(x.type.shape, a["axis"])
    X, V, IX = em.ptr(x), em.ptr(yv), em.ptr(yi)
    t = CTYPE[x.dtype]
    k = a["k"]
    # NaN is the largest value (as the reference and torch.topk): first when largest, last otherwise
    better = ("((v != v && bv == bv) || v > bv || (v == bv && j < bj))" if a["largest"] else
              "((bv != bv && v == v) || v < bv || (v == bv && j < bj))")
    # selection of the k best by repeated scans (O(k * k * N)): fine for the small k of classifiers
    return ["{", f"  const int64_t nO = {outer}, nN = {n}, nI = {inner}, nK = {k};",
            "  if (nK > 0) for (int64_t o = 0; o < nO; o++) for (int64_t i = 0; i < nI; i++) {",
            "    int64_t last = -1; (void)last;",
            "    for (int64_t r = 0; r < nK; r++) {",
            f"      int64_t bj = -1; {t} bv = 0;",
            "      for (int64_t j = 0; j < nN; j++) {",
            f"        {t} v = {X}[(o * nN + j) * nI + i];",
            "        int taken = 0;",
            f"        for (int64_t s = 0; s < r; s++) if ({IX}[(o * nK + s) * nI + i] == j) {{ taken = 1; break; }}",
            "        if (taken) continue;",
            f"        if (bj < 0 || {better}) {{ bj = j; bv = v; }}",
            "      }",
            f"      {V}[(o * nK + r) * nI + i] = bv; {IX}[(o * nK + r) * nI + i] = bj;",
            "    }",
            "  }", "}"]


def pool_nd(em, node):
    """Direct N-d pooling loops (static shapes), for ranks the 2-d kernel does not cover (3-d pools)."""
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    nsp = x.type.rank - 2
    ins, outs = list(x.shape[2:]), list(y.shape[2:])
    ks, st, dl, pads = a["kernel"], a["strides"], a["dilations"], a["pads"]
    is_max, incl = node.op == "max_pool", bool(a.get("count_include_pad"))
    nc = x.shape[0] * x.shape[1]
    isz, osz = cexpr.prod(ins), cexpr.prod(outs)
    L = ["{", f"  #pragma omp parallel for num_threads(NT) if({nc} > 1)",
         f"  for (int64_t nc = 0; nc < {nc}; nc++) {{",
         f"    const float *xp = {em.ptr(x)} + nc * {isz}; float *yp = {em.ptr(y)} + nc * {osz};",
         f"    for (int64_t o = 0; o < {osz}; o++) {{", "      int64_t r = o;"]
    for i in reversed(range(nsp)):
        L.append(f"      int64_t o{i} = r % {outs[i]}; r /= {outs[i]};")
    L.append(f"      float acc = {'-INFINITY' if is_max else '0.0f'}; int64_t cnt = 0;")
    for i in range(nsp):
        L.append(f"      for (int64_t k{i} = 0; k{i} < {ks[i]}; k{i}++) {{ int64_t i{i} = o{i} * {st[i]} - {pads[i][0]} + "
                 f"k{i} * {dl[i]};")
    inside = " && ".join(f"i{i} >= 0 && i{i} < {ins[i]}" for i in range(nsp))
    declared = " && ".join(f"i{i} < {ins[i] + pads[i][1]}" for i in range(nsp))
    idx = "i0"
    for i in range(1, nsp):
        idx = f"({idx}) * {ins[i]} + i{i}"
    upd = "if (v > acc || v != v) acc = v;" if is_max else "acc += v;"
    L.append(f"        if ({inside}) {{ float v = xp[{idx}]; {upd} cnt++; }}"
             + (f" else if ({declared}) cnt++;" if incl and not is_max else ""))
    L.append("      " + "}" * nsp)
    L.append("      yp[o] = " + ("acc;" if is_max else "acc / (float)(cnt ? cnt : 1);"))
    L += ["    }", "  }", "}"]
    return L


def conv_nd(em, node):
    """Direct N-d convolution loops (static shapes), for ranks the conv kernel does not cover (3-d)."""
    from .gen_activations import ACT_CODES
    x, w, y, a = node.inputs[0], node.inputs[1], node.outputs[0], node.attrs
    nsp = x.type.rank - 2
    N, C = x.shape[:2]
    O, Cg = w.shape[:2]
    g = a["groups"]
    og = O // g
    ins, outs, ks = list(x.shape[2:]), list(y.shape[2:]), list(w.shape[2:])
    st, dl, pads = a["strides"], a["dilations"], a["pads"]
    isz, osz, ksz = cexpr.prod(ins), cexpr.prod(outs), cexpr.prod(ks)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    res = node.inputs[3] if len(node.inputs) > 3 else None
    L = ["{", f"  #pragma omp parallel for num_threads(NT) if({N * O} > 1)",
         f"  for (int64_t no = 0; no < {N * O}; no++) {{",
         f"    int64_t n = no / {O}, oc = no % {O}, gi = oc / {og};",
         f"    const float *wp = {em.ptr(w)} + oc * {Cg} * {ksz};",
         f"    float *yp = {em.ptr(y)} + no * {osz};",
         f"    for (int64_t o = 0; o < {osz}; o++) {{", "      int64_t r = o;"]
    for i in reversed(range(nsp)):
        L.append(f"      int64_t o{i} = r % {outs[i]}; r /= {outs[i]};")
    L.append(f"      float acc = {em.ptr(bias) + '[oc]' if bias is not None else '0.0f'};")
    L.append(f"      for (int64_t c = 0; c < {Cg}; c++) {{")
    L.append(f"        const float *xp = {em.ptr(x)} + (n * {C} + gi * {Cg} + c) * {isz}; const float *wc = wp + c * {ksz};")
    for i in range(nsp):
        L.append(f"        for (int64_t k{i} = 0; k{i} < {ks[i]}; k{i}++) {{ int64_t i{i} = o{i} * {st[i]} - {pads[i][0]} + "
                 f"k{i} * {dl[i]}; if (i{i} < 0 || i{i} >= {ins[i]}) continue;")
    xi, wi = "i0", "k0"
    for i in range(1, nsp):
        xi, wi = f"({xi}) * {ins[i]} + i{i}", f"({wi}) * {ks[i]} + k{i}"
    L.append(f"          acc += xp[{xi}] * wc[{wi}];")
    L.append("        " + "}" * nsp)
    L.append("      }")
    if res is not None:
        L.append(f"      acc += {em.ptr(res)}[no * {osz} + o];")
    L.append(f"      yp[o] = cuvil_act(acc, {ACT_CODES[a['act']]});")
    L += ["    }", "  }", "}"]
    return L


@lowering("bitcast")
def lower_bitcast(em, node):
    x, y = node.inputs[0], node.outputs[0]
    return [f"if ((const void *){em.ptr(y)} != (const void *){em.ptr(x)}) memcpy({em.ptr(y)}, {em.ptr(x)}, {_nbytes(x)});"]
