"""Direct N-d convolution and pooling loops (static shapes), for the ranks the conv and pool kernels do
not cover (3-d): lower_nn's conv and pool lowerings call them."""
from __future__ import annotations

from . import cexpr
from .gen_activations import ACT_CODES


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
