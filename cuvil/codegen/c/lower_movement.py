"""C lowering of data movement: views, strided copies, bind_dim (a dim computed at run time), concat, pad,
gather, iota, full."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from ...ir.ops.movement import layout_block
from . import cexpr
from .emit import lowering
from .loops import broadcast_strides, contiguous_strides, loop_nest


def _copy(em, out, src_ptr, src_strides, base="0", out_base="0", shape=None, out_strides=None):
    shape = shape if shape is not None else out.type.shape
    out_strides = out_strides if out_strides is not None else contiguous_strides(shape)
    return loop_nest(shape, (em.ptr(out), out_strides, out_base), [(src_ptr, src_strides, base)], lambda a: a[0],
                     em.parallel)


def _nbytes(v):
    return cexpr.nbytes(v.type.shape, np.dtype(v.dtype).itemsize, cast="size_t")


@lowering("reshape")
def lower_reshape(em, node):
    x, y = node.inputs[0], node.outputs[0]
    if em.plan.alias.get(y.name) is not None or em.plan.alias.get(x.name) == y.name:
        return []                                    # a view: shares its source's buffer (or x was written into y)
    return [f"memcpy({em.ptr(y)}, {em.ptr(x)}, {_nbytes(y)});"]


@lowering("bind_dim")
def lower_bind_dim(em, node):
    """The symbol takes the count computed at run time (for the kernels after it, the parallel tasks'
    context and the caller's data_dims), and x's first `count` entries along axis are copied out."""
    x, count = node.inputs
    name = node.attrs["symbol"]
    hi = int(em.graph.symbols[name][1])
    k, j = sorted(em.graph.symbols).index(name), em.graph.data_dims().index(name)
    return [f"S_{name} = *(const int64_t *){em.ptr(count)};",
            f'if (S_{name} < 0 || S_{name} > {hi}) CUVIL_FAIL("data-dependent dim {name} = %lld is outside [0, {hi}]", '
            f"(long long)S_{name});",
            f"cuvil_ctx_.sym[{k}] = S_{name}; cuvil_dd_values[{j}] = S_{name};"] + \
        _copy(em, node.outputs[0], em.ptr(x), contiguous_strides(x.type.shape))


@lowering("transpose")
def lower_transpose(em, node):
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    if a.get("in_layout", "nchw") != "nchw" or a.get("layout", "nchw") != "nchw":
        return _blocked_transpose(em, node)
    st = contiguous_strides(x.type.shape)
    return _copy(em, y, em.ptr(x), [st[p] for p in a["perm"]])


def _blocked_transpose(em, node):
    """NCHW <-> NHWC with the NCHW side channel-blocked: kernels/blocked.h cuvil_blocked_nhwc, a vector
    per (pixel, block) (a strided loop nest here spent an integer division per 64 bytes)."""
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    to_nhwc = a["in_layout"] != "nchw"
    layout = a["in_layout"] if to_nhwc else a["layout"]
    n, c, h, w = (D.to_c(d) for d in (x if to_nhwc else y).type.shape)
    return ["{", f"  _Static_assert(CUVIL_BLOCK == {layout_block(layout)}, \"blocked layout planned for another vector width\");",
            f"  cuvil_blocked_nhwc({n}, {c}, (int64_t)({h}) * ({w}), {int(to_nhwc)}, {em.ptr(x)}, {em.ptr(y)}, NT);", "}"]


@lowering("expand")
def lower_expand(em, node):
    x, y = node.inputs[0], node.outputs[0]
    return _copy(em, y, em.ptr(x), broadcast_strides(x.type.shape, y.type.shape))


@lowering("slice")
def lower_slice(em, node):
    x, a = node.inputs[0], node.attrs
    st = contiguous_strides(x.type.shape)
    strides = list(st)
    strides[a["axis"]] = D.as_dim(st[a["axis"]] * a["step"])
    base = D.to_c(D.as_dim(a["start"] * st[a["axis"]]))
    return _copy(em, node.outputs[0], em.ptr(x), strides, base=base)


@lowering("concat")
def lower_concat(em, node):
    y, ax = node.outputs[0], node.attrs["axis"]
    if y.name in em.plan.concats_in_place:
        return ["/* concat: its inputs were written in place (memplan.in_place_concats) */"]
    ost = contiguous_strides(y.type.shape)
    lines, offset = [], 0
    for x in node.inputs:
        lines += _copy(em, y, em.ptr(x), contiguous_strides(x.type.shape), out_base=D.to_c(D.as_dim(offset * ost[ax])),
                       shape=x.type.shape, out_strides=ost)
        offset = D.as_dim(offset + x.type.shape[ax])
    return lines


def _pad_supports(node):
    if any(not (isinstance(lo, int) and isinstance(hi, int)) for lo, hi in node.attrs["pads"]):
        return "symbolic pads"
    return None


@lowering("pad", supports=_pad_supports)
def lower_pad(em, node):
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    xs, ys = x.type.shape, y.type.shape
    xst = contiguous_strides(xs)
    r = len(ys)
    idx = [f"i{k}" for k in range(r)]
    lines = ["{"]
    conds, terms = [], []
    for k, (lo, hi) in enumerate(a["pads"]):
        n = D.to_c(xs[k])
        src = f"({idx[k]} - {lo})"
        if a["mode"] == "edge":
            src = f"({src} < 0 ? 0 : ({src} >= {n} ? {n} - 1 : {src}))"
        elif a["mode"] == "reflect":
            src = f"cuvil_reflect({src}, {n})"
        else:
            conds.append(f"{src} >= 0 && {src} < {n}")
        terms.append(f"{src} * {D.to_c(xst[k])}")
    yt = em.ctype(y)
    load = f"{em.ptr(x)}[{' + '.join(terms) or '0'}]"
    fv = float(a["value"])
    fs = cexpr.float_literal(fv)
    value = f"(({yt}){fs})" if y.dtype.startswith("float") else f"(({yt}){int(a['value'])})"
    expr = f"({' && '.join(conds)}) ? {load} : {value}" if conds else load
    for k in range(r):
        lines.append("  " * (k + 1) + f"for (int64_t {idx[k]} = 0; {idx[k]} < {D.to_c(ys[k])}; {idx[k]}++)")
    ost = contiguous_strides(ys)
    oidx = " + ".join(f"{idx[k]} * {D.to_c(ost[k])}" for k in range(r)) or "0"
    lines.append("  " * (r + 1) + f"{em.ptr(y)}[{oidx}] = {expr};")
    lines.append("}")
    if a["mode"] == "reflect":
        lines.insert(0, "#define cuvil_reflect(i, n) ((n) == 1 ? 0 : ((i) < 0 ? -(i) : ((i) >= (n) ? 2 * ((n) - 1) - (i) : (i))))")
    return lines


def _check_indices(em, idx, n, what):
    cnt = cexpr.prod(idx.type.shape)
    p = em.ptr(idx)
    return [f"for (int64_t q = 0; q < {cnt}; q++) {{ int64_t j = {p}[q]; if (j < -({n}) || j >= ({n})) "
            f"CUVIL_FAIL(\"{what}: index %lld out of range for a dim of size %lld\", (long long)j, (long long)({n})); }}"]


@lowering("gather")
def lower_gather(em, node):
    x, idx, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ax = node.attrs["axis"]
    xs = x.type.shape
    outer = cexpr.prod(xs[:ax])
    inner = cexpr.prod(xs[ax + 1:])
    nidx = cexpr.prod(idx.type.shape)
    n = D.to_c(xs[ax])
    lines = _check_indices(em, idx, n, "gather")
    decl = f"const int64_t nO = {outer}, nI = {inner}, nQ = {nidx}, nN = {n};"
    if D.dims_equal(D.prod(xs[ax + 1:]), 1):
        # along the last axis (an upsample's or a reflect pad's columns): a row of outputs a task, in a
        # loop the compiler vectorizes; an element a task, two divisions and a memcpy call each, had cost
        # 10x the copy
        body = [f"const {em.ctype(y)} *xo = {em.ptr(x)} + o * nN; {em.ctype(y)} *yo = {em.ptr(y)} + o * nQ;",
                f"for (int64_t q = 0; q < nQ; q++) {{ int64_t j = {em.ptr(idx)}[q]; yo[q] = xo[j < 0 ? j + nN : j]; }}"]
        return lines + ["{", "  " + decl] + ["  " + x for x in em.parallel("o", "nO", "nO * nQ", body, [decl])] + ["}"]
    body = ["const int64_t o = oq / nQ, q = oq % nQ;",
            f"int64_t j = {em.ptr(idx)}[q]; if (j < 0) j += nN;",
            f"memcpy({em.ptr(y)} + (o * nQ + q) * nI, {em.ptr(x)} + (o * nN + j) * nI, (size_t)nI * sizeof *{em.ptr(y)});"]
    return lines + ["{", "  " + decl] + ["  " + x for x in em.parallel("oq", "nO * nQ", "nO * nQ * nI", body, [decl])] + ["}"]


@lowering("gather_elements")
def lower_gather_elements(em, node):
    x, idx, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ax = node.attrs["axis"]
    xst = contiguous_strides(x.type.shape)
    shape = idx.type.shape
    n = D.to_c(x.type.shape[ax])
    lines = _check_indices(em, idx, n, "gather_elements")
    r = len(shape)
    iv = [f"i{k}" for k in range(r)]
    ist = contiguous_strides(shape)
    flat = " + ".join(f"{iv[k]} * {D.to_c(ist[k])}" for k in range(r)) or "0"
    src = " + ".join((f"j * {D.to_c(xst[k])}" if k == ax else f"{iv[k]} * {D.to_c(xst[k])}") for k in range(r)) or "0"
    lines.append("{")
    for k in range(r):
        lines.append("  " * (k + 1) + f"for (int64_t {iv[k]} = 0; {iv[k]} < {D.to_c(shape[k])}; {iv[k]}++)")
    lines.append("  " * (r + 1) + f"{{ int64_t j = {em.ptr(idx)}[{flat}]; if (j < 0) j += {n}; "
                 f"{em.ptr(y)}[{flat}] = {em.ptr(x)}[{src}]; }}")
    lines.append("}")
    return lines


@lowering("iota")
def lower_iota(em, node):
    a, y = node.attrs, node.outputs[0]
    t = em.ctype(y)
    return [f"for (int64_t i = 0; i < {D.to_c(a['length'])}; i++) {em.ptr(y)}[i] = ({t})({a['start']!r} + {a['step']!r} * (double)i);"]


@lowering("full")
def lower_full(em, node):
    y = node.outputs[0]
    t = em.ctype(y)
    cnt = cexpr.prod(y.type.shape)
    v = node.attrs["value"]
    if hasattr(v, "free_symbols"):
        lit = D.to_c(v)                 # a symbolic size used as data
    else:
        lit = cexpr.float_literal(v) if isinstance(v, float) else repr(v)
    return [f"for (int64_t i = 0; i < {cnt}; i++) {em.ptr(y)}[i] = ({t})({lit});"]
