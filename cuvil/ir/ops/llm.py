"""Ops of the language-model path: rotary embedding, weight-only quantized matmul, mixture-of-experts
matmul, the in-place KV cache update and attention over the cache."""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .. import dims as D
from ..types import TensorType
from .fused import ACTIVATIONS, apply_act, check_range
from .registry import REGISTRY, OpDef, declare

BITS = (4, 8, 16)


def int4_scales(scales):
    """int4 scales are float16 values (the kernels store them in half the bytes): float32 ones are
    rounded to the nearest."""
    with np.errstate(over="ignore"):
        return np.asarray(scales, np.float32).astype(np.float16).astype(np.float32)


def dequantize(q, scales, bits, group):
    """Logical weights [K, N] (float64) of a quantized constant (see matmul_q)."""
    if bits == 16 and q.dtype == np.float16:
        return q.astype(np.float64)
    if bits == 16:
        return (q.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if bits == 4:
        lo = (q & 15).astype(np.int16) - 8
        hi = (q >> 4).astype(np.int16) - 8
        vals = np.stack([lo, hi], axis=-1).reshape(q.shape[0], -1)
    else:
        vals = q.astype(np.int16)
    if bits == 4:
        scales = int4_scales(scales)
    # (a group past K, e.g. the default 1 << 30 for one scale per column, repeats only K times)
    s = np.repeat(scales.astype(np.float64), min(group, vals.shape[0]), axis=0)[:vals.shape[0]]
    return vals * s


def act_block(bits, K, group):
    """The activation block the integer-dot kernel uses for these weights, or 0 where it cannot:
    int4 needs group in {32, 64, 128} (the block is the group) and K % 64 == 0; int8 needs one
    scale per column and K % 32 == 0."""
    if not isinstance(K, int):
        return 0
    if bits == 4:
        return group if group in (32, 64, 128) and K % 64 == 0 and K % group == 0 else 0
    if bits == 8 and group >= K:
        return next((b for b in (128, 64, 32) if K % b == 0), 0)
    return 0


def act_block_ok(bits, K, group, ab):
    return ab == act_block(bits, K, group)


# ---- matmul_q: act(x @ dequant(weight) + bias + residual) -----------------------------------
# inputs (x, weight, scales, residual, bias), the last three optional (None).
# weight: bits 8 -> int8 [K, N]; bits 4 -> uint8 [K, N/2] (low nibble = even column, value - 8);
# bits 16 -> uint16 [K, N] bf16 bit patterns, or float16 [K, N] (IEEE half). With int8 activations
# (act_block) an int8 weight may have up to act_block - 1 zero rows past x's K (padded to a whole block). scales: float32
# [ceil(K/group), N] (absent for 16 bits); int4 scales act as float16 values (int4_scales), the
# precision the kernels store. bias: float32 [N]; act: one of fused.ACTIVATIONS.
WEIGHT_DTYPES_Q = {4: ("uint8",), 8: ("int8",), 16: ("uint16", "float16")}


def _mmq_infer(types, attrs, inputs):
    x, w = types[0], types[1]
    bits = attrs["bits"]
    if bits not in BITS:
        raise ShapeError(f"matmul_q: bits {bits} not one of {BITS}")
    want = WEIGHT_DTYPES_Q[bits]
    if w.dtype not in want or w.rank != 2:
        raise ShapeError(f"matmul_q: {bits}-bit weight must be {' or '.join(want)}[K, N], got {w}")
    if attrs.get("act", "none") not in ACTIVATIONS:
        raise ShapeError(f"matmul_q: act {attrs['act']!r} not one of {ACTIVATIONS}")
    K = w.shape[0]
    N = w.shape[1] * (2 if bits == 4 else 1)
    ab = attrs.get("act_block", 0)
    kx = x.shape[-1]
    padded = bits == 8 and ab and isinstance(kx, int) and K - ab < kx < K    # zero rows to a whole block
    if x.dtype != "float32" or not (D.dims_equal(kx, K) or padded):
        raise ShapeError(f"matmul_q: input {x} does not match weight K = {K}")
    if attrs.get("bf16_act", 0) not in (0, 1) or (attrs.get("bf16_act") and (bits != 16 or w.dtype != "uint16")):
        raise ShapeError(f"matmul_q: bf16_act {attrs.get('bf16_act')!r} is 0, or 1 with bf16 weights (got {w})")
    check_range("matmul_q", attrs)
    if attrs.get("int8_range") is not None and (bits != 8 or ab):
        raise ShapeError(f"matmul_q: int8_range takes int8 weights and act_block 0 (bytes over the range, not "
                         f"int8 blocks), got bits {bits}, act_block {ab}")
    if attrs.get("dynamic_range", 0) not in (0, 1) or (attrs.get("dynamic_range") and not (bits == 8 and ab)):
        raise ShapeError(f"matmul_q: dynamic_range is 0, or 1 with int8 weights and act_block, got "
                         f"{attrs.get('dynamic_range')!r}, bits {bits}, act_block {ab}")
    if ab and not act_block_ok(bits, K, attrs["group"], ab):
        raise ShapeError(f"matmul_q: act_block {ab} does not fit bits {bits}, K {K}, group {attrs['group']}")
    if bits != 16 and (len(types) < 3 or types[2] is None or types[2].shape != (-(-K // attrs["group"]), N)):
        raise ShapeError(f"matmul_q: scales must be float32[{-(-K // attrs['group'])}, {N}]")
    out = TensorType(x.shape[:-1] + (N,), "float32")
    if len(types) > 3 and types[3] is not None and types[3].shape != out.shape:
        raise ShapeError(f"matmul_q: residual {types[3]} must match the output {out}")
    if len(types) > 4 and types[4] is not None and (types[4].shape != (N,) or types[4].dtype != "float32"):
        raise ShapeError(f"matmul_q: bias {types[4]} must be float32[{N}]")
    return [out]


def quantize_activations(x, block):
    """int8 activations per `block` values along the last axis, as the kernel computes them (float32
    scale amax / 127, round half to even) -> the dequantized values (float64)."""
    xb = x.astype(np.float32).reshape(x.shape[:-1] + (x.shape[-1] // block, block))
    d = np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def _mmq_ref(xs, a):
    w = dequantize(xs[1], xs[2] if len(xs) > 2 else None, a["bits"], a["group"])
    x0 = xs[0]
    if x0.shape[-1] < w.shape[0]:           # int8 weights padded with zero rows to a whole activation block
        x0 = np.concatenate([x0, np.zeros(x0.shape[:-1] + (w.shape[0] - x0.shape[-1],), x0.dtype)], axis=-1)
    x = x0.astype(np.float64)
    if a.get("act_block"):
        x = quantize_activations(x0, a["act_block"])
    y = x @ w
    for extra in xs[4:5] + xs[3:4]:                  # bias, then residual (the kernels' order)
        if extra is not None:
            y = y + extra
    return apply_act(y.astype(np.float32), a.get("act", "none"))


# act_block > 0: activations are quantized to int8 in blocks of act_block values along K and the
# products summed in integers (ggml's Q8 activations), at every number of rows; 0 keeps float32
# activations.
# bf16_act 1 (bf16 weights only): the activations may be rounded to bf16 where the target multiplies
# in bf16 (AVX512-BF16's dot products, kernels/bf16dot.h); elsewhere they stay float32, as the
# reference keeps them: a permission, not a requirement, so the reference is the fp32-activation sum.
# int8_range (bits 8, act_block 0): x lies on a quantized model's activation grid over [lo, hi] (matmul's
# int8_range), on whose bytes the integer kernels multiply it (kernels/int8dot.h cuvil_matmul_int8); the
# reference keeps x as it is, as conv's does.
# dynamic_range 1 (with act_block): where the target multiplies bytes on AMX tiles, x may be mapped onto
# bytes each row over its own range instead of int8 blocks (codegen/c/lower_int8dot.py
# computes_int8_matmul_on_tiles): a permission, as bf16_act; the reference keeps the blocks.
declare(OpDef("matmul_q", {"bits": 8, "group": 1 << 30, "act_block": 0, "act": "none", "bf16_act": 0,
                           "int8_range": None, "dynamic_range": 0}, _mmq_infer,
              _mmq_ref, kind="matmul"))


# ---- expert_matmul: each (token, slot) pair's row times the weight of the expert routed to it --------
# x [..., R, K] (R = 1: every slot reads the token's row; R = k: slot j reads row j), idx int64 [..., k]
# -> [..., k, N]. weight [E, K, N] float32 (bits 32) or, per expert, matmul_q's formats with scales
# [E, ceil(K/group), N]. An index outside [0, E) is a run-time error, never a read past the weights.
WEIGHT_DTYPES = {32: "float32", 16: "uint16", 8: "int8", 4: "uint8"}


def _em_infer(types, attrs, inputs):
    x, idx, w = types[:3]
    bits = attrs["bits"]
    if bits not in WEIGHT_DTYPES or w.dtype != WEIGHT_DTYPES[bits] or w.rank != 3:
        raise ShapeError(f"expert_matmul: {bits}-bit weights must be {WEIGHT_DTYPES.get(bits)}[E, K, N], got {w}")
    E, K = w.shape[:2]
    N = w.shape[2] * (2 if bits == 4 else 1)
    if x.dtype != "float32" or x.rank < 2 or idx.dtype != "int64" or idx.rank != x.rank - 1 or \
            not D.dims_equal(x.shape[-1], K) or not all(D.dims_equal(a, b) for a, b in zip(x.shape[:-2], idx.shape)):
        raise ShapeError(f"expert_matmul: expects x[..., R, {K}] float32 and int64 idx[..., k]; got {x}, {idx}")
    k = idx.shape[-1]
    if not (D.dims_equal(x.shape[-2], 1) or D.dims_equal(x.shape[-2], k)):
        raise ShapeError(f"expert_matmul: x's rows per token must be 1 or k = {k}, got {x.shape[-2]}")
    if bits in (4, 8) and (len(types) < 4 or types[3] is None or
                           types[3].shape != (E, -(-K // attrs["group"]), N) or types[3].dtype != "float32"):
        raise ShapeError(f"expert_matmul: scales must be float32[{E}, {-(-K // attrs['group'])}, {N}]")
    return [TensorType(idx.shape + (N,), "float32")]


def _em_ref(xs, a):
    x, idx, w = xs[:3]
    if (idx < 0).any() or (idx >= w.shape[0]).any():
        raise ShapeError(f"expert_matmul: expert index out of [0, {w.shape[0]})")
    weights = [w[e].astype(np.float64) if a["bits"] == 32 else
               dequantize(w[e], xs[3][e] if len(xs) > 3 else None, a["bits"], a["group"]) for e in range(w.shape[0])]
    xr = np.broadcast_to(x, idx.shape + (x.shape[-1],)).astype(np.float64)
    out = np.zeros(idx.shape + (weights[0].shape[1],), np.float64)
    for pos in np.ndindex(*idx.shape):
        out[pos] = xr[pos] @ weights[idx[pos]]
    return out.astype(np.float32)


declare(OpDef("expert_matmul", {"bits": 32, "group": 1 << 30}, _em_infer, _em_ref, kind="llm"))


# ---- rope: rotate halves of [B, T, H, D] by positions [B, T] x inv_freq [D/2] ----------------------
def _rope_infer(types, attrs, inputs):
    x, pos, f = types
    if x.rank != 4 or pos.rank != 2 or pos.dtype != "int64" or f.rank != 1:
        raise ShapeError(f"rope: expects x[B, T, H, D], int64 positions[B, T], inv_freq[D/2]; got {x}, {pos}, {f}")
    half = x.shape[3] // 2 if isinstance(x.shape[3], int) else None
    if half is not None and (x.shape[3] % 2 or not D.dims_equal(f.shape[0], half)) or not all(
            D.dims_equal(a, b) for a, b in zip(pos.shape, x.shape[:2])):
        raise ShapeError(f"rope: x {x} needs an even D, positions [B, T] and inv_freq [D/2]; got {pos}, {f}")
    return [x]


def _rope_ref(xs, a):
    x, pos, f = xs
    ang = pos[..., None].astype(np.float64) * f.astype(np.float64)          # [B, T, D/2]
    c, s = (np.cos(ang) * a["scale"])[:, :, None, :], (np.sin(ang) * a["scale"])[:, :, None, :]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].astype(np.float64), x[..., h:].astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


declare(OpDef("rope", {"scale": 1.0}, _rope_infer, _rope_ref, kind="llm"))


# ---- kv_update: cache[layer, slot[b], h, start[b] + t] = new[b, t, h]; the output is the cache itself ---
# an fp16 cache holds rows rounded to nearest even, which attention widens; float64 is legalized to float32
KV_DTYPES = ("float32", "float16", "float64")
# slots (optional, int64 [B]): the cache slot of each batch row (default: row b in slot b); rows of one slot
# write positions apart (a prompt's tokens as rows beside other sequences' decode rows)
def _slots_type_ok(t, batch):
    return t is None or (t.rank == 1 and t.dtype == "int64" and D.dims_equal(t.shape[0], batch))


def slot_of(xs, n_fixed, b):
    """Batch row b's cache slot: slots[b] where the op has a slots input, else b."""
    return int(xs[n_fixed][b]) if len(xs) > n_fixed and xs[n_fixed] is not None else b


def check_slots(op, xs, n_fixed, B, Bmax, start, T):
    """Each row's slot, checked as kernels/llm.c cuvil_check_slots does: in [0, Bmax), and rows of one slot
    writing [start, start + T) apart."""
    slots = [slot_of(xs, n_fixed, b) for b in range(B)]
    if any(not 0 <= s < Bmax for s in slots):
        raise ShapeError(f"{op}: cache slots must be in [0, {Bmax}), got {slots}")
    for b in range(B):
        for c in range(b):
            if slots[b] == slots[c] and abs(int(start[b]) - int(start[c])) < T:
                raise ShapeError(f"{op}: rows {c} and {b} write slot {slots[b]} at one position (starts "
                                 f"{int(start[c])} and {int(start[b])}, {T} tokens each)")
    return slots


def _kv_infer(types, attrs, inputs):
    cache, new, start = types[:3]
    if cache.rank != 5 or new.rank != 4 or start.rank != 1 or start.dtype != "int64" or \
            not _slots_type_ok(types[3] if len(types) > 3 else None, new.shape[0]):
        raise ShapeError(f"kv_update: expects cache[L, B, Hk, S, D], new[B, T, Hk, D], int64 start[B] (and "
                         f"slots[B]); got {cache}, {new}, {start}")
    if cache.dtype not in KV_DTYPES or new.dtype not in ("float32", "float64"):
        raise ShapeError(f"kv_update: a cache of {', '.join(KV_DTYPES)} takes float rows; got {cache.dtype}, {new.dtype}")
    return [cache]


def _kv_ref(xs, a):
    cache, new, start = xs[:3]
    out = cache.copy()
    T = new.shape[1]
    slots = check_slots("kv_update", xs, 3, new.shape[0], cache.shape[1], start, new.shape[1])
    for b, slot in enumerate(slots):
        if start[b] + T > cache.shape[3]:
            raise ShapeError(f"kv_update: sequence {b} runs past the cache ({start[b]} + {T} > {cache.shape[3]})")
        out[a["layer"], slot, :, start[b]:start[b] + T] = np.swapaxes(new[b], 0, 1)
    return out


declare(OpDef("kv_update", {"layer": 0}, _kv_infer, _kv_ref, kind="llm"))


# ---- cached_attention: q[B, T, H, D] over the cache rows [0, start[b] + t] of slot[b] -------------
# (the last `window` of them where window > 0); scores capped to softcap * tanh(s / softcap) where softcap > 0
def _ca_infer(types, attrs, inputs):
    q, kc, vc, start = types[:4]
    if q.rank != 4 or kc.rank != 5 or vc.rank != 5 or not _slots_type_ok(types[4] if len(types) > 4 else None,
                                                                          q.shape[0]):
        raise ShapeError(f"cached_attention: expects q[B, T, H, D] and caches [L, B, Hk, S, D]; got {q}, {kc}")
    if kc.dtype != vc.dtype or kc.dtype not in KV_DTYPES:
        raise ShapeError(f"cached_attention: caches of one dtype of {', '.join(KV_DTYPES)}; got {kc.dtype}, {vc.dtype}")
    if isinstance(q.shape[2], int) and isinstance(kc.shape[2], int) and q.shape[2] % kc.shape[2]:
        raise ShapeError("cached_attention: query heads must be a multiple of kv heads")
    w, cap = attrs["window"], attrs["softcap"]
    # both are rendered into C (an int64 and a float literal): bounded here, whatever a config says
    if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < 1 << 62 or isinstance(cap, bool) or \
            not (isinstance(cap, (int, float)) and 0.0 <= cap <= 1e30):
        raise ShapeError(f"cached_attention: window must be an int in [0, 2^62) and softcap a float in [0, 1e30]; "
                         f"got {w!r}, {cap!r}")
    return [TensorType(q.shape[:3] + (vc.shape[-1],), "float32")]


def _ca_ref(xs, a):
    q, kc, vc, start = xs[:4]
    B, T, H, _ = q.shape
    out = np.zeros(q.shape[:3] + (vc.shape[-1],), np.float64)
    rep = H // kc.shape[2]
    for b, slot in enumerate(check_slots("cached_attention", xs, 4, B, kc.shape[1], start, T)):
        k = np.repeat(kc[a["layer"], slot], rep, axis=0).astype(np.float64)    # [H, S, D]
        v = np.repeat(vc[a["layer"], slot], rep, axis=0).astype(np.float64)
        for t in range(T):
            n = start[b] + t + 1
            s = np.einsum("hd,hsd->hs", q[b, t].astype(np.float64), k[:, :n]) * a["scale"]
            if a["softcap"]:
                s = np.tanh(s / a["softcap"]) * a["softcap"]
            if a["window"]:                   # keys (n - 1 - window, n - 1]
                s[:, :max(n - a["window"], 0)] = -np.inf
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[b, t] = np.einsum("hs,hsd->hd", p, v[:, :n])
    return out.astype(np.float32)


declare(OpDef("cached_attention", {"layer": 0, "scale": 1.0, "softcap": 0.0, "window": 0}, _ca_infer, _ca_ref,
              kind="llm"))

__all__ = ["dequantize", "REGISTRY"]
