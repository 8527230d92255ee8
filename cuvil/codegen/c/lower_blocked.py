"""C lowering of the channel-blocked ops (passes/layout.py, kernels/blocked.h): convs and max pools
whose layout attribute is a blocked "nchw<B>c", and the relayouts between that layout and NCHW. The
kernels' block is the target's vector width (CUVIL_BLOCK); every call asserts the one it was planned for."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from ...ir.ops.movement import layout_block
from ...ir.quant import to_bf16
from .conv_plan import WINOGRAD_G
from .emit import lowering
from .gemm_plan import pack_b, panel_width
from .lower_bf16dot import bf16_dot_panels, computes_bf16
from .lower_int8dot import computes_int8, filter_terms, int8_group_panels, quantized_filters


def filters_as_b(w: np.ndarray) -> np.ndarray:
    """[O, C, KH, KW] -> the GEMM's B, [K = KH * KW * C][O] with k = (kh * KW + kw) * C + c: the order
    in which a blocked conv gathers its blocks of channels, tap by tap (kernels/blocked.c)."""
    return w.astype(np.float32).transpose(2, 3, 1, 0).reshape(-1, w.shape[0])


def bf16_filter_panels(w: np.ndarray, groups: int = 1) -> np.ndarray:
    """The filters as filters_as_b orders them, in the bf16 dot kernels' panels (cuvil_conv_blocked_bf16),
    each group's after the last's."""
    og = w.shape[0] // groups
    return np.concatenate([bf16_dot_panels(to_bf16(filters_as_b(w[g * og:(g + 1) * og]))).ravel()
                           for g in range(groups)])


def int8_filter_panels(w: np.ndarray, groups: int = 1) -> np.ndarray:
    """The filters as filters_as_b orders them, as signed bytes in the integer dot kernels' panels, each
    group's in its own."""
    return int8_group_panels(quantized_filters(filters_as_b(w))[0], groups)


def grouped_filters_as_b(w: np.ndarray, groups: int, nr: int) -> np.ndarray:
    """Each group's filters as its own packed B, one after another (kernels/blocked.h: cuvil_conv_blocked)."""
    og = w.shape[0] // groups
    return np.concatenate([pack_b(filters_as_b(w[q * og:(q + 1) * og]), nr).ravel() for q in range(groups)])


