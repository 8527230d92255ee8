"""C lowering of the language-model ops: quantized matmul, mixture-of-experts matmul, rope, KV cache
update, cached attention."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from ...ir.ops.llm import int4_scales
from . import cexpr
from .emit import lowering
from .gen_activations import ACT_CODES
from .gemm_plan import pack_b, panel_width
from .lower_bf16dot import computes_bf16, lower_bf16_dot
from .lower_int8dot import computes_int8_matmul, computes_int8_matmul_on_tiles, lower_int8_matmul


def _panels(a: np.ndarray, width: int, pad) -> np.ndarray:
    """[R, C] -> [ceil(C/width), R, width] (columns padded with `pad`): the GEMM's panel order."""
    R, C = a.shape
    n = -(-C // width)
    full = np.full((R, n * width), pad, a.dtype)
    full[:, :C] = a
    return np.ascontiguousarray(full.reshape(R, n, width).transpose(1, 0, 2))


def _q4_panels(q: np.ndarray, nr: int) -> np.ndarray:
    """int4 [K, N/2] (column pairs per byte) -> panels whose byte j holds columns j (low nibble) and
    j + nr/2 (high nibble): the kernel dequantizes two contiguous half-panels with vector ops."""
    K = q.shape[0]
    vals = np.empty((K, q.shape[1] * 2), np.uint8)
    vals[:, 0::2], vals[:, 1::2] = q & 15, q >> 4
    n = -(-vals.shape[1] // nr)
    full = np.full((K, n * nr), 8, np.uint8)               # 8 is zero after the - 8 offset
    full[:, :vals.shape[1]] = vals
    p = full.reshape(K, n, nr).transpose(1, 0, 2)          # [panel, K, nr]
    h = nr // 2
    return np.ascontiguousarray(p[:, :, :h] | (p[:, :, h:] << 4))


def _bf16_panels(q: np.ndarray, nr: int) -> np.ndarray:
    """bf16 [K, N] -> panels whose 32-bit lane e holds column e (low half) and column e + nr/2 (high
    half): the kernel widens a whole panel row with one load, a shift and a mask."""
    p = _panels(q, nr, 0)
    h = nr // 2
    order = np.stack([np.arange(h), np.arange(h, nr)], 1).reshape(-1)
    return np.ascontiguousarray(p[:, :, order])


def _quads(blocks: np.ndarray, chunks: int, pad) -> np.ndarray:
    """[N/8 blocks, chunks * 32 bytes] -> [N/32][chunks][4][32] (padded with `pad` to whole quads of
    four blocks): a decode tile reads its four blocks as one sequential stream (kernels/qgemm.h)."""
    nq = -(-blocks.shape[0] // 4)
    full = np.full((nq * 4, chunks, 32), pad, blocks.dtype)
    full[:blocks.shape[0]] = blocks.reshape(blocks.shape[0], chunks, 32)
    return np.ascontiguousarray(full.reshape(nq, 4, chunks, 32).transpose(0, 2, 1, 3)).reshape(nq, -1)


def _q4_blocks(q: np.ndarray) -> np.ndarray:
    """int4 [K, N/2] (column pairs per byte) -> cuvil_qgemm's layout (kernels/qgemm.h): blocks [N/8][K/8][32],
    byte 4j + i of chunk c holding k = 8c + i (low nibble) and 8c + 4 + i (high nibble) of column j,
    in quads."""
    K = q.shape[0]
    vals = np.empty((K, q.shape[1] * 2), np.uint8)
    vals[:, 0::2], vals[:, 1::2] = q & 15, q >> 4
    n8 = -(-vals.shape[1] // 8) * 8
    full = np.full((K, n8), 8, np.uint8)                   # 8 is zero after the - 8 offset
    full[:, :vals.shape[1]] = vals
    c = full.reshape(K // 8, 2, 4, n8 // 8, 8)             # [chunk, half, i, block, j]
    blocks = (c[:, 0] | (c[:, 1] << 4)).transpose(2, 0, 3, 1).reshape(n8 // 8, -1)
    return _quads(blocks, K // 8, 0x88)


def _q8_blocks(q: np.ndarray) -> np.ndarray:
    """int8 [K, N] -> blocks [N/8][K/4][32] (kernels/qgemm.h): byte 4j + i of chunk c holds k = 4c + i
    of column j, in quads."""
    K, N = q.shape
    n8 = -(-N // 8) * 8
    full = np.zeros((K, n8), np.int8)
    full[:, :N] = q
    return _quads(full.reshape(K // 4, 4, n8 // 8, 8).transpose(2, 0, 3, 1).reshape(n8 // 8, -1), K // 4, 0)


def _q4_block_scales(s: np.ndarray) -> np.ndarray:
    """[G, N] -> float16 [N/32][G][32] (kernels/qgemm.h; zero scales for the padding columns)."""
    G, N = s.shape
    n32 = -(-N // 32) * 32
    full = np.zeros((G, n32), np.float16)
    full[:, :N] = int4_scales(s)
    return np.ascontiguousarray(full.reshape(G, n32 // 32, 32).transpose(1, 0, 2))


def _q8_block_scales(s: np.ndarray) -> np.ndarray:
    """[1, N] -> [N/32 * 32] (zero scales for the padding columns of the last quad)."""
    n32 = -(-s.size // 32) * 32
    full = np.zeros(n32, np.float32)
    full[:s.size] = s.reshape(-1)
    return full


def _epilogue(em, node):
    """(C lines declaring `ep`, its pointer or "0"): matmul_q's bias, residual and activation."""
    res = node.inputs[3] if len(node.inputs) > 3 else None
    bias = node.inputs[4] if len(node.inputs) > 4 else None
    act = node.attrs.get("act", "none")
    if res is None and bias is None and act == "none":
        return [], "0"
    N = node.outputs[0].shape[-1]
    return [f"  const cuvil_epilogue ep = {{.bias_col = {em.ptr(bias) if bias is not None else '0'}, "
            f".residual = {em.ptr(res) if res is not None else '0'}, .ldr = {N}, .alpha = 1.0f, "
            f".act = {ACT_CODES[act]}}};"], "&ep"


def _lower_qgemm(em, node):
    """Integer-dot kernel (act_block > 0): weights in column blocks, K contiguous (kernels/qgemm.h)."""
    x, w = node.inputs[0], node.inputs[1]
    bits, ab = node.attrs["bits"], node.attrs["act_block"]
    K, N = w.shape[0], node.outputs[0].shape[-1]
    if bits == 4:
        wp = em.packed("q4blocks", w, _q4_blocks, "uint8_t")
        sp = em.packed("q4blockscales", node.inputs[2], _q4_block_scales, "uint16_t")
    else:
        wp = em.packed("q8blocks", w, _q8_blocks, "int8_t")
        sp = em.packed("q8blockscales", node.inputs[2], _q8_block_scales)
    ep_lines, ep = _epilogue(em, node)
    M = cexpr.prod(x.shape[:-1])
    kv = x.shape[-1]                    # < K: the weight's rows past it pad K to a whole activation block
    return ["{", *ep_lines,
            f"  if (cuvil_qgemm({M}, {N}, {K}, {kv}, {em.ptr(x)}, {kv}, {wp}, {bits}, {sp}, {ab}, "
            f"{em.ptr(node.outputs[0])}, "
            f"{N}, {ep}, NT)) CUVIL_FAIL(\"out of memory for quantized activations\");", "}"]


def _mmq_supports(node):
    # weights and scales are packed into panels at compile time
    return None if all(v is None or v.is_const for v in node.inputs[1:3]) else "quantized weights must be constants"


def _f32_only(node):
    return None if all(v.dtype in ("float32", "int64") for v in node.inputs) else "float32 tensors are supported"


@lowering("matmul_q", supports=_mmq_supports)
def lower_matmul_q(em, node):
    from ...target import vector_floats
    if computes_int8_matmul_on_tiles(node, em.target) or computes_int8_matmul(node, em.target):
        return lower_int8_matmul(em, node)
    if node.attrs.get("act_block"):
        return _lower_qgemm(em, node)
    if computes_int8_matmul(node, em.target):
        return lower_int8_matmul(em, node)
    if computes_bf16(node, em.target):
        return lower_bf16_dot(em, node, *_epilogue(em, node))
    x, w = node.inputs[0], node.inputs[1]
    bits, group = node.attrs["bits"], node.attrs["group"]
    nr = 2 * vector_floats(em.target)
    K = w.shape[0]
    N = node.outputs[0].shape[-1]
    fmt = bits
    if bits == 4:
        wp = em.packed("q4panels", w, lambda d: _q4_panels(d, nr), "uint8_t")
    elif bits == 16 and w.dtype == "float16":
        wp = em.packed("f16panels", w, lambda d: _panels(d.view(np.uint16), nr, 0), "uint16_t")
        fmt = "CUVIL_B_FP16"
    elif bits == 16:
        wp = em.packed("bf16panels", w, lambda d: _bf16_panels(d, nr), "uint16_t")
    else:
        wp = em.packed("qpanels", w, lambda d: _panels(d, nr, 0), "int8_t")
    sp = "0"
    if bits != 16:
        scales = int4_scales if bits == 4 else (lambda d: d.astype(np.float32))
        sp = em.packed("qscales", node.inputs[2], lambda d: _panels(scales(d), nr, 0.0))
    ep_lines, ep = _epilogue(em, node)
    M = cexpr.prod(x.shape[:-1])
    return ["{", *ep_lines,
            f"  cuvil_sgemm_quant({M}, {N}, {K}, {em.ptr(x)}, {K}, {wp}, {fmt}, {sp}, "
            f"{min(group, K)}, {em.ptr(node.outputs[0])}, {N}, {ep}, NT);", "}"]


def _expert_pairs(node, bounds=None):
    """(token-slot pairs, as C or at their bound; the expert count; K; N)."""
    x, idx, w = node.inputs[:3]
    P = D.upper_bound(D.prod(idx.shape), bounds) if bounds is not None else cexpr.prod(idx.shape)
    N = node.outputs[0].shape[-1]
    return P, w.shape[0], w.shape[1], N


def _expert_scratch(node, bounds):
    P, E, K, N = _expert_pairs(node, bounds)
    return (E + 1 + P) * 8 + P * (K + N) * 4


def _expert_panels(em, node):
    """(weights, scales or None, C type, per-expert strides): each expert packed as matmul_q's or the
    float GEMM's panels, experts one after another."""
    w, scales = node.inputs[2], node.inputs[3] if len(node.inputs) > 3 else None
    bits, nr = node.attrs["bits"], panel_width(em)
    pack, ctype = {32: (lambda d: pack_b(d, nr), "float"), 16: (lambda d: _bf16_panels(d, nr), "uint16_t"),
                   8: (lambda d: _panels(d, nr, 0), "int8_t"), 4: (lambda d: _q4_panels(d, nr), "uint8_t")}[bits]
    wp = np.stack([pack(m) for m in w.data])
    sp = None
    if scales is not None:
        as_f32 = int4_scales if bits == 4 else (lambda d: d.astype(np.float32))
        sp = np.stack([_panels(as_f32(m), nr, 0.0) for m in scales.data])
    return (em.packed(f"experts{bits}", w, lambda d: wp, ctype),
            em.packed("expertscales", scales, lambda d: sp) if sp is not None else "0",
            wp[0].size, sp[0].size if sp is not None else 0)


def _experts_supports(node):
    return None if all(v is None or v.is_const for v in node.inputs[2:4]) else "expert weights must be constants"


@lowering("expert_matmul", scratch=_expert_scratch, supports=_experts_supports)
def lower_expert_matmul(em, node):
    """Pairs sorted by expert (a stable counting sort), each expert's rows gathered into one GEMM
    (a decode step: as many rows as tokens routed to it), the results scattered back."""
    x, idx = node.inputs[:2]
    P, E, K, N = _expert_pairs(node)
    k, R = D.to_c(idx.shape[-1]), D.to_c(x.shape[-2])
    bits, group = node.attrs["bits"], node.attrs["group"]
    wp, sp, wstride, sstride = _expert_panels(em, node)
    if bits == 32:
        gemm = f"cuvil_sgemm_packed(M, {N}, {K}, a, {K}, {wp} + e * {wstride}, c, {N}, 0, NT, 0);"
    else:
        gemm = (f"cuvil_sgemm_quant(M, {N}, {K}, a, {K}, {wp} + e * {wstride}, {bits}, "
                f"{sp + f' + e * {sstride}' if sstride else '0'}, {min(group, K)}, c, {N}, 0, NT);")
    X, I, Y = em.ptr(x), em.ptr(idx), em.ptr(node.outputs[0])
    return ["{", f"  const int64_t P = {P};",
            f"  int64_t *first = (int64_t *){em.scratch()}, *order = first + {E} + 1, cur[{E}];",
            f"  float *ga = (float *)(order + P), *gc = ga + P * {K};",
            f"  for (int64_t e = 0; e <= {E}; e++) first[e] = 0;",
            "  for (int64_t p = 0; p < P; p++) {",
            f"    if ({I}[p] < 0 || {I}[p] >= {E})",
            f"      CUVIL_FAIL(\"expert index %lld outside [0, {E})\", (long long){I}[p]);",
            f"    first[{I}[p] + 1]++;", "  }",
            f"  for (int64_t e = 0; e < {E}; e++) first[e + 1] += first[e], cur[e] = first[e];",
            f"  for (int64_t p = 0; p < P; p++) order[cur[{I}[p]]++] = p;",
            "  for (int64_t i = 0; i < P; i++) {",
            f"    const int64_t p = order[i], row = {R} == 1 ? p / {k} : p;",
            f"    memcpy(ga + i * {K}, {X} + row * {K}, (size_t){K} * sizeof(float));", "  }",
            f"  for (int64_t e = 0; e < {E}; e++) {{",
            "    const int64_t M = first[e + 1] - first[e];",
            "    if (M == 0) continue;",
            f"    const float *a = ga + first[e] * {K};",
            f"    float *c = gc + first[e] * {N};",
            f"    {gemm}", "  }",
            "  for (int64_t i = 0; i < P; i++)",
            f"    memcpy({Y} + order[i] * {N}, gc + i * {N}, (size_t){N} * sizeof(float));",
            "}"]


@lowering("rope", supports=_f32_only)
def lower_rope(em, node):
    x, pos, f = node.inputs
    B, T, H, Dd = (D.to_c(d) for d in x.shape)
    return [f"cuvil_rope({B}, {T}, {H}, {Dd}, {em.ptr(x)}, {em.ptr(pos)}, {em.ptr(f)}, "
            f"{cexpr.float_literal(node.attrs['scale'], 'f')}, {em.ptr(node.outputs[0])}, NT);"]


def _kv_supports(node):
    """float32 tensors, the caches float32 or float16 (an fp16 KV cache)."""
    caches = [v for v in node.inputs if v is not None and v.type.rank == 5]
    rest = [v for v in node.inputs if v is not None and v.type.rank != 5]
    if all(v.dtype in ("float32", "float16") for v in caches) and all(v.dtype in ("float32", "int64") for v in rest):
        return None
    return "float32 tensors (and float32 or float16 caches) are supported"


@lowering("kv_update", supports=_kv_supports)
def lower_kv_update(em, node):
    cache, new, start = node.inputs[:3]
    slots = em.ptr(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else "0"
    L, Bmax, Hk, S, Dd = (D.to_c(d) for d in cache.shape)
    B, T = D.to_c(new.shape[0]), D.to_c(new.shape[1])
    layer = node.attrs["layer"]
    y = node.outputs[0]
    lines = []
    if em.plan.alias.get(y.name) is None:   # not updated in place (the result is a graph output): copy first
        lines.append(f"memcpy({em.ptr(y)}, {em.ptr(cache)}, (size_t)({L} * {Bmax} * {Hk} * {S} * {Dd}) * "
                     f"{cache.type.itemsize});")
    half = int(cache.dtype == "float16")
    dst = f"(({'uint16_t' if half else 'float'} *){em.ptr(y)}) + (int64_t){layer} * {Bmax} * {Hk} * {S} * {Dd}"
    return lines + [f"if (cuvil_kv_update({B}, {Bmax}, {T}, {Hk}, {S}, {Dd}, {em.ptr(new)}, {em.ptr(start)}, {slots}, "
                    f"{dst}, {half})) CUVIL_FAIL(\"KV cache full: a sequence would pass {S} tokens, the batch exceeds {Bmax}, "
                    f"or the rows' cache slots are not in [0, {Bmax}) at positions apart\");"]


@lowering("cached_attention", supports=_kv_supports)
def lower_cached_attention(em, node):
    q, kc, vc, start = node.inputs[:4]
    slots = em.ptr(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else "0"
    y = node.outputs[0]
    B, T, H, E = (D.to_c(d) for d in q.shape)
    _, Bmax, Hk, S, _ = (D.to_c(d) for d in kc.shape)
    Ev = D.to_c(vc.shape[-1])
    layer = node.attrs["layer"]
    kv_layer = f"(int64_t){layer} * {Bmax} * {Hk} * {S}"
    init = (f"{{.B = {B}, .H = {H}, .Hk = {Hk}, .L = {T}, .S = {S}, .E = {E}, .Ev = {Ev}, "
            f".qb = {T} * {H} * {E}, .qh = {E}, .ql = {H} * {E}, "
            f".kb = {Hk} * {S} * {E}, .kh = {S} * {E}, .kl = {E}, "
            f".vb = {Hk} * {S} * {Ev}, .vh = {S} * {Ev}, .vl = {Ev}, "
            f".ob = {T} * {H} * {Ev}, .oh = {Ev}, .ol = {H} * {Ev}, "
            f".scale = {cexpr.float_literal(node.attrs['scale'], 'f')}, .causal = 1, .q_offset = {em.ptr(start)}, "
            f".softcap = {cexpr.float_literal(node.attrs['softcap'], 'f')}, .window = {int(node.attrs['window'])}, "
            f".kv_slot = {slots}, .kv_half = {int(kc.dtype == 'float16')}}}")
    return ["{", f"  if (cuvil_check_slots({B}, {Bmax}, {T}, {em.ptr(start)}, {slots})) "
            f"CUVIL_FAIL(\"cache slots must be in [0, {Bmax}), rows of one slot at positions apart\");",
            f"  const cuvil_attn at = {init};",
            f"  if (cuvil_attention(&at, {em.ptr(q)}, {em.ptr(kc)} + {kv_layer} * {E}, {em.ptr(vc)} + {kv_layer} * {Ev}, "
            f"{em.ptr(y)}, NT)) CUVIL_FAIL(\"out of memory widening the fp16 KV cache's rows\");", "}"]
