"""C lowering of the channel-blocked ops (passes/layout.py, kernels/blocked.h): convs and max pools
whose layout attribute is nchw16c, and the relayouts between that layout and NCHW."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from .emit import lowering


def is_blocked(node) -> bool:
    return node.attrs.get("layout") == "nchw16c"


def filters_as_b(w: np.ndarray) -> np.ndarray:
    """[O, C, KH, KW] -> the GEMM's B, [K = KH * KW * C][O] with k = (kh * KW + kw) * C + c: the order
    in which a blocked conv gathers its blocks of 16 channels, tap by tap (kernels/blocked.c)."""
    return w.astype(np.float32).transpose(2, 3, 1, 0).reshape(-1, w.shape[0])


def conv_scratch(node, shape) -> int:
    """Bytes of a blocked conv's scratch (kernels/blocked.h: cuvil_conv_blocked_scratch and
    cuvil_winograd_blocked_scratch)."""
    from .lower_nn import _winograd
    s, m = shape, _winograd(node)
    if node.attrs.get("in_layout") == "nchw":      # kernels/blocked.c: cuvil_conv_nchw_blocked_scratch
        hp = (s["OH"] - 1) * s["sh"] + (s["KH"] - 1) * s["dh"] + 1
        wp = (s["OW"] - 1) * s["sw"] + (s["KW"] - 1) * s["dw"] + 1
        return (s["C"] * hp * wp + 2 * s["OH"] * s["OW"]) * 4
    if node.attrs.get("groups", 1) > 1:
        return 0
    if m:
        return (m + 2) ** 2 * (s["C"] + s["O"]) * -(-s["OH"] // m) * -(-s["OW"] // m) * 4
    if s["KH"] == s["KW"] == s["sh"] == s["sw"] == 1 and s["ph"] == s["pw"] == 0:
        return 0                                      # the input is the GEMM's A
    hp = (s["OH"] - 1) * s["sh"] + (s["KH"] - 1) * s["dh"] + 1
    wp = (s["OW"] - 1) * s["sw"] + (s["KW"] - 1) * s["dw"] + 1
    in_place = s["ph"] == s["pw"] == 0 and hp <= s["H"] and wp <= s["W"]
    return ((0 if in_place else s["C"] * hp * wp) + 2 * (s["OH"] * s["OW"] + s["KH"] * s["KW"])) * 4


def winograd_filters_as_b(w: np.ndarray, m: int, nr: int) -> np.ndarray:
    """[O, C, 3, 3] -> U[i][j] = G g G^T of every (o, c) as (m + 2)^2 packed B operands [C][O]."""
    from .lower_nn import WINOGRAD_G, pack_b
    g = WINOGRAD_G[m]
    u = np.einsum("ik,ockl,jl->ijco", g, w.astype(np.float64), g).astype(np.float32)
    return np.concatenate([pack_b(u[i, j], nr).ravel() for i in range(m + 2) for j in range(m + 2)])


def lower_conv(em, node, shape_struct, bias, res, act):
    from .lower_nn import _winograd, pack_b, panel_width
    nr, m = panel_width(em), _winograd(node)
    if node.attrs.get("in_layout") == "nchw":
        wb = em.packed("conv_nchw_blocked_b", node.inputs[1],
                       lambda d: pack_b(d.astype(np.float32).reshape(d.shape[0], -1).T, nr))
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
                f"  cuvil_conv_nchw_blocked(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, {em.ptr(node.outputs[0])}, "
                f"{act}, {em.scratch()}, NT);", "}"]
    if node.attrs.get("groups", 1) > 1:              # depthwise (passes/layout.py takes no other groups)
        w = em.packed("depthwise_blocked", node.inputs[1],
                      lambda d: d.astype(np.float32).reshape(d.shape[0], -1).T.copy())
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  cuvil_depthwise_blocked(&s, {em.ptr(node.inputs[0])}, {w}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, NT);", "}"]
    if m:
        up = em.packed(f"winograd{m}_blocked_b", node.inputs[1], lambda d: winograd_filters_as_b(d, m, nr))
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  _Static_assert(CUVIL_NR == {nr}, \"winograd filters packed for another panel width\");",
                f"  cuvil_conv3x3_winograd_blocked(&s, {m}, {em.ptr(node.inputs[0])}, {up}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {em.scratch()}, NT);", "}"]
    wb = em.packed("conv_blocked_b", node.inputs[1], lambda d: pack_b(filters_as_b(d), nr))
    return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
            f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
            f"  cuvil_conv_blocked(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, {em.ptr(node.outputs[0])}, "
            f"{act}, {em.scratch()}, NT);", "}"]


def lower_max_pool(em, node, shape_struct):
    return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
            f"  cuvil_max_pool_blocked(&s, {em.ptr(node.inputs[0])}, {em.ptr(node.outputs[0])}, NT);", "}"]


@lowering("relayout")
def lower_relayout(em, node):
    n, c, h, w = (D.to_c(d) for d in node.inputs[0].shape)
    return [f"cuvil_relayout({n}, {c}, (int64_t)({h}) * ({w}), {int(node.attrs['to'] == 'nchw16c')}, "
            f"{em.ptr(node.inputs[0])}, {em.ptr(node.outputs[0])}, NT);"]
