"""C lowering of matmul, convolution, pooling and the composite ops (softmax, norms)."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from . import cexpr, lower_blocked
from .gen_activations import ACT_CODES
from .emit import lowering
from .loops import broadcast_strides

def panel_width(em):
    """Columns per packed panel for this build's target (2 vectors): see kernels/gemm.h."""
    from ...target import vector_floats
    return 2 * vector_floats(em.target)


def tile_rows(em):
    """Rows of the GEMM's register tile for this build's target (CUVIL_MR): see kernels/gemm.h."""
    return 8 if panel_width(em) == 32 else 6


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> panels [ceil(N/nr), K, nr], zero padded (the layout cuvil_sgemm_packed reads)."""
    K, N = b.shape
    npan = -(-N // nr)
    out = np.zeros((npan, K, nr), np.float32)
    padded = np.zeros((K, npan * nr), np.float32)
    padded[:, :N] = b
    out[:] = padded.reshape(K, npan, nr).transpose(1, 0, 2)
    return out


# kernels/gemm.h's K block and M block: with the target's tile rows (tile_rows), the layout of a
# prepacked A operand, and the M blocks a conv's GEMM runs in (one: im2col inside the GEMM; several:
# im2col once, whole)
GEMM_KC, GEMM_MC = 384, 120


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
    """[M, K] -> the tiles cuvil_sgemm_packed_ab reads: per K block of GEMM_KC, per tile of mr
    rows, [kc][mr] (zero rows past M)."""
    M, K = a.shape
    tiles = -(-M // mr)
    padded = np.zeros((tiles * mr, K), np.float32)
    padded[:M] = a
    blocks = [padded[:, k0:k0 + GEMM_KC].reshape(tiles, mr, -1).transpose(0, 2, 1).ravel()
              for k0 in range(0, K, GEMM_KC)]
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)


def _mat_dims(v, is_b):
    s = v.type.shape
    if len(s) == 1:
        return ((), s[0], 1) if is_b else ((), 1, s[0])
    return s[:-2], s[-2], s[-1]


def _prepacked(node):
    """A constant float32 B without batch dims is packed at compile time; every other B at run time
    (other dtypes take the naive kernel, which reads B as it is)."""
    a, b = node.inputs[:2]
    abatch, bbatch = _mat_dims(a, False)[0], _mat_dims(b, True)[0]
    obatch = node.outputs[0].type.shape[:node.outputs[0].type.rank - (a.type.rank >= 2) - (b.type.rank >= 2)]
    return a.dtype == "float32" and b.is_const and not bbatch and (not abatch or len(abatch) == len(obatch))


def _matmul_scratch(node, bounds):
    a, b = node.inputs[:2]
    if a.dtype != "float32" or _prepacked(node):
        return 0
    _, K, N = _mat_dims(b, True)
    K, N = D.upper_bound(K, bounds), D.upper_bound(N, bounds)
    nr = 64  # widest panel (AVX-512): safe upper bound for every target
    return (-(-N // nr) * nr * K) * 4


def _matmul_supports(node):
    dt = node.inputs[0].dtype
    return None if dt in ("float32", "float64", "int64", "int32") else f"dtype {dt} (float32, float64, int64, int32)"




def _epilogue(em, node):
    """C initialiser of the cuvil_epilogue of a matmul_fused node (None for a plain matmul)."""
    if node.op != "matmul_fused":
        return None
    bias = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else "0"
    res = em.ptr(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else "0"
    n = D.to_c(node.outputs[0].shape[-1])
    return (f"{{.bias_row = 0, .bias_col = {bias}, .residual = {res}, .ldr = {n}, "
            f".alpha = {float(node.attrs['alpha'])!r}f, .act = {ACT_CODES[node.attrs['act']]}}}")


def _fused_supports(node):
    return None if node.inputs[0].dtype == "float32" and _prepacked(node) else "epilogue fusion needs a float32 weight"


@lowering("matmul_fused", supports=_fused_supports)
def lower_matmul_fused(em, node):
    return lower_matmul(em, node)


@lowering("matmul", scratch=_matmul_scratch, supports=_matmul_supports)
def lower_matmul(em, node):
    a, b = node.inputs[:2]
    y = node.outputs[0]
    abatch, M, K = _mat_dims(a, False)
    bbatch, _, N = _mat_dims(b, True)
    obatch = y.type.shape[:len(y.type.shape) - (a.type.rank >= 2) - (b.type.rank >= 2)]
    A, Y = em.ptr(a), em.ptr(y)
    B = None if _prepacked(node) else em.ptr(b)      # a prepacked weight is stored only as panels
    Mc, Nc, Kc = D.to_c(M), D.to_c(N), D.to_c(K)
    lines = ["{"]
    if a.dtype == "float32":
        if _prepacked(node):
            # weights: packed at compile time; all batch rows form one tall GEMM
            nr = panel_width(em)
            Bp = em.packed("panels", b, lambda d: pack_b(d if d.ndim == 2 else d.reshape(-1, 1), nr))
            Mt = cexpr.prod(list(abatch) + [M])
            ep = _epilogue(em, node)
            if ep:
                lines.append(f"  const cuvil_epilogue ep = {ep};")
            lines.append(f"  cuvil_sgemm_packed({Mt}, {Nc}, {Kc}, {A}, {Kc}, {Bp}, {Y}, {Nc}, {'&ep' if ep else '0'}, NT, "
                         f"{int(em.weights_cached)});")
            lines.append("}")
            return lines
        body = [f"cuvil_pack_b({Kc}, {Nc}, {B} + boff, {Nc}, 0, {em.scratch()}, NT);",
                f"cuvil_sgemm_packed({Mc}, {Nc}, {Kc}, {A} + aoff, {Kc}, {em.scratch()}, {Y} + yoff, {Nc}, 0, NT, 1);"]
    else:
        fn = {"float64": "cuvil_matmul_f64", "int64": "cuvil_matmul_i64", "int32": "cuvil_matmul_i32"}[a.dtype]
        body = [f"{fn}({Mc}, {Nc}, {Kc}, {A} + aoff, {Kc}, {B} + boff, {Nc}, {Y} + yoff, {Nc});"]
    # batch loop with broadcast strides (in matrices)
    ast = broadcast_strides(abatch, obatch)
    bst = broadcast_strides(bbatch, obatch)
    iv = [f"n{k}" for k in range(len(obatch))]
    for k, d in enumerate(obatch):
        lines.append("  " * (k + 1) + f"for (int64_t {iv[k]} = 0; {iv[k]} < {D.to_c(d)}; {iv[k]}++)")
    yoff = "0"
    for k, d in enumerate(obatch):
        yoff = f"({yoff}) * ({D.to_c(d)}) + {iv[k]}"
    aoff = " + ".join([f"{iv[k]} * {D.to_c(s)}" for k, s in enumerate(ast) if s != 0] or ["0"])
    boff = " + ".join([f"{iv[k]} * {D.to_c(s)}" for k, s in enumerate(bst) if s != 0] or ["0"])
    ind = "  " * (len(obatch) + 1)
    lines.append(ind + "{")
    lines.append(ind + f"  const int64_t aoff = ({aoff}) * {Mc} * {Kc}, boff = ({boff}) * {Kc} * {Nc}, "
                 f"yoff = ({yoff}) * {Mc} * {Nc};")
    lines += [ind + "  " + s for s in body]
    lines.append(ind + "}")
    lines.append("}")
    return lines


def _conv_supports(node):
    x = node.inputs[0]
    if x.type.rank not in (3, 4, 5) or (x.type.rank == 5 and not all(
            isinstance(d, int) for v in node.inputs[:2] + node.outputs for d in v.shape)):
        return f"{x.type.rank - 2}-d convolution (1-d, 2-d and static 3-d are supported)"
    if x.dtype != "float32":
        return f"dtype {x.dtype} (float32 is supported)"
    return None


def _conv_shape(node, spatial_of):
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
# outputs per image from which F(4x4) replaces F(2x2). ResNet-50's 3x3 convs, interleaved A/B (1 / 2
# threads): 64 channels at 56x56 0.91 / 0.68x the time, 128 at 28x28 0.76 / 0.74x, 256 at 14x14
# 0.87 / 0.74x; 512 at 7x7 2.0x (its 4x4 tiles overhang the image by 30% and its filters, 2.25x the
# size, are read per call for 4 tiles)
WINOGRAD4_MIN_OUTPUTS = 12 * 12


def _winograd(node):
    """The output tile size of the Winograd conv this node takes (kernels/winograd.h), or 0: 3x3 stride-1
    convs with a constant filter and enough channels to fill the GEMMs. F(2x2, 3x3) spends 16 multiplies
    per 4 outputs and channel pair, F(4x4, 3x3) 36 per 16 (direct: 9 per output)."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    a = node.attrs
    if not (x.type.rank == 4 and w.is_const and tuple(w.shape[2:]) == (3, 3) and a.get("groups", 1) == 1
            and tuple(a["strides"]) == (1, 1) and tuple(a["dilations"]) == (1, 1)
            and w.shape[0] >= 16 and w.shape[1] >= 16 and isinstance(y.shape[3], int)
            and y.shape[3] + 3 <= WINOGRAD_MAX_W):
        return 0
    oh = y.shape[2]
    return 4 if isinstance(oh, int) and oh * y.shape[3] >= WINOGRAD4_MIN_OUTPUTS else 2


