"""Which kernel a conv takes, decided once: conv_plan(node) returns the plan that both the conv's
scratch sizing and its lowering (lower_nn.lower_conv, lower_blocked.lower_conv) read, with the rules
it is decided by (Winograd, the swapped GEMM, im2col inside the GEMM) and the Winograd filter
transforms. cuvil_conv2d follows the plan's path and decides nothing itself."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import dims as D
from ...ir.ops.movement import layout_block
from ...ir.quant import INT8_MAX_K
from .gemm_plan import GEMM_MC, pack_a


def is_blocked(node) -> bool:
    return layout_block(node.attrs.get("layout", "nchw")) > 0


# an NCHW-input conv that gathers its rows (not 1x1) runs in int8 from this K (taps x channels) on: each
# row's copy costs what a few dot steps do. Profiled per conv (1 thread): ResNet-50's stem (K 147) 2.3 ms
# fp32 -> 1.16 ms int8; MobileNetV2's (K 27) 0.41 -> 0.50 ms, and 0.31 against fp32's 0.30 once its
# 9-byte runs were copied whole, so it stays fp32
INT8_MIN_GATHERED_NCHW_K = 64

# a channel-blocked conv takes bf16 products (precision="bf16", lower_bf16dot.links_bf16) from this many
# filters: the kernel's panels are 64 columns wide, so 16 or 32 filters multiply 4x or 2x the zeros they
# skip in fp32 (1x1 convs at 56x56, profile builds, 1 thread, Zen 4, bf16 / fp32 time: 16 filters
# 1.6-1.8x, 32 1.2-1.35x, 48 0.7-0.9x, 64 0.64-0.81x); a narrower 3x3 conv keeps Winograd
# (winograd_tile) though its map is small enough for direct bf16 products
BF16_MIN_FILTERS = 48
# ... and from this many products an output: over 16 input channels a 1x1 conv's time is its stores
# (16 -> 32 filters 2.1x, 16 -> 96 1.08x, 16 -> 128 0.97x)
BF16_MIN_K = 32


def bf16_filters_fit(node) -> bool:
    """Whether a conv's filters suit the bf16 kernels' panels (lower_bf16dot.links_bf16 asks the rest):
    BF16_MIN_FILTERS a group, and with groups, each group's channels whole blocks both ways."""
    w, groups = node.inputs[1].shape, node.attrs.get("groups", 1)
    if w[0] // groups < BF16_MIN_FILTERS:
        return False
    block = layout_block(node.attrs.get("layout", "nchw"))
    return groups == 1 or (block > 0 and w[1] % block == 0 and w[0] // groups % block == 0)


def int8_nchw(node) -> bool:
    """An NCHW conv marked for integer products (int8_act, passes/quantize.py) whose channels fill no
    block either side (ShuffleNet's 58 / 116 / 232, its 3x3 stride-2 convs between stages): kind
    "int8_nchw", the integer kernel with its input quantized from NCHW and its output turned back to NCHW
    (it had run in fp32); a gathered one from INT8_MIN_GATHERED_NCHW_K on."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if not (node.attrs.get("int8_act", 0) != 0 and not is_blocked(node) and node.attrs.get("in_layout") in (None, "nchw")
            and x.type.rank == 4 and w.is_const and node.attrs.get("groups", 1) == 1
            and all(isinstance(d, int) for d in x.shape[1:] + y.shape[1:])):
        return False
    if node.attrs["int8_act"] == 1 and winograd_tile(node):
        return False          # AVX2's integer products are slower than Winograd's saving
    K = int(np.prod(w.shape[1:]))
    return K <= INT8_MAX_K and (pointwise_conv(node) or K >= INT8_MIN_GATHERED_NCHW_K)


def reads_blocked_into_nchw(node) -> bool:
    """An NCHW conv that reads its input channel-blocked (passes/layout.into_nchw: output channels that
    fill no block, MobileNetV2's projections to 24 channels): kind "blocked_to_nchw"."""
    return not is_blocked(node) and layout_block(node.attrs.get("in_layout") or "nchw") > 0


def conv_shape(node, spatial_of):
    """The fields of the C cuvil_conv_shape (each dim through spatial_of) and the end pads (bottom, right)."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if x.type.rank == 3:
        H, W, KH, KW, OH, OW = 1, x.shape[2], 1, w.shape[2], 1, y.shape[2]
        st, pads, dl = (1, *node.attrs["strides"]), ((0, 0), *node.attrs["pads"]), (1, *node.attrs["dilations"])
    else:
        H, W, KH, KW, OH, OW = x.shape[2], x.shape[3], w.shape[2], w.shape[3], y.shape[2], y.shape[3]
        st, pads, dl = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
    vals = dict(N=x.shape[0], C=x.shape[1], H=H, W=W, O=w.shape[0], KH=KH, KW=KW, OH=OH, OW=OW,
                sh=st[0], sw=st[1], ph=pads[0][0], pw=pads[1][0], dh=dl[0], dw=dl[1],
                groups=node.attrs.get("groups", 1))
    return {k: spatial_of(v) for k, v in vals.items()}, (pads[0][1], pads[1][1])


WINOGRAD_MAX_W = 1024    # kernels/winograd.h: the widest row its stack buffers take
# filter transforms U = G g G^T: F(2x2, 3x3) and F(4x4, 3x3) (Lavin & Gray)
WINOGRAD_G = {2: np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
              4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                           [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}
# outputs per image from which F(4x4) replaces F(2x2), unless the CPU's row in tuning.PLAN_TUNING
# (blocked_winograd4_min_outputs) says otherwise for the blocked kernel. ResNet-50's 3x3 convs, interleaved A/B (1 / 2
# threads): 64 channels at 56x56 0.91 / 0.68x the time, 128 at 28x28 0.76 / 0.74x, 256 at 14x14
# 0.87 / 0.74x; 512 at 7x7 2.0x (its 4x4 tiles overhang the image by 30% and its filters, 2.25x the
# size, are read per call for 4 tiles)
WINOGRAD4_MIN_OUTPUTS = 12 * 12


def winograd_tile(node, winograd4_min=WINOGRAD4_MIN_OUTPUTS):
    """The output tile size of the Winograd conv this node takes (kernels/winograd.h), or 0: 3x3 stride-1
    convs with a constant filter and enough channels to fill the GEMMs. F(2x2, 3x3) spends 16 multiplies
    per 4 outputs and channel pair, F(4x4, 3x3) 36 per 16 (direct: 9 per output). winograd4_min: the
    outputs per image from which a channel-blocked conv takes F(4x4) (the target's PLAN_TUNING value)."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    a = node.attrs
    if a.get("int8_act") == 2 and a.get("in_layout") != "nchw":
        return 0              # integer products on VNNI (lower_int8dot.int8_conv_kind), direct (blocked, int8_nchw)
    if a.get("bf16_act") == 2 and bf16_filters_fit(node):
        return 0              # direct bf16 products on a small map (passes/quantize.py, tuning.PLAN_TUNING)
    if not (x.type.rank == 4 and w.is_const and tuple(w.shape[2:]) == (3, 3) and _winograd_groups(node)
            and tuple(a["strides"]) == (1, 1) and tuple(a["dilations"]) == (1, 1)
            and w.shape[0] // a.get("groups", 1) >= 16 and w.shape[1] >= 16 and isinstance(y.shape[3], int)
            and y.shape[3] + 3 <= WINOGRAD_MAX_W):
        return 0
    oh = y.shape[2]
    min4 = winograd4_min if is_blocked(node) else WINOGRAD4_MIN_OUTPUTS
    return 4 if isinstance(oh, int) and oh * y.shape[3] >= min4 else 2


def _winograd_groups(node):
    """Ungrouped, or grouped in the blocked layout with each group's channels whole blocks both ways
    (winograd_blocked.c runs one product per group on the group's blocks). RegNet's 64-channel groups
    between two 1x1 convs, the three convs' time direct -> Winograd, 1 / 2 threads (AVX-512): 512 channels
    at 14x14 3.01 -> 2.58 / 1.67 -> 1.47 ms (F4), 192 at 28x28 2.72 -> 1.71 / 1.72 -> 1.19, 128 at 56x56
    6.40 -> 3.90 / 3.50 -> 2.16; 1088 at 7x7 (F2) even both ways, as F4 there."""
    g, w = node.attrs.get("groups", 1), node.inputs[1]
    if g == 1:
        return True
    b = layout_block(node.attrs.get("layout", "nchw"))
    return b > 0 and node.attrs.get("in_layout") != "nchw" and w.shape[1] % b == 0 and (w.shape[0] // g) % b == 0


def winograd_filters(w: np.ndarray, m: int, mr: int) -> np.ndarray:
    """[O, C, 3, 3] -> the (m + 2)^2 transformed filter matrices U[i][j] (O x C), each packed as a GEMM A."""
    g = WINOGRAD_G[m]
    u = np.einsum("ik,ockl,jl->ijoc", g, w.astype(np.float64), g).astype(np.float32)
    return np.concatenate([pack_a(u[i, j], mr) for i in range(m + 2) for j in range(m + 2)])


def pointwise_conv(node):
    """A 1x1 conv (any rank), stride 1, no pads at either end: its input is already the (transposed)
    A of its GEMM, or its B."""
    a = node.attrs
    return (all(k == 1 for k in node.inputs[1].shape[2:]) and all(st == 1 for st in a["strides"])
            and all(p == 0 for pair in a["pads"] for p in pair))


def depthwise_conv(node):
    """One filter (or a multiple) per input channel: cuvil_conv2d's direct loops read w as it is."""
    return node.attrs.get("groups", 1) > 1 and node.inputs[1].shape[1] == 1


def swappable_conv(node):
    """A 2-d ungrouped conv with constant filters and a static output size that Winograd does not take:
    a GEMM of (pixels x in-channel taps) @ (taps x out channels), its input read through im2col rows
    unless pointwise_conv."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    return (x.type.rank == 4 and w.is_const and node.attrs.get("groups", 1) == 1
            and all(isinstance(d, int) for d in y.shape[2:]) and not winograd_tile(node))


# when a conv's GEMM takes its pixels as rows (cuvil_conv_swapped): the empty share of the panel lanes
# that the pixels leave as columns, times K (in channels x taps), at least this. The swap saves the
# empty lanes' multiply-adds (each K deep) and costs one more pass over the product (the transpose to
# NCHW), whatever K. ResNet-50's 1x1 convs in a C harness, swapped / as they were (1 thread): 2048 ->
# 512 at 7x7 (23% empty, K = 2048) 0.80x the time, 512 -> 2048 (K = 512) 0.85x, 1024 -> 256 at 14x14
# (12.5%, K = 1024) 0.95x, 256 -> 1024 (K = 256) 1.0x
SWAP_MIN_EMPTY_K = 64


def swapped(node, nr):
    """Whether this conv runs as cuvil_conv_swapped (kernels/conv.h), its pixels as the GEMM's rows."""
    if not swappable_conv(node):
        return False
    pixels = node.outputs[0].shape[2] * node.outputs[0].shape[3]
    lanes = -(-pixels // nr) * nr
    return (lanes - pixels) / lanes * int(np.prod(node.inputs[1].shape[1:])) >= SWAP_MIN_EMPTY_K


# cuvil_conv2d's paths (kernels/conv.h: cuvil_conv_path), by name
CONV2D_PATHS = {"depthwise": "CUVIL_CONV_DEPTHWISE", "input_as_b": "CUVIL_CONV_INPUT_AS_B",
                "implicit": "CUVIL_CONV_IMPLICIT", "im2col": "CUVIL_CONV_IM2COL"}


def conv2d_path(node) -> str:
    """What cuvil_conv2d does with this conv: depthwise loops; the input as the GEMM's B (pointwise);
    im2col inside the GEMM, one M block of filters; or im2col whole into scratch, which several M
    blocks would otherwise each redo."""
    if depthwise_conv(node):
        return "depthwise"
    if pointwise_conv(node):
        return "input_as_b"
    return "implicit" if node.inputs[1].shape[0] // node.attrs.get("groups", 1) <= GEMM_MC * 3 // 2 else "im2col"


@dataclass(frozen=True)
class ConvPlan:
    """kind: "nd" (direct loops of a 3-d conv, direct_nd.conv_nd); channel-blocked (kernels/blocked.h):
    "blocked_from_nchw" (NCHW input), "blocked_to_nchw" (NCHW output),
    "blocked_depthwise", "blocked_grouped", "blocked_winograd", "blocked"; NCHW: "int8_nchw" (a 1x1 conv in integer products),
    "winograd", "swapped" (cuvil_conv_swapped), "gemm" (cuvil_conv2d), or "swappable" when no panel
    width was given (the target decides between "swapped" and "gemm"; the scratch covers both).
    winograd: the Winograd output tile size (0: none). pack: the name under which the filters are
    packed at compile time (Emitter.packed), None when the kernel reads them as they are.
    path: what cuvil_conv2d does (conv2d_path) for kind "gemm", else None.
    scratch_bytes: the scratch at the dims' upper bounds (None when no bounds were given)."""
    kind: str
    winograd: int = 0
    pack: str | None = None
    path: str | None = None
    scratch_bytes: int | None = None


def _kind(node, m, nr, grouped_min_w=0):
    if node.inputs[0].type.rank == 5:
        return "nd", None
    if reads_blocked_into_nchw(node):
        return "blocked_to_nchw", "conv_blocked_b"       # (integer products pack their own)
    if int8_nchw(node):
        return "int8_nchw", None
    if is_blocked(node):
        if node.attrs.get("in_layout") == "nchw":
            return "blocked_from_nchw", "conv_nchw_blocked_b"
        if node.attrs.get("groups", 1) > 1 and depthwise_conv(node):
            return "blocked_depthwise", "depthwise_blocked"
        if grouped_direct(node, grouped_min_w):
            return "blocked_grouped", "grouped_blocked"
        if m:
            return "blocked_winograd", f"winograd{m}_blocked_b"
        return "blocked", "conv_blocked_b"
    if m:
        return "winograd", f"winograd{m}_a"
    if nr is None and swappable_conv(node):
        return "swappable", None
    if nr is not None and swapped(node, nr):
        return "swapped", "conv_b"
    # filters packed at compile time into the GEMM's A tiles only
    return "gemm", "conv_a" if node.inputs[1].is_const and not depthwise_conv(node) else None


def grouped_direct(node, block_min_width=0) -> bool:
    """A blocked grouped conv that takes the direct grouped kernel (kernels/grouped_blocked.c:
    cuvil_conv_grouped_blocked): groups narrower than a block (passes/layout.narrow_groups: by lane
    permutes), or of one block each where the output rows are at least block_min_width wide (the
    target's tuning.PLAN_TUNING value; 0: never)."""
    g, w, y = node.attrs.get("groups", 1), node.inputs[1], node.outputs[0]
    block = layout_block(node.attrs.get("layout", "nchw"))
    if g <= 1 or block <= 0 or depthwise_conv(node) or node.attrs.get("in_layout") == "nchw":
        return False
    whole = w.shape[1] == block and w.shape[0] // g == block and 0 < block_min_width <= y.shape[3]
    return w.shape[1] < block or whole


def padded_extent(s):
    """(hp, wp, in_place) of kernels/blocked_input.h: the padded extent that holds every tap of every
    output pixel, and whether the input is read in place (no window reaches past it)."""
    hp = (s["OH"] - 1) * s["sh"] + (s["KH"] - 1) * s["dh"] + 1
    wp = (s["OW"] - 1) * s["sw"] + (s["KW"] - 1) * s["dw"] + 1
    return hp, wp, s["ph"] == s["pw"] == 0 and hp <= s["H"] and wp <= s["W"]


def _blocked_scratch(node, s, m) -> int:
    """Bytes of a blocked conv's scratch (kernels/blocked.h: cuvil_conv_blocked_scratch and
    cuvil_winograd_blocked_scratch)."""
    if node.attrs.get("in_layout") == "nchw":      # kernels/blocked.c: cuvil_conv_nchw_blocked_scratch
        hp, wp, _ = padded_extent(s)
        fp32 = (s["C"] * hp * wp + 2 * s["OH"] * s["OW"]) * 4
        return max(fp32, _int8_scratch(node, s)) if node.attrs.get("int8_act") else fp32
    if grouped_direct(node):
        return 0                                      # reads the map in place, tests the pads
    if node.attrs.get("groups", 1) > 1 and depthwise_conv(node):
        # kernels/depthwise_bytes.c cuvil_depthwise_bytes_scratch: the scaled filters and the biases;
        # cuvil_depthwise_blocked_mean's: each output row's sum (passes/squeeze_excite.py)
        if node.attrs.get("int8_in"):
            return (s["KH"] * s["KW"] + 1) * s["C"] * 4
        return s["N"] * s["O"] * s["OH"] * 4 if node.attrs.get("mean_out") else 0
    if m:
        return (m + 2) ** 2 * (s["C"] + s["O"]) * -(-s["OH"] // m) * -(-s["OW"] // m) * 4
    return _int8_scratch(node, s) if node.attrs.get("int8_act") else _gathered_floats(node, s) * 4


def _gate_scratch(node, s) -> int:
    """Bytes of kernels/blocked.h cuvil_conv_gated_scratch: a conv with a gate folded in
    (passes/squeeze_excite.py) scales its filters, packed in panels of two blocks, into scratch first."""
    if len(node.inputs) < 5 or node.inputs[4] is None:
        return 0
    nr = 2 * layout_block(node.attrs.get("in_layout") or node.attrs["layout"])
    return -(-s["O"] // nr) * nr * s["C"] * 4


def _gathered_floats(node, s) -> int:
    """kernels/blocked.c cuvil_conv_blocked_scratch: the zero-padded copy and the pixel and tap tables."""
    if pointwise_conv(node):
        return 0                                      # the input is the GEMM's A
    hp, wp, in_place = padded_extent(s)
    return (0 if in_place else s["C"] * hp * wp) + 2 * (s["OH"] * s["OW"] + s["KH"] * s["KW"])


def _int8_scratch(node, s) -> int:
    """Bytes of kernels/blocked_dot.c cuvil_conv_blocked_int8_scratch: cuvil_conv_blocked's, the quantized
    image where that has no copy to hold it (and SHORT_RUN = 32 bytes past it for a short run's read), two
    columns' terms. At least the fp32 conv's."""
    in_place = pointwise_conv(node) or padded_extent(s)[2]
    image = -(-s["C"] * s["H"] * s["W"] // 4) if in_place else 0
    return (-(-(_gathered_floats(node, s) + image + 8) // 16) * 16 + 2 * s["O"]) * 4


def _gemm_scratch(node, s, m) -> int:
    if m:
        tiles, alpha2 = -(-s["OH"] // m) * -(-s["OW"] // m), (m + 2) ** 2
        return alpha2 * ((-(-tiles // 64) * 64 * s["C"]) + s["O"] * tiles) * 4
    if conv2d_path(node) in ("depthwise", "implicit"):
        return 0
    K = (s["C"] // s["groups"]) * s["KH"] * s["KW"]
    N = s["OH"] * s["OW"]
    return (-(-N // 64) * 64 * K) * 4


def _scratch(node, bounds, m) -> int:
    s, _ = conv_shape(node, lambda d: D.upper_bound(d, bounds))
    if is_blocked(node) or reads_blocked_into_nchw(node) or int8_nchw(node):
        return _blocked_scratch(node, s, m) + _gate_scratch(node, s)
    # the swapped form's pixel-major product (conv.c: swapped_ldc) and im2col rows; whether it is taken
    # depends on the target's panel width
    swapped_bytes = 0
    if swappable_conv(node):
        rows = 0 if pointwise_conv(node) else s["C"] * s["KH"] * s["KW"]
        swapped_bytes = ((s["O"] + 16) + rows) * s["OH"] * s["OW"] * 4
    return max(swapped_bytes, _gemm_scratch(node, s, m))


def conv_plan(node, nr=None, bounds=None, winograd4_min=WINOGRAD4_MIN_OUTPUTS, grouped_min_w=0) -> ConvPlan:
    """The kernel this conv takes and what it needs. nr: the target's panel width (gemm_plan.panel_width),
    which decides "swapped"; bounds: the symbols' bounds, from which scratch_bytes is computed;
    winograd4_min: winograd_tile's; grouped_min_w: grouped_direct's. The scratch covers both Winograd tiles
    and the grouped GEMM, so the memory plan needs no target."""
    m = 0 if reads_blocked_into_nchw(node) else winograd_tile(node, winograd4_min)   # (blocked into NCHW: no Winograd kernel)
    kind, pack = _kind(node, m, nr, grouped_min_w)
    scratch = None if bounds is None else max(_scratch(node, bounds, t) for t in ((2, 4) if m else (0,)))
    return ConvPlan(kind, m, pack, conv2d_path(node) if kind == "gemm" else None, scratch)
