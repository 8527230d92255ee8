"""matmul_q over bf16 weights, and channel-blocked convs (and stems from an NCHW input), on CPUs that
multiply in bf16 (AVX512-BF16): the panels their kernels read (kernels/bf16dot.h, cuvil_conv_blocked_bf16,
cuvil_conv_nchw_blocked_bf16) and the calls. Taken for
nodes whose inputs may be rounded to bf16 (bf16_act, set by compile's precision="bf16"); elsewhere
matmul_q widens the weights to fp32 (lower_llm.lower_matmul_q) and convs stay fp32. Winograd and
depthwise convs stay fp32 too: Winograd's F(4x4, 3x3) saves more multiplications than bf16's two per
instruction, and a depthwise conv has no dot products to pair."""
from __future__ import annotations

import numpy as np

from ...target import has_features
from . import cexpr
from .conv_plan import BF16_MIN_K, bf16_filters_fit, conv_plan

BF16_NR = 64                  # kernels/bf16dot.h CUVIL_BF16_NR
BF16_FEATURES = ("avx512_bf16",)
# a conv from an NCHW input (a stem) takes bf16 products from this many products an output (K): ResNet's
# 7x7 stem (K 147); a MobileNet's 3x3 (K 27) gathers more than it multiplies, as in int8
# (conv_plan.INT8_MIN_GATHERED_NCHW_K)
BF16_MIN_NCHW_K = 64


def bf16_dot_panels(w: np.ndarray) -> np.ndarray:
    """bf16 bit patterns [K, N] (uint16) -> uint32 [ceil(N/64), ceil(K/2), 64]: word (p, k2, j) holds
    rows 2 k2 (low half) and 2 k2 + 1 (high half) of column 64 p + j, zeros past K and N."""
    K, N = w.shape
    K2, n = -(-K // 2), -(-N // BF16_NR)
    full = np.zeros((2 * K2, n * BF16_NR), np.uint32)
    full[:K, :N] = w
    words = full[0::2] | (full[1::2] << 16)                       # [K2, n * 64]
    return np.ascontiguousarray(words.reshape(K2, n, BF16_NR).transpose(1, 0, 2))


def multiplies_bf16(target: str) -> bool:
    """Whether `target` has the bf16 dot products (the kernels' instruction; elsewhere bf16 marks change
    no conv, and no two convs may pass bf16 maps: passes/quantize.link_bf16_convs)."""
    return has_features(target, BF16_FEATURES)


def computes_bf16(node, target: str) -> bool:
    """Whether this matmul_q or conv runs on the bf16 dot-product kernels for `target`."""
    if not multiplies_bf16(target):
        return False
    return links_bf16(node) or (node.op == "matmul_q" and node.attrs.get("bf16_act", 0) in (1, 2)
                                and node.attrs["bits"] == 16 and node.inputs[1].dtype == "uint16")


def links_bf16(node) -> bool:
    """Whether this conv runs on the bf16 dot-product kernels where the target has them
    (from BF16_MIN_FILTERS filters a group: cuvil_conv_blocked_bf16 from BF16_MIN_K products an output,
    grouped where each group's channels are whole blocks both ways, and
    cuvil_conv_nchw_blocked_bf16 for a stem of BF16_MIN_NCHW_K products an output), which read and write
    bf16 maps (passes/quantize.link_bf16_convs; a stem's input is an NCHW map, which no channel-blocked
    conv writes)."""
    if node.op != "conv" or node.attrs.get("bf16_act", 0) not in (1, 2):
        return False
    kind, K = conv_plan(node).kind, int(np.prod(node.inputs[1].shape[1:]))
    # with groups, each group a GEMM of its own on whole channel blocks (RegNet's 64-channel groups)
    return bf16_filters_fit(node) and (kind == "blocked" and K >= BF16_MIN_K
                                       or kind == "blocked_from_nchw" and K >= BF16_MIN_NCHW_K)


def lower_bf16_dot(em, node, ep_lines, ep):
    x, w = node.inputs[0], node.inputs[1]
    K, N = w.shape[0], node.outputs[0].shape[-1]
    wp = em.packed("bf16dot", w, bf16_dot_panels, "uint32_t")
    M = cexpr.prod(x.shape[:-1])
    return ["{", *ep_lines,
            f"  if (cuvil_sgemm_bf16dot({M}, {N}, {K}, {em.ptr(x)}, {K}, {wp}, {em.ptr(node.outputs[0])}, {N}, "
            f"{ep}, NT)) CUVIL_FAIL(\"out of memory for bf16 activations\");", "}"]