def grouped_filters_by_lane(w: np.ndarray, block: int) -> np.ndarray:
    """[O, g, KH, KW] -> [O / B][KH][KW][g][B] (kernels/blocked.h: cuvil_conv_grouped_blocked), B = block:
    each tap's and group input's filter values for a block of outputs side by side, as the block's
    channels of a pixel are."""
    O, g, KH, KW = w.shape
    return np.ascontiguousarray(w.astype(np.float32).reshape(O // block, block, g, KH, KW).transpose(0, 3, 4, 2, 1))


def winograd_filters_as_b(w: np.ndarray, m: int, nr: int, groups: int = 1) -> np.ndarray:
    """[O, C / groups, 3, 3] -> U[i][j] = G g G^T of every (o, c) as packed B operands [C / groups][O / groups],
    one per group, for each of the (m + 2)^2 (i, j) in turn."""
    g, og = WINOGRAD_G[m], w.shape[0] // groups
    u = np.einsum("ik,ockl,jl->ijco", g, w.astype(np.float64), g).astype(np.float32)
    return np.concatenate([pack_b(u[i, j][:, q * og:(q + 1) * og], nr).ravel()
                           for i in range(m + 2) for j in range(m + 2) for q in range(groups)])


def block_check(layout):
    return f"_Static_assert(CUVIL_BLOCK == {layout_block(layout)}, \"blocked layout planned for another vector width\");"


def lower_conv(em, node, plan, shape_struct, bias, res, act):
    """A blocked conv of the kind its conv_plan.ConvPlan names."""
    lines = lower_conv_call(em, node, plan, shape_struct, bias, res, act)
    blocked = node.attrs["in_layout"] if plan.kind == "blocked_to_nchw" else node.attrs["layout"]
    return lines[:1] + ["  " + block_check(blocked)] + lines[1:]


def lower_conv_call(em, node, plan, shape_struct, bias, res, act):
    nr, m = panel_width(em), plan.winograd
    if computes_int8(node, em.target):
        kind = "BYTES" if node.attrs.get("int8_in") else "NCHW" if plan.kind == "blocked_from_nchw" else "BLOCKED"
        return lower_int8_conv(em, node, shape_struct, bias, res, act, kind, nchw_out=plan.kind == "blocked_to_nchw")
    links = [f"CUVIL_BF16_{k.upper()}" for k in ("in", "res", "out") if node.attrs.get(f"bf16_{k}")]
    if links and not computes_bf16(node, em.target) or node.attrs.get("bf16_in") and plan.kind != "blocked":
        raise AssertionError(f"conv at {node.loc}: bf16 maps linked to a conv that does not read or write them")
    if len(node.inputs) > 4 and node.inputs[4] is not None:
        return _gated_conv(em, node, plan, shape_struct, bias, res, act, nr)
    if plan.kind == "blocked_to_nchw":               # fp32 (passes/layout.into_nchw takes no bf16 conv)
        wb = em.packed(plan.pack, node.inputs[1], lambda d: grouped_filters_as_b(d, 1, nr))
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
                f"  if (cuvil_conv_blocked_nchw_out(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {em.scratch()}, NT)) "
                "CUVIL_FAIL(\"out of memory for a conv's rows\");", "}"]
    if plan.kind == "blocked_from_nchw" and computes_bf16(node, em.target):
        wb = em.packed("conv_blocked_bf16", node.inputs[1], bf16_filter_panels, "uint32_t")
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  if (cuvil_conv_nchw_blocked_bf16(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {' | '.join(links) or 0}, {em.scratch()}, NT)) "
                "CUVIL_FAIL(\"out of memory for bf16 activations\");", "}"]
    if plan.kind == "blocked_from_nchw":
        wb = em.packed(plan.pack, node.inputs[1],
                       lambda d: pack_b(d.astype(np.float32).reshape(d.shape[0], -1).T, nr))
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
                f"  cuvil_conv_nchw_blocked(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, {em.ptr(node.outputs[0])}, "
                f"{act}, {em.scratch()}, NT);", "}"]
    if plan.kind == "blocked_depthwise":             # passes/layout.py takes no other groups
        w = em.packed(plan.pack, node.inputs[1],
                      lambda d: d.astype(np.float32).reshape(d.shape[0], -1).T.copy())
        if node.attrs.get("int8_in"):
            rng, out_rng, image = _int8_link_constants(em, node)
            return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                    f"  cuvil_depthwise_bytes(&s, (const uint8_t *){em.ptr(node.inputs[0])}, {w}, {bias}, {rng}, {res}, "
                    f"{em.ptr(node.outputs[0])}, {image}, {out_rng}, {act}, {em.scratch()}, NT);", "}"]
        if node.attrs.get("int8_out") is not None:     # floats in, the next integer conv's bytes out
            _, out_rng, image = _int8_link_constants(em, node)
            return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                    f"  cuvil_depthwise_blocked_to_bytes(&s, {em.ptr(node.inputs[0])}, {w}, {bias}, {res}, "
                    f"(uint8_t *){em.ptr(node.outputs[0])}, {image}, {out_rng}, {act}, NT);", "}"]
        if node.attrs.get("mean_out"):               # the squeeze's mean too (passes/squeeze_excite.py)
            return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                    f"  cuvil_depthwise_blocked_mean(&s, {em.ptr(node.inputs[0])}, {w}, {bias}, {res}, "
                    f"{em.ptr(node.outputs[0])}, {act}, {em.ptr(node.outputs[1])}, {em.scratch()}, NT);", "}"]
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  cuvil_depthwise_blocked(&s, {em.ptr(node.inputs[0])}, {w}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, NT);", "}"]
    if plan.kind == "blocked_grouped":               # fp32 (no integer or bf16 kernel takes narrow groups)
        block = layout_block(node.attrs["layout"])
        w = em.packed(plan.pack, node.inputs[1], lambda d: grouped_filters_by_lane(d, block))
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  cuvil_conv_grouped_blocked(&s, {em.ptr(node.inputs[0])}, {w}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, NT);", "}"]
    if plan.kind == "blocked_winograd":
        up = em.packed(plan.pack, node.inputs[1], lambda d: winograd_filters_as_b(d, m, nr, node.attrs.get("groups", 1)))
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  _Static_assert(CUVIL_NR == {nr}, \"winograd filters packed for another panel width\");",
                f"  cuvil_conv3x3_winograd_blocked(&s, {m}, {em.ptr(node.inputs[0])}, {up}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {em.scratch()}, NT);", "}"]
    assert plan.kind == "blocked", plan.kind
    if computes_bf16(node, em.target):
        wb = em.packed("conv_blocked_bf16", node.inputs[1],
                       lambda d: bf16_filter_panels(d, node.attrs.get("groups", 1)), "uint32_t")
        return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
                f"  if (cuvil_conv_blocked_bf16(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {' | '.join(links) or 0}, {em.scratch()}, NT)) "
                "CUVIL_FAIL(\"out of memory for bf16 activations\");", "}"]
    wb = em.packed(plan.pack, node.inputs[1], lambda d: grouped_filters_as_b(d, node.attrs.get("groups", 1), nr))
    return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
            f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
            f"  cuvil_conv_blocked(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, {em.ptr(node.outputs[0])}, "
            f"{act}, {em.scratch()}, NT);", "}"]


