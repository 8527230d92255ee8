"""A decoder-only model (Llama and the FAMILIES of spec.py) -> one IR graph
`step(ids[B, T], start[B], k_cache, v_cache, slots[B], logit_rows[R]) -> logits[R, V]` (row b in cache slot
slots[b]; logit row r is token logit_rows[r] = b * T + t).

Prefill is a step with T prompt tokens, decode a step with T = 1 for every sequence in the batch:
the same compiled code, the same weights, one preallocated KV cache (written in place). A step runs
at most max_step_tokens tokens (B x T): its buffers are sized by that, not by max_batch x max_seq_len.
Rows of one slot at different positions may share a step (a prompt's tokens as T = 1 rows beside other
sequences' decode rows): every row's keys and values are written before any row attends."""
from __future__ import annotations

import numpy as np

from ..errors import CuvilError, QuantizationError
from ..ir import dims as D
from ..ir.graph import Graph, TensorType, Value
from ..ir.ops.llm import act_block
from ..ir import quant as quantize
from .spec import NORM_WEIGHTS, LlamaSpec


def _transposed(w: np.ndarray) -> np.ndarray:
    """w.T as a contiguous float32 array, in stripes of 256 rows of w: numpy's whole-array transposed
    copy walks the output across cache lines (TinyLlama int4 build: 7.2 of its 26 s; a stripe of 8192 x
    2048 fp32 0.32 s whole, 0.066 s by stripes)."""
    out = np.empty((w.shape[1], w.shape[0]), np.float32)
    for i in range(0, w.shape[0], 256):
        out[:, i:i + 256] = w[i:i + 256].T
    return out


def _by_columns(tensors, name, convert, chunk=8192):
    """convert([K, n] fp32) over blocks of output columns (rows of the torch-layout weight), joined
    along N: the fp32 copy of a 128k-vocabulary head alone is 2 GiB, and quantizing it whole made
    several temporaries of that size."""
    try:
        parts = [convert(_transposed(tensors.rows(name, n, n + chunk)))
                 for n in range(0, tensors.shape(name)[0], chunk)]
    except QuantizationError as e:
        raise QuantizationError(f"{name}: {e}") from None
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(p, axis=1) for p in zip(*parts))
    return np.concatenate(parts, axis=1)


def _linear(g, x, tensors, name, precision: str, group: int, residual=None, bias=None):
    """x @ W^T for the torch-layout weight [N, K] `name`, in the requested precision."""
    K = tensors.shape(name)[1]
    if precision == "fp32":
        y = g.add("matmul", [x, g.const(_transposed(tensors.get(name)))])
        if bias is not None:
            y = g.add("add", [y, g.const(bias.astype(np.float32))])
        return g.add("add", [y, residual]) if residual is not None else y
    if precision == "bf16":
        ins = [x, g.const(_by_columns(tensors, name, quantize.to_bf16)), None]
        attrs = {"bits": 16}
    elif precision == "int8":
        q, s = _by_columns(tensors, name, quantize.quantize_int8)
        ins, attrs = [x, g.const(q), g.const(s)], {"bits": 8, "group": K}
    else:
        q, s = _by_columns(tensors, name, lambda w: quantize.quantize_int4(w, group))
        ins, attrs = [x, g.const(q), g.const(s)], {"bits": 4, "group": group}
    if precision in ("int8", "int4"):    # int8 activations, integer dot products (where the shape allows)
        attrs["act_block"] = act_block(attrs["bits"], K, attrs["group"])
    if bias is not None:             # a bias is not fused into the quantized GEMM: add it after
        y = g.add("matmul_q", ins, attrs)
        y = g.add("add", [y, g.const(bias.astype(np.float32))])
        return g.add("add", [y, residual]) if residual is not None else y
    if residual is not None:
        ins.append(residual)
    return g.add("matmul_q", ins, attrs)


def _split_last(g, y, sizes):
    """y[..., n] -> its consecutive pieces of `sizes` along the last axis."""
    parts, start = [], 0
    for n in sizes:
        parts.append(g.add("slice", [y], {"axis": -1, "start": start, "length": n}))
        start += n
    return parts


