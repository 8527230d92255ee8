"""C lowering of the scatters: scatter_elements and scatter_nd, with their reductions."""
from __future__ import annotations

from ...ir import dims as D
from . import cexpr
from .emit import lowering
from .loops import contiguous_strides


def _combine(red, dst, src):
    if red == "none":
        return f"{dst} = {src};"
    if red == "add":
        return f"{dst} += {src};"
    if red == "mul":
        return f"{dst} *= {src};"
    cmp = ">" if red == "max" else "<"
    return f"if ({src} {cmp} {dst}) {dst} = {src};"


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
    lines = ["{", f"  if ({Y} != {X}) memcpy({Y}, {X}, {cexpr.buffer_bytes(x)});"]
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
    lines = ["{", f"  if ({Y} != {X}) memcpy({Y}, {X}, {cexpr.buffer_bytes(x)});",
             f"  for (int64_t q = 0; q < {nupd}; q++) {{", "    int64_t off = 0;"]
    for d in range(k):
        lines.append(f"    {{ int64_t j = {IDX}[q * {k} + {d}]; if (j < 0) j += {D.to_c(xs[d])}; "
                     f"if (j < 0 || j >= {D.to_c(xs[d])}) CUVIL_FAIL(\"scatter_nd: index out of range\"); "
                     f"off += j * {D.to_c(xst[d])}; }}")
    lines.append(f"    for (int64_t e = 0; e < {slice_n}; e++) "
                 + _combine(node.attrs["reduction"], f"{Y}[off + e]", f"{U}[q * {slice_n} + e]"))
    lines += ["  }", "}"]
    return lines