def _gated_conv(em, node, plan, shape_struct, bias, res, act, nr):
    """A 1x1 conv with a gate folded in (passes/squeeze_excite.py), its filters packed as without one."""
    gate = node.inputs[4]
    if plan.kind not in ("blocked", "blocked_to_nchw") or computes_bf16(node, em.target):
        raise AssertionError(f"conv at {node.loc}: a gate folded into a conv of kind {plan.kind}")
    wb = em.packed(plan.pack, node.inputs[1], lambda d: grouped_filters_as_b(d, 1, nr))
    step = 0 if gate.shape[0] == 1 else node.inputs[0].shape[1]
    return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
            f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
            f"  if (cuvil_conv_blocked_gated(&s, {em.ptr(node.inputs[0])}, {wb}, {em.ptr(gate)}, {step}, {bias}, {res}, "
            f"{em.ptr(node.outputs[0])}, {act}, {int(plan.kind == 'blocked_to_nchw')}, {em.scratch()}, NT)) "
            "CUVIL_FAIL(\"out of memory for a conv's rows\");", "}"]


def lower_int8_conv(em, node, shape_struct, bias, res, act, input_kind, nchw_out=False):
    """input_kind: BLOCKED, NCHW or BYTES (kernels/blocked.h CUVIL_I8_IN_*); nchw_out: the output (and a
    float residual) in NCHW, not blocked, unless it goes out as the next conv's byte image (int8_out,
    pixel-major whatever the layout: the channels of an NCHW map pass to an integer reader that way too);
    the image and the ranges reach C as constants, checked by the op (ints, and floats within float32's
    range)."""
    w, a = node.inputs[1], node.attrs
    nchw_out = nchw_out and a.get("int8_out") is None
    wq = em.packed("conv_blocked_int8", w, lambda d: int8_filter_panels(d, a.get("groups", 1)), "uint32_t")
    terms = em.packed("conv_blocked_int8_terms", w, lambda d: filter_terms(filters_as_b(d)))
    rng, out_rng, image = _int8_link_constants(em, node)
    res_rng = _range_constant(em, node, "int8_res_range")
    return ["{", f"  const cuvil_conv_shape s = {shape_struct};",
            f"  if (cuvil_conv_blocked_int8(&s, {em.ptr(node.inputs[0])}, {wq}, {terms}, {bias}, {res}, {res_rng}, {rng}, "
            f"CUVIL_I8_IN_{input_kind}, {em.ptr(node.outputs[0])}, {int(nchw_out)}, {image}, {out_rng}, {act}, "
            f"{em.scratch()}, NT)) "
            "CUVIL_FAIL(\"out of memory for int8 activations\");", "}"]


def _int8_link_constants(em, node):
    """The input range, the output range and the output image (int8_out) of a conv in int8 as packed
    constants, "0" for those it has not; keyed by value too: two convs sharing one filter constant may
    differ in ranges."""
    w, a = node.inputs[1], node.attrs
    rng, out_rng = (_range_constant(em, node, k) for k in ("int8_range", "int8_out_range"))
    image = "0" if a.get("int8_out") is None else \
        em.packed(f"conv_int8_out:{a['int8_out']}", w, lambda d: np.array(a["int8_out"], np.int64), "int64_t")
    return rng, out_rng, image


def _range_constant(em, node, key):
    """A conv's [lo, hi] attribute `key` as a packed constant (keyed by value), "0" where it has none."""
    r = node.attrs.get(key)
    return "0" if r is None else em.packed(f"conv_{key}:{r}", node.inputs[1], lambda d: np.array(r, np.float32))


def lower_avg_pool(em, node, shape_struct, ph1, pw1, mode):
    """A blocked average pool (kernels/blocked.h cuvil_avg_pool_blocked; mode as cuvil_pool2d's)."""
    return ["{", "  " + block_check(node.attrs["layout"]), f"  const cuvil_conv_shape s = {shape_struct};",
            f"  cuvil_avg_pool_blocked(&s, {ph1}, {pw1}, {mode}, {em.ptr(node.inputs[0])}, {em.ptr(node.outputs[0])}, NT);",
            "}"]


def lower_max_pool(em, node, shape_struct):
    """A blocked max pool, or on the bytes an integer conv wrote for its readers (int8_in: pixel-major maps
    in and out, passes/quantize.link_int8_convs)."""
    x, y = em.ptr(node.inputs[0]), em.ptr(node.outputs[0])
    call = (f"cuvil_max_pool_bytes(&s, (const uint8_t *){x}, (uint8_t *){y}, NT);" if node.attrs.get("int8_in")
            else f"cuvil_max_pool_blocked(&s, {x}, {y}, NT);")
    return ["{", "  " + block_check(node.attrs["layout"]), f"  const cuvil_conv_shape s = {shape_struct};",
            "  " + call, "}"]


@lowering("relayout")
def lower_relayout(em, node):
    n, c, h, w = (D.to_c(d) for d in node.inputs[0].shape)
    to_blocked = node.attrs["to"] != "nchw"
    return ["{", "  " + block_check(node.attrs["to" if to_blocked else "from"]),
            f"  cuvil_relayout({n}, {c}, (int64_t)({h}) * ({w}), {int(to_blocked)}, "
            f"{em.ptr(node.inputs[0])}, {em.ptr(node.outputs[0])}, NT);", "}"]