def _rms_norm(g, x, tensors, name, spec: LlamaSpec, axis):
    w = tensors.get(name).astype(np.float32) + np.float32(spec.family.norm_offset)
    return g.add("rms_norm", [x, g.const(w)], {"axis": axis, "eps": spec.rms_eps})


def _rope(g, x, pos, freq, scale, head_dim):
    """RoPE over the first 2 * len(freq) dims of each head (all of them, unless the model rotates part)."""
    rot = 2 * freq.shape[0]
    if rot == head_dim:
        return g.add("rope", [x, pos, g.const(freq)], {"scale": scale})
    turned = g.add("rope", [g.add("slice", [x], {"axis": -1, "start": 0, "length": rot}), pos, g.const(freq)],
                   {"scale": scale})
    return g.add("concat", [turned, g.add("slice", [x], {"axis": -1, "start": rot, "length": head_dim - rot})],
                 {"axis": -1})


def _qkv_name(spec: LlamaSpec, tensors, t):
    """The q/k/v weight: stored fused (Phi-3) or stacked here from three."""
    if spec.family.fused:
        return t + "self_attn.qkv_proj.weight"
    return tensors.stacked([t + f"self_attn.{n}_proj.weight" for n in "qkv"])


def _dense_mlp(g, h, tensors, prefix, intermediate, spec, precision, group, residual=None):
    """down(act(gate(h)) * up(h)) (+ residual), gate and up as one GEMM (stored fused by Phi-3)."""
    gate_up = prefix + "gate_up_proj.weight"
    if gate_up not in tensors:
        gate_up = tensors.stacked([prefix + "gate_proj.weight", prefix + "up_proj.weight"])
    gate, up = _split_last(g, _linear(g, h, tensors, gate_up, precision, group), [intermediate] * 2)
    return _linear(g, g.add("mul", [g.add(spec.mlp_act, [gate]), up]), tensors, prefix + "down_proj.weight",
                   precision, group, residual=residual)


def _expert_weights(tensors, t, experts):
    """(router [E, H], gate-up [E, 2I, H], down [E, H, I]) in torch's [out, in] layout: fused, as
    transformers' modules hold them, or one tensor per expert, as checkpoints on disk do (Mixtral's
    block_sparse_moe w1/w3/w2, Qwen's mlp.experts.e gate/up/down)."""
    if t + "mlp.experts.gate_up_proj" in tensors:
        return (tensors.get(t + "mlp.gate.weight"), tensors.get(t + "mlp.experts.gate_up_proj"),
                tensors.get(t + "mlp.experts.down_proj"))
    for base, (gate, up, down) in (("block_sparse_moe.", ("w1", "w3", "w2")),
                                   ("mlp.", ("gate_proj", "up_proj", "down_proj"))):
        per = t + base + "experts.{}.{}.weight"
        if per.format(0, gate) in tensors:
            return (tensors.get(t + base + "gate.weight"),
                    np.stack([np.concatenate([tensors.get(per.format(e, gate)), tensors.get(per.format(e, up))])
                              for e in range(experts)]),
                    np.stack([tensors.get(per.format(e, down)) for e in range(experts)]))
    raise CuvilError(f"checkpoint has no expert weights for layer {t}")


def _experts(g, x, ids, w, precision, group):
    """x's rows times each routed expert's w[e].T ([E, out, in]), stored in `precision`."""
    if precision == "fp32":
        ins, attrs = [g.const(np.stack([_transposed(m) for m in w]))], {"bits": 32}
    elif precision == "bf16":
        ins, attrs = [g.const(np.stack([quantize.to_bf16(_transposed(m)) for m in w]))], {"bits": 16}
    else:
        convert = quantize.quantize_int8 if precision == "int8" else lambda m: quantize.quantize_int4(m, group)
        try:
            q, s = zip(*(convert(_transposed(m)) for m in w))
        except QuantizationError as e:
            raise QuantizationError(f"expert weights: {e}") from None
        bits = 8 if precision == "int8" else 4
        ins, attrs = [g.const(np.stack(q)), g.const(np.stack(s))], {"bits": bits,
                                                                    "group": w.shape[2] if bits == 8 else group}
    return g.add("expert_matmul", [x, ids] + ins, attrs)


