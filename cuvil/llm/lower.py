"""Llama-family model -> one IR graph `step(ids[B, T], start[B], k_cache, v_cache) -> logits[B, T, V]`.

Prefill is a step with T prompt tokens, decode a step with T = 1 for every sequence in the batch:
the same compiled code, the same weights, one preallocated KV cache (written in place)."""
from __future__ import annotations

import numpy as np

from ..errors import QuantizationError
from ..ir import dims as D
from ..ir.graph import Graph, TensorType, Value
from ..ir.ops.llm import act_block
from . import quantize
from .spec import LlamaSpec


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


def build_step_graph(spec: LlamaSpec, tensors, inv_freq, rope_scale, *, precision="fp32", group=64,
                     max_batch=1, max_seq_len=2048, progress=None) -> Graph:
    B, T = D.Sym("batch"), D.Sym("seq")
    g = Graph(symbols={"batch": (1, max_batch), "seq": (1, max_seq_len)})
    H, Hk, Dh, Hd = spec.heads, spec.kv_heads, spec.head_dim, spec.hidden
    ids = Value(TensorType((B, T), "int64"), "input_ids")
    start = Value(TensorType((B,), "int64"), "start")
    cache_t = TensorType((spec.layers, max_batch, Hk, max_seq_len, Dh), "float32")
    kc, vc = Value(cache_t, "k_cache"), Value(cache_t, "v_cache")
    g.inputs, g.input_names = [ids, start, kc, vc], ["input_ids", "start", "k_cache", "v_cache"]
    pos = g.add("add", [g.add("reshape", [start], {"shape": [B, 1]}),
                        g.add("reshape", [g.add("iota", [], {"length": T})], {"shape": [1, T]})])
    freq = g.const(inv_freq)
    x = g.add("gather", [g.const(tensors.get("model.embed_tokens.weight")), ids], {"axis": 0})
    p = "model.layers.{}."
    scale = 1.0 / float(np.sqrt(Dh))
    for i in range(spec.layers):
        t = p.format(i)
        h = g.add("rms_norm", [x, g.const(tensors.get(t + "input_layernorm.weight").astype(np.float32))],
                  {"axis": 2, "eps": spec.rms_eps})
        # q, k and v as one GEMM over the stacked weights, then split
        names = [t + f"self_attn.{n}_proj.weight" for n in "qkv"]
        bias = (np.concatenate([tensors.get(t + f"self_attn.{n}_proj.bias") for n in "qkv"])
                if spec.qkv_bias else None)
        y = _linear(g, h, tensors, tensors.stacked(names), precision, group, bias=bias)
        qkv = [g.add("reshape", [part], {"shape": [B, T, heads, Dh]})
               for part, heads in zip(_split_last(g, y, [H * Dh, Hk * Dh, Hk * Dh]), (H, Hk, Hk))]
        q = g.add("rope", [qkv[0], pos, freq], {"scale": rope_scale})
        k = g.add("rope", [qkv[1], pos, freq], {"scale": rope_scale})
        kc = g.add("kv_update", [kc, k, start], {"layer": i})
        vc = g.add("kv_update", [vc, qkv[2], start], {"layer": i})
        a = g.add("cached_attention", [q, kc, vc, start], {"layer": i, "scale": scale})
        a = g.add("reshape", [a], {"shape": [B, T, H * Dh]})
        x = _linear(g, a, tensors, t + "self_attn.o_proj.weight", precision, group, residual=x)
        h = g.add("rms_norm", [x, g.const(tensors.get(t + "post_attention_layernorm.weight").astype(np.float32))],
                  {"axis": 2, "eps": spec.rms_eps})
        gate_up = tensors.stacked([t + "mlp.gate_proj.weight", t + "mlp.up_proj.weight"])
        gate, up = _split_last(g, _linear(g, h, tensors, gate_up, precision, group), [spec.intermediate] * 2)
        x = _linear(g, g.add("mul", [g.add("silu", [gate]), up]), tensors, t + "mlp.down_proj.weight",
                    precision, group, residual=x)
        if progress:
            progress(i + 1, spec.layers)
    x = g.add("rms_norm", [x, g.const(tensors.get("model.norm.weight").astype(np.float32))],
              {"axis": 2, "eps": spec.rms_eps})
    head = "lm_head.weight" if "lm_head.weight" in tensors and not spec.tie_embeddings else "model.embed_tokens.weight"
    g.outputs = [_linear(g, x, tensors, head, precision, group)]
    g.output_names = ["logits"]
    return g
