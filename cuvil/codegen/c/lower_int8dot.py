"""Channel-blocked convs in integer products (compile's precision="int8" on a target with AVX-512
VNNI, or AVX2; passes/quantize.py marks them int8_act): the filters as signed bytes per output channel
in the panels kernels/int8dot.h reads (each group's its own), each channel's scale and filter sum, and
the call of cuvil_conv_blocked_int8, from a blocked or an NCHW input (a stem, channels no block holds);
on VNNI 3x3 convs too (no Winograd at int8: conv_plan.winograd_tile). Depthwise convs stay fp32. Linear
layers on a quantized model's own activation grid (matmul_q's int8_range) through cuvil_matmul_int8, and
where the target has AMX tiles, precision="int8"'s dynamic ones too, each row on its own range."""
from __future__ import annotations

import numpy as np

from ...ir import quant
from ...target import AMX_FEATURES, has_features, target_arch
from . import cexpr
from .conv_plan import INT8_MIN_GATHERED_NCHW_K, conv_plan, conv_shape, is_blocked, padded_extent, pointwise_conv
from .gen_activations import ACT_CODES

I8_NR = 64                    # kernels/int8dot.h CUVIL_I8_NR
INT8_FEATURES = ("avx512_vnni", "avx512bw")      # vpdpbusd: bytes 0..255, 3x3 convs direct too
INT8_AVX2_FEATURES = ("avx2",)                    # vpmaddubsw: bytes 0..127, 3x3 convs keep fp32 Winograd


def int8_group_panels(q: np.ndarray, groups: int) -> np.ndarray:
    """Each group's columns of a grouped conv's int8 B [K, O] in their own panels, one group after another
    (kernels/blocked_dot.c reads group g's at g * its panel words)."""
    og = q.shape[1] // groups
    return np.concatenate([int8_dot_panels(q[:, g * og:(g + 1) * og]).ravel() for g in range(groups)])