def winograd_filters(w: np.ndarray, m: int, mr: int) -> np.ndarray:
    """[O, C, 3, 3] -> the (m + 2)^2 transformed filter matrices U[i][j] (O x C), each packed as a GEMM A."""
    g = WINOGRAD_G[m]
    u = np.einsum("ik,ockl,jl->ijoc", g, w.astype(np.float64), g).astype(np.float32)
    return np.concatenate([pack_a(u[i, j], mr) for i in range(m + 2) for j in range(m + 2)])


def _pointwise_conv(node):
    """A 2-d 1x1 conv, stride 1, unpadded: its input is already the (transposed) A of its GEMM."""
    a = node.attrs
    return (tuple(node.inputs[1].shape[2:]) == (1, 1) and tuple(a["strides"]) == (1, 1)
            and tuple(a["dilations"]) == (1, 1) and all(p == 0 for pair in a["pads"] for p in pair))


def _swappable_conv(node):
    """A 2-d ungrouped conv with constant filters and a static output size that Winograd does not take:
    a GEMM of (pixels x in-channel taps) @ (taps x out channels), its input read through im2col rows
    unless _pointwise_conv."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    return (x.type.rank == 4 and w.is_const and node.attrs.get("groups", 1) == 1
            and all(isinstance(d, int) for d in y.shape[2:]) and not _winograd(node))


# when a conv's GEMM takes its pixels as rows (cuvil_conv_swapped): the empty share of the panel lanes
# that the pixels leave as columns, times K (in channels x taps), at least this. The swap saves the
# empty lanes' multiply-adds (each K deep) and costs one more pass over the product (the transpose to
# NCHW), whatever K. ResNet-50's 1x1 convs in a C harness, swapped / as they were (1 thread): 2048 ->
# 512 at 7x7 (23% empty, K = 2048) 0.80x the time, 512 -> 2048 (K = 512) 0.85x, 1024 -> 256 at 14x14
# (12.5%, K = 1024) 0.95x, 256 -> 1024 (K = 256) 1.0x
SWAP_MIN_EMPTY_K = 64


def _swapped(node, nr):
    """Whether this conv runs as cuvil_conv_swapped (kernels/conv.h), its pixels as the GEMM's rows."""
    if not _swappable_conv(node):
        return False
    pixels = node.outputs[0].shape[2] * node.outputs[0].shape[3]
    lanes = -(-pixels // nr) * nr
    return (lanes - pixels) / lanes * int(np.prod(node.inputs[1].shape[1:])) >= SWAP_MIN_EMPTY_K


def _conv_scratch(node, bounds):
    s, _ = _conv_shape(node, lambda d: D.upper_bound(d, bounds))
    if lower_blocked.is_blocked(node):
        return lower_blocked.conv_scratch(node, s)
    # the swapped form's pixel-major product (conv.c: swapped_ldc) and im2col rows; whether it is taken
    # depends on the target's panel width
    swapped = 0
    if _swappable_conv(node):
        rows = 0 if _pointwise_conv(node) else s["C"] * s["KH"] * s["KW"]
        swapped = ((s["O"] + 16) + rows) * s["OH"] * s["OW"] * 4
    return max(swapped, _gemm_conv_scratch(node, s))


def _implicit_im2col(node):
    """Whether cuvil_conv2d runs this conv's im2col inside its GEMM (one M block, kernels/conv.c), which
    it does when given no scratch: the swapped form's scratch, reserved whether or not the target's
    panel width takes it, must not reach it. "direct" as conv.c has it (top and left pads only)."""
    w, a = node.inputs[1], node.attrs
    direct = (all(k == 1 for k in w.shape[2:]) and all(st == 1 for st in a["strides"])
              and all(pair[0] == 0 for pair in a["pads"]))
    return not direct and w.shape[0] // a.get("groups", 1) <= GEMM_MC * 3 // 2


def _gemm_conv_scratch(node, s):
    m = _winograd(node)
    if m:
        tiles, alpha2 = -(-s["OH"] // m) * -(-s["OW"] // m), (m + 2) ** 2
        return alpha2 * ((-(-tiles // 64) * 64 * s["C"]) + s["O"] * tiles) * 4
    if _implicit_im2col(node):
        return 0
    K = (s["C"] // s["groups"]) * s["KH"] * s["KW"]
    N = s["OH"] * s["OW"]
    return (-(-N // 64) * 64 * K) * 4


def _shape_struct(s):
    return "{" + ", ".join(f".{k} = {v}" for k, v in s.items()) + "}"


@lowering("conv", scratch=_conv_scratch, supports=_conv_supports)
def lower_conv(em, node):
    if node.inputs[0].type.rank == 5:
        from .lower_extra import conv_nd
        return conv_nd(em, node)
    s, _ = _conv_shape(node, D.to_c)
    bias = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else "0"
    res = em.ptr(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else "0"
    act = ACT_CODES[node.attrs["act"]]
    if lower_blocked.is_blocked(node):
        return lower_blocked.lower_conv(em, node, _shape_struct(s), bias, res, act)
    w, groups = node.inputs[1], node.attrs.get("groups", 1)
    m, mr = _winograd(node), tile_rows(em)
    if m:
        up = em.packed(f"winograd{m}_a", w, lambda d: winograd_filters(d, m, mr))
        return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
                f"  _Static_assert(CUVIL_MR == {mr} && CUVIL_KC == {GEMM_KC} && CUVIL_WINOGRAD_MAX_W == "
                f"{WINOGRAD_MAX_W}, \"winograd filters packed for another kernel\");",
                f"  cuvil_conv3x3_winograd{'4' if m == 4 else ''}(&s, {em.ptr(node.inputs[0])}, {up}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {em.scratch()}, NT);", "}"]
    nr = panel_width(em)
    if _swapped(node, nr):
        wb = em.packed("conv_b", w, lambda d: pack_b(d.reshape(d.shape[0], -1).T.astype(np.float32), nr))
        return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
                f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
                f"  cuvil_conv_swapped(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {em.scratch()}, NT);", "}"]
    depthwise = groups > 1 and w.shape[1] == 1          # the direct kernel reads w as it is
    wp, wptr = "0", None
    if w.is_const and not depthwise:     # filters packed at compile time into the GEMM's A tiles only
        og = w.shape[0] // groups
        wp = em.packed("conv_a", w, lambda d: np.concatenate(
            [pack_a(g.reshape(og, -1), mr) for g in np.split(d.astype(np.float32), groups)]))
        wptr = "0"
    return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
            f"  _Static_assert(CUVIL_MR == {mr} && CUVIL_KC == {GEMM_KC} && CUVIL_MC == {GEMM_MC}, "
            "\"conv filters packed for another tile\");",
            f"  cuvil_conv2d(&s, {em.ptr(node.inputs[0])}, {wptr or em.ptr(w)}, {wp}, {bias}, {res}, "
            f"{em.ptr(node.outputs[0])}, {act}, {'0' if _implicit_im2col(node) else em.scratch()}, NT);", "}"]


def _pool_supports(node):
    x = node.inputs[0]
    if x.type.rank not in (3, 4, 5) or x.dtype != "float32" or (
            x.type.rank == 5 and not all(isinstance(d, int) for d in x.shape)):
        return f"{x.type.rank - 2}-d {x.dtype} pooling (static 1-d, 2-d and 3-d float32 are supported)"
    return None


@lowering("max_pool", "avg_pool", supports=_pool_supports)
def lower_pool(em, node):
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    if x.type.rank == 5:
        from .lower_extra import pool_nd
        return pool_nd(em, node)
    fake = type("N", (), {})()
    fake.inputs = [x, type("W", (), {"shape": (x.shape[1], 1, *a["kernel"])})()]
    fake.outputs = [y]
    fake.attrs = dict(strides=a["strides"], pads=a["pads"], dilations=a["dilations"], groups=1)
    s, (ph1, pw1) = _conv_shape(fake, D.to_c)
    s["O"] = s["C"]
    if lower_blocked.is_blocked(node):
        return lower_blocked.lower_max_pool(em, node, _shape_struct(s))
    mode = 0 if node.op == "max_pool" else (2 if a.get("count_include_pad") else 1)
    return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
            f"  cuvil_pool2d(&s, {ph1}, {pw1}, {mode}, {em.ptr(x)}, {em.ptr(y)}, NT);", "}"]


def _f32_only(node):
    return None if node.inputs[0].dtype == "float32" else f"dtype {node.inputs[0].dtype} (float32 is supported)"


@lowering("softmax", "log_softmax", supports=_f32_only)
def lower_softmax(em, node):
    x, ax = node.inputs[0], node.attrs["axis"]
    s = x.type.shape
    return [f"cuvil_softmax({cexpr.prod(s[:ax])}, {D.to_c(s[ax])}, {cexpr.prod(s[ax + 1:])}, {em.ptr(x)}, "
            f"{em.ptr(node.outputs[0])}, {int(node.op == 'log_softmax')}, NT);"]


def _norm_supports(node):
    r = _f32_only(node)
    if r:
        return r
    x = node.inputs[0]
    inner = x.type.shape[node.attrs["axis"]:]
    for p in node.inputs[1:]:
        if p is not None and not D.dims_equal(D.numel(p.type.shape), D.numel(inner)):
            return "broadcast norm parameters"
    return None


@lowering("layer_norm", "rms_norm", supports=_norm_supports)
def lower_norm(em, node):
    x, ax = node.inputs[0], node.attrs["axis"]
    s = x.type.shape
    g = em.ptr(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else "0"
    b = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else "0"
    return [f"cuvil_layer_norm({cexpr.prod(s[:ax])}, {cexpr.prod(s[ax:])}, {em.ptr(x)}, {g}, {b}, "
            f"{float(node.attrs['eps'])!r}f, {int(node.op == 'rms_norm')}, {em.ptr(node.outputs[0])}, NT);"]


@lowering("batch_norm", supports=_f32_only)
def lower_batch_norm(em, node):
    x = node.inputs[0]
    s = x.type.shape
    ps = ", ".join(em.ptr(v) for v in node.inputs[1:])
    return [f"cuvil_batch_norm({D.to_c(s[0])}, {D.to_c(s[1])}, {cexpr.prod(s[2:])}, {em.ptr(x)}, {ps}, "
            f"{float(node.attrs['eps'])!r}f, {em.ptr(node.outputs[0])}, NT);"]


def _attention_supports(node):
    if any(v.dtype != "float32" for v in node.inputs[:3]):
        return "float32 q, k, v are supported"
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        if node.inputs[3].dtype not in ("bool", "float32"):
            return "bool or float32 masks are supported"
        if node.inputs[0].type.rank > 4:
            return "masks on attention with more than one batch dim"
    return None


@lowering("attention", supports=_attention_supports)
def lower_attention(em, node):
    q, k, v = node.inputs[:3]
    y = node.outputs[0]
    a = node.attrs
    B, H, L, qs = _attn_dims(q, a["layout_q"])
    _, Hk, S, ks = _attn_dims(k, a["layout_k"])
    _, _, _, vs = _attn_dims(v, a["layout_v"])
    _, _, _, os_ = _attn_dims(y, a["layout_out"])
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    mkind, mptr, mst = 0, "0", ("0", "0", "0", "0")
    if mask is not None:
        mkind = 1 if mask.dtype == "bool" else 2
        mptr = em.ptr(mask)
        full = _bhsd_full(q, a["layout_q"], S)
        from .loops import broadcast_strides
        st = broadcast_strides(mask.type.shape, full)
        mst = tuple(D.to_c(x) for x in _fold_batch(st, full))
    E, Ev = q.shape[-1], v.shape[-1]
    init = (f"{{.B = {D.to_c(B)}, .H = {D.to_c(H)}, .Hk = {D.to_c(Hk)}, .L = {D.to_c(L)}, .S = {D.to_c(S)}, "
            f".E = {D.to_c(E)}, .Ev = {D.to_c(Ev)}, "
            f".qb = {qs[0]}, .qh = {qs[1]}, .ql = {qs[2]}, .kb = {ks[0]}, .kh = {ks[1]}, .kl = {ks[2]}, "
            f".vb = {vs[0]}, .vh = {vs[1]}, .vl = {vs[2]}, .ob = {os_[0]}, .oh = {os_[1]}, .ol = {os_[2]}, "
            f".mask_kind = {mkind}, .mask = {mptr}, .mb = {mst[0]}, .mh = {mst[1]}, .ml = {mst[2]}, .ms = {mst[3]}, "
            f".scale = {float(a['scale'])!r}f, .causal = {int(a['causal'])}}}")
    return ["{", f"  const cuvil_attn at = {init};",
            f"  cuvil_attention(&at, {em.ptr(q)}, {em.ptr(k)}, {em.ptr(v)}, {em.ptr(y)}, NT);", "}"]


def _attn_dims(v, layout):
    """(batch, heads, seq, (batch, head, seq) C strides) of an attention operand."""
    s = v.type.shape
    st, acc = [], 1
    for d in reversed(s):
        st.append(acc)
        acc = D.as_dim(acc * d)
    st = st[::-1]
    if len(s) == 2:
        return 1, 1, s[0], ("0", "0", D.to_c(st[0]))
    if layout == "bshd":
        return s[0], s[2], s[1], (D.to_c(st[0]), D.to_c(st[2]), D.to_c(st[1]))
    return D.numel(s[:-3]), s[-3], s[-2], (D.to_c(st[-3] * s[-3]) if len(s) > 3 else "0", D.to_c(st[-3]),
                                           D.to_c(st[-2]))


def _bhsd_full(q, layout, S):
    """The [..., heads, L, S] score shape (bhsd order) that a mask broadcasts against."""
    s = q.type.shape
    if layout == "bshd":
        return (s[0], s[2], s[1], S)
    return tuple(s[:-1]) + (S,)


def _fold_batch(st, full):
    """Mask strides over the score shape -> (batch, head, q, kv) strides."""
    st = [0] * (4 - len(st)) + list(st)
    return tuple(st[-4:])