def _moe(g, h, tensors, t, spec: LlamaSpec, precision, group):
    """A sparse mixture-of-experts MLP, routed in the compiled code: router softmax, top-k (weights
    renormalized where the model does), each token's k experts as grouped GEMMs, their outputs
    weighted and summed; plus Qwen2-MoE's shared expert behind a sigmoid gate."""
    B, T = h.shape[:2]
    router, gate_up, down = _expert_weights(tensors, t, spec.experts)
    probs = g.add("softmax", [g.add("matmul", [h, g.const(_transposed(router))])], {"axis": 2})
    top, ids = g.add("topk", [probs], {"k": spec.top_k, "axis": 2, "largest": True, "sorted": True})
    if spec.norm_topk:
        top = g.add("div", [top, g.add("reduce_sum", [top], {"axes": [2], "keepdims": True})])
    rows = g.add("reshape", [h], {"shape": [B, T, 1, spec.hidden]})
    gate, up = _split_last(g, _experts(g, rows, ids, gate_up, precision, group), [spec.moe_intermediate] * 2)
    y = _experts(g, g.add("mul", [g.add(spec.mlp_act, [gate]), up]), ids, down, precision, group)
    y = g.add("reduce_sum", [g.add("mul", [y, g.add("reshape", [top], {"shape": [B, T, spec.top_k, 1]})])],
              {"axes": [2], "keepdims": False})
    if spec.shared_intermediate:
        shared = _dense_mlp(g, h, tensors, t + "mlp.shared_expert.", spec.shared_intermediate, spec, precision, group)
        gate_w = g.const(_transposed(tensors.get(t + "mlp.shared_expert_gate.weight")))
        weight = g.add("sigmoid", [g.add("matmul", [h, gate_w])])
        y = g.add("add", [y, g.add("mul", [shared, weight])])
    return y