def int8_dot_panels(q: np.ndarray) -> np.ndarray:
    """int8 [K, N] -> uint32 [ceil(N/64), ceil(K/4), 64]: word (p, k4, j) holds rows 4 k4 .. 4 k4 + 3 of
    column 64 p + j in its bytes 0 .. 3, zeros past K and N."""
    K, N = q.shape
    K4, n = -(-K // 4), -(-N // I8_NR)
    full = np.zeros((4 * K4, n * I8_NR), np.uint8)
    full[:K, :N] = q.view(np.uint8)
    words = full.reshape(K4, 4, n * I8_NR).transpose(0, 2, 1).copy().view(np.uint32)[..., 0]   # [K4, n * 64]
    return np.ascontiguousarray(words.reshape(K4, n, I8_NR).transpose(1, 0, 2))


def quantized_filters(b: np.ndarray):
    """A conv's B [K, O] (filters_as_b) -> (int8 [K, O], scales [O]): a filter already on an int8 grid (QAT,
    QDQ) keeps it, any other is rounded per output channel, symmetric."""
    q, s = quant.int8_grid(b) or quant.quantize_int8(b)
    return q, s.reshape(-1)


def filter_terms(b: np.ndarray) -> np.ndarray:
    """[2, O] float32: each output channel's scale, and its scale times the sum of its integer filter
    (the zero point's share of the integer sums, kernels/blocked.h cuvil_conv_blocked_int8)."""
    return int8_matmul_terms(*quantized_filters(b))


def int8_conv_kind(target: str) -> int:
    """What a target's int8 convs are (passes/quantize.py marks int8_act with it): 2 with VNNI (every
    blocked conv, 3x3 ones direct instead of Winograd: 250 -> 390-410 GOP/s on ResNet-50's), 1 on AVX2
    (its products run at about twice fp32 FMAs', short of Winograd's saving: 3x3 convs stay fp32),
    0 without integer convs."""
    if has_features(target, INT8_FEATURES):
        return 2
    return 1 if target_arch(target) == "x86_64" and has_features(target, INT8_AVX2_FEATURES) else 0


def computes_int8(node, target: str | None = None) -> bool:
    """Whether this conv runs on the integer dot-product kernels for `target` (None: the one its int8_act
    was marked for)."""
    if node.op != "conv" or node.attrs.get("int8_act", 0) == 0 or (target is not None and not int8_conv_kind(target)):
        return False
    w, kind, groups = node.inputs[1].shape, conv_plan(node).kind, node.attrs.get("groups", 1)
    K = w[1] * int(np.prod(w[2:]))                 # per group
    if kind == "blocked_from_nchw" and not pointwise_conv(node) and K < INT8_MIN_GATHERED_NCHW_K:
        return False
    # grouped convs (RegNet's, ResNeXt's) whose groups fill channel blocks are blocked (passes/layout.py);
    # depthwise ones are not "blocked" but "blocked_depthwise"
    return (kind in ("blocked", "blocked_to_nchw", "int8_nchw") or (kind == "blocked_from_nchw" and groups == 1)) and K <= quant.INT8_MAX_K


def depthwise_on_bytes(node) -> bool:
    """Whether this depthwise conv can read the byte image the integer conv before it writes
    (kernels/depthwise_bytes.c): channel-blocked, marked for a target with integer convs, over a fixed
    input range (calibrated), its activation a clamp (none, ReLU, ReLU6) and no residual, so that its
    output map folds into its filters. (EfficientNet-B0's SiLU ones on bytes had made its calibrated int8
    7.0 ms against 6.3 with them on floats, MobileNetV3-ish's hardswish ones 3.0 against 2.8; the kernel
    takes them, the link does not.) It does where passes/quantize.link_int8_convs linked it (int8_in)."""
    a = node.attrs
    return (node.op == "conv" and a.get("int8_act", 0) != 0 and a.get("int8_range") is not None
            and conv_plan(node).kind == "blocked_depthwise"
            and a["act"] in ("none", "relu", "relu6") and len(node.inputs) < 4)


def writes_int8_input(node) -> bool:
    """Whether this conv can write the next integer conv's input bytes (int8_out): an integer conv, or a
    channel-blocked depthwise conv marked for integer products, on bytes (its output stays in bytes
    between the two 1x1 convs around it) or on floats (MobileNets' first, after the float stem:
    kernels/blocked.c cuvil_depthwise_blocked_to_bytes; its 1.6 MB of floats at 112x112 had been written,
    then read back and quantized by the 1x1 conv after it)."""
    if computes_int8(node):
        # into NCHW too, bytes being pixel-major whatever the layout; but a float residual in NCHW is added
        # as the rows are turned into NCHW, so such a conv writes bytes only where its residual is bytes
        # too (passes/quantize.link_int8_convs links the residual's producer first: it comes first)
        return not (conv_plan(node).kind in ("blocked_to_nchw", "int8_nchw") and len(node.inputs) > 3
                    and node.inputs[3] is not None and node.attrs.get("int8_res_range") is None)
    if depthwise_on_bytes(node) and node.attrs.get("int8_in") == 1:
        return True
    return (node.op == "conv" and node.attrs.get("int8_act", 0) != 0 and not node.attrs.get("int8_in")
            and conv_plan(node).kind == "blocked_depthwise")


def reads_int8_residual(node) -> bool:
    """Whether this conv can read its residual as the bytes an integer conv wrote (int8_res_range): an
    integer conv, whose epilogue widens them (kernels/dot_out.h; into NCHW, that of its rows before they
    are turned, kernels/blocked_dot.c)."""
    return computes_int8(node) and len(node.inputs) > 3


def pools_bytes(node) -> bool:
    """Whether this max pool can take an integer conv's bytes and give its readers theirs
    (kernels/blocked.c cuvil_max_pool_bytes): a 2-d one in the channel-blocked layout, static."""
    x = node.inputs[0]
    return (node.op == "max_pool" and is_blocked(node) and x.type.rank == 4
            and all(isinstance(d, int) for d in x.shape[1:]))


def int8_input_image(node):
    """[hp, wp, ph, pw]: the padded byte image of an integer conv's input, channel-blocked or NCHW
    (kernels/blocked_dot.c: hp x wp pixels of C bytes, the map at (ph, pw); the map itself where the conv
    reads in place), or None for a conv that is no such one. A depthwise conv on bytes reads the same
    image."""
    if not (depthwise_on_bytes(node) or computes_int8(node)):     # an NCHW input's channels: the same pixels
        return None
    s, _ = conv_shape(node, lambda d: d)       # spatial dims are static in a blocked conv
    hp, wp, in_place = padded_extent(s)
    return [s["H"], s["W"], 0, 0] if in_place else [hp, wp, s["ph"], s["pw"]]


def computes_int8_matmul(node, target: str) -> bool:
    """Whether this matmul_q multiplies its input on the model's own byte grid (int8_range) for `target`:
    VNNI's bytes of 256 levels (passes/quantize.py asks for no other), and a K whose integer sums cannot
    overflow; else its int8 weights meet fp32 activations."""
    return (node.op == "matmul_q" and node.attrs.get("int8_range") is not None and int8_conv_kind(target) == 2
            and node.inputs[1].shape[0] <= quant.INT8_MAX_K)


def computes_int8_matmul_on_tiles(node, target: str) -> bool:
    """Whether this dynamic int8 matmul_q (passes/quantize's dynamic_range: precision="int8" without a
    model's grid; not the LLM path's) runs on
    cuvil_matmul_int8 with each row of x on bytes over its own range (ONNX Runtime's quantize_dynamic takes
    one range per tensor; per row kept MiniLM's padded rows within the zoo's bound, per tensor did not), for
    `target`: where it has AMX tiles (kernels/amx.h tdpbusd), which multiply bytes ~8x faster than VNNI,
    whose path keeps qgemm.c's blocks of 32-128 values a scale; the weight unpadded (K a multiple of 32)."""
    if node.op != "matmul_q" or not node.attrs.get("dynamic_range") or node.attrs["bits"] != 8:
        return False
    K = node.inputs[1].shape[0]
    return (has_features(target, AMX_FEATURES) and int8_conv_kind(target) == 2 and K == node.inputs[0].shape[-1]
            and K <= quant.INT8_MAX_K)


def int8_matmul_terms(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[2, N] float32: each column's weight scale, and that times the sum of its integer weights."""
    s = scales.reshape(-1).astype(np.float32)
    return np.stack([s, s * q.astype(np.int64).sum(axis=0)]).astype(np.float32)


def lower_int8_matmul(em, node):
    """matmul_q with an int8_range: kernels/int8dot.h cuvil_matmul_int8 (the range reaches C as a packed
    constant, checked by the op); without one (computes_int8_matmul_on_tiles) each call's own range."""
    x, w, sc = node.inputs[:3]
    res = node.inputs[3] if len(node.inputs) > 3 else None
    bias = node.inputs[4] if len(node.inputs) > 4 else None
    K, N = w.shape[0], node.outputs[0].shape[-1]
    r = node.attrs.get("int8_range")
    wq = em.packed("matmul_int8", w, int8_dot_panels, "uint32_t")
    terms = em.packed("matmul_int8_terms", w, lambda d: int8_matmul_terms(d, sc.data))
    rng = em.packed(f"matmul_int8_range:{r}", w, lambda d: np.array(r, np.float32)) if r is not None else "0"
    ptr = lambda v: em.ptr(v) if v is not None else "0"     # noqa: E731
    return ["{", f"  if (cuvil_matmul_int8({cexpr.prod(x.shape[:-1])}, {N}, {K}, {em.ptr(x)}, {K}, {wq}, {terms}, "
            f"{ptr(bias)}, {ptr(res)}, {rng}, {em.ptr(node.outputs[0])}, {N}, {ACT_CODES[node.attrs['act']]}, NT)) "
            "CUVIL_FAIL(\"out of memory for int8 activations\");", "}"]