def build_step_graph(spec: LlamaSpec, tensors, rope, *, precision="fp32", group=64,
                     max_batch=1, max_seq_len=2048, max_step_tokens, progress=None, kv_dtype="float32") -> Graph:
    """`rope`: {layer type: (inv_freq, attention scaling)} from spec.rope_parameters. max_step_tokens: the
    most rows x tokens a step takes (compile.from_transformers decides it)."""
    B, T, R = D.Sym("batch"), D.Sym("seq"), D.Sym("rows")
    g = Graph(symbols={"batch": (1, max_step_tokens), "seq": (1, max_seq_len), "rows": (1, max_step_tokens)},
              symbol_products=[("batch", "seq", max_step_tokens)])
    H, Hk, Dh = spec.heads, spec.kv_heads, spec.head_dim
    ids = Value(TensorType((B, T), "int64"), "input_ids")
    start = Value(TensorType((B,), "int64"), "start")
    cache_t = TensorType((spec.layers, max_batch, Hk, max_seq_len, Dh), kv_dtype)
    kc, vc = Value(cache_t, "k_cache"), Value(cache_t, "v_cache")
    slots = Value(TensorType((B,), "int64"), "slots")     # each row's KV cache slot (continuous batching)
    # the tokens (b * T + t) whose logits the step returns: a prompt chunk needs its last token's only,
    # and the output head is 6% of a TinyLlama token's products
    logit_rows = Value(TensorType((R,), "int64"), "logit_rows")
    g.inputs = [ids, start, kc, vc, slots, logit_rows]
    g.input_names = ["input_ids", "start", "k_cache", "v_cache", "slots", "logit_rows"]
    pos = g.add("add", [g.add("reshape", [start], {"shape": [B, 1]}),
                        g.add("reshape", [g.add("iota", [], {"length": T})], {"shape": [1, T]})])
    x = g.add("gather", [g.const(tensors.get("model.embed_tokens.weight")), ids], {"axis": 0})
    if spec.family.embed_scale:      # in the activations' dtype, as transformers rounds it
        x = g.add("mul", [x, g.const(np.array(np.sqrt(spec.hidden), np.float32))])
    attn_in, attn_out, mlp_in, mlp_out = NORM_WEIGHTS[spec.family.norms]
    qk_norm = spec.family.qk_norm
    p = "model.layers.{}."
    for i in range(spec.layers):
        t = p.format(i)
        freq, rope_scale = rope[spec.layer_types[i]]
        h = _rms_norm(g, x, tensors, t + attn_in + ".weight", spec, 2) if attn_in else x
        qkv_name = _qkv_name(spec, tensors, t)
        bias = (np.concatenate([tensors.get(t + f"self_attn.{n}_proj.bias") for n in "qkv"])
                if spec.qkv_bias else None)
        y = _linear(g, h, tensors, qkv_name, precision, group, bias=bias)
        q, k, v = _split_last(g, y, [H * Dh, Hk * Dh, Hk * Dh])
        if qk_norm == "full":          # over all heads' dims at once (OLMo 2)
            q = _rms_norm(g, q, tensors, t + "self_attn.q_norm.weight", spec, 2)
            k = _rms_norm(g, k, tensors, t + "self_attn.k_norm.weight", spec, 2)
        q, k, v = (g.add("reshape", [part], {"shape": [B, T, heads, Dh]})
                   for part, heads in zip((q, k, v), (H, Hk, Hk)))
        if qk_norm == "head":          # each head's dims (Qwen 3, Gemma 3)
            q = _rms_norm(g, q, tensors, t + "self_attn.q_norm.weight", spec, 3)
            k = _rms_norm(g, k, tensors, t + "self_attn.k_norm.weight", spec, 3)
        q, k = _rope(g, q, pos, freq, rope_scale, Dh), _rope(g, k, pos, freq, rope_scale, Dh)
        kc = g.add("kv_update", [kc, k, start, slots], {"layer": i})
        vc = g.add("kv_update", [vc, v, start, slots], {"layer": i})
        a = g.add("cached_attention", [q, kc, vc, start, slots], {"layer": i, "scale": spec.attn_scale,
                                                            "softcap": spec.attn_softcap, "window": spec.window(i)})
        a = g.add("reshape", [a], {"shape": [B, T, H * Dh]})
        x = _residual(g, x, a, tensors, t + "self_attn.o_proj.weight", attn_out and t + attn_out + ".weight",
                      spec, precision, group)
        h = _rms_norm(g, x, tensors, t + mlp_in + ".weight", spec, 2) if mlp_in else x
        if spec.sparse(i):
            y = _moe(g, h, tensors, t, spec, precision, group)
        elif mlp_out:
            y = _dense_mlp(g, h, tensors, t + "mlp.", spec.intermediate, spec, precision, group)
        else:          # the residual added by the down projection's epilogue
            x, y = _dense_mlp(g, h, tensors, t + "mlp.", spec.intermediate, spec, precision, group, residual=x), None
        if y is not None:
            x = g.add("add", [x, _rms_norm(g, y, tensors, t + mlp_out + ".weight", spec, 2) if mlp_out else y])
        if progress:
            progress(i + 1, spec.layers)
    x = g.add("gather", [g.add("reshape", [x], {"shape": [B * T, spec.hidden]}), logit_rows], {"axis": 0})
    x = _rms_norm(g, x, tensors, "model.norm.weight", spec, 1)
    head = "lm_head.weight" if "lm_head.weight" in tensors and not spec.tie_embeddings else "model.embed_tokens.weight"
    logits = _linear(g, x, tensors, head, precision, group)
    if spec.final_softcap:
        cap = g.const(np.array(spec.final_softcap, np.float32))
        logits = g.add("mul", [g.add("tanh", [g.add("div", [logits, cap])]), cap])
    g.outputs = [logits]
    g.output_names = ["logits"]
    return g


def _residual(g, x, y, tensors, weight, out_norm, spec, precision, group):
    """x + y @ W^T, or x + norm(y @ W^T) where the block normalizes its output (`out_norm`)."""
    if not out_norm:
        return _linear(g, y, tensors, weight, precision, group, residual=x)
    return g.add("add", [x, _rms_norm(g, _linear(g, y, tensors, weight, precision, group), tensors, out_norm, spec, 2)])
