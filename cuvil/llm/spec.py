"""The shape of a decoder-only language model, read off its transformers config: the Llama block
and, for each other architecture, one row of FAMILIES saying how its block differs."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from ..errors import CuvilError


@dataclass(frozen=True)
class Family:
    """How an architecture's block differs from Llama's."""
    norms: str = "pre"          # where its RMSNorms sit: a key of NORM_WEIGHTS
    qk_norm: str = ""           # RMSNorm of queries and keys before RoPE: "" none, "head" per head, "full" all heads
    norm_offset: float = 0.0    # RMSNorm scales by (offset + w): Gemma stores w - 1
    embed_scale: bool = False   # embeddings times sqrt(hidden) (Gemma)
    fused: bool = False         # qkv_proj and gate_up_proj stored as one weight each (Phi-3)
    qkv_bias: bool = False
    moe: bool = False           # sparse mixture-of-experts MLPs (Mixtral, Qwen2-MoE)


FAMILIES = {
    "LlamaForCausalLM": Family(),
    "MistralForCausalLM": Family(),
    "Qwen2ForCausalLM": Family(qkv_bias=True),
    "Qwen3ForCausalLM": Family(qk_norm="head"),
    "MixtralForCausalLM": Family(moe=True),
    "Qwen2MoeForCausalLM": Family(qkv_bias=True, moe=True),
    "Phi3ForCausalLM": Family(fused=True),
    "Olmo2ForCausalLM": Family(norms="post", qk_norm="full"),
    "GemmaForCausalLM": Family(norm_offset=1.0, embed_scale=True),
    "Gemma2ForCausalLM": Family(norms="sandwich", norm_offset=1.0, embed_scale=True),
    "Gemma3ForCausalLM": Family(norms="sandwich", qk_norm="head", norm_offset=1.0, embed_scale=True),
}
ARCHITECTURES = tuple(FAMILIES)

# per norm placement, the layer's RMSNorm weights: (before attention, after attention, before the
# MLP, after the MLP); None where there is none. Llama's "post_attention_layernorm" is the MLP's input
# norm, Gemma 2's and OLMo 2's normalize the attention's output.
NORM_WEIGHTS = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}

# the MLP gate's activation, by the config's name for it -> the IR op
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
               "gelu": "gelu"}


@dataclass(frozen=True)
class LlamaSpec:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    qkv_bias: bool
    tie_embeddings: bool
    max_positions: int
    family: Family = Family()
    mlp_act: str = "silu"
    attn_scale: float = 0.0            # 0: head_dim ** -0.5
    attn_softcap: float = 0.0          # 0: none; else scores become cap * tanh(scores / cap)
    final_softcap: float = 0.0         # the same on the logits
    layer_types: tuple = ()            # per layer: "full_attention" or "sliding_attention"
    sliding_window: int = 0            # keys a sliding layer's query sees, itself included
    experts: int = 0                   # mixture of experts: experts per sparse layer (0: dense MLPs)
    top_k: int = 0                     # experts each token is routed to
    norm_topk: bool = True             # the top-k routing weights renormalized to sum 1
    moe_intermediate: int = 0          # an expert's hidden size
    shared_intermediate: int = 0       # a shared expert's hidden size, behind a sigmoid gate (0: none)
    sparse_layers: tuple = ()          # the layers whose MLP is the mixture

    @classmethod
    def from_config(cls, cfg, arch=None) -> "LlamaSpec":
        """`arch`: the model class's name where there is a model object (else read off the config)."""
        arch = arch or (getattr(cfg, "architectures", None) or
                        [type(cfg).__name__.replace("Config", "ForCausalLM")])[0]
        arch = {"Gemma3TextForCausalLM": "Gemma3ForCausalLM"}.get(arch, arch)
        if arch not in FAMILIES:
            raise CuvilError(f"cuvil.llm supports {', '.join(ARCHITECTURES)}; this checkpoint is {arch}")
        family = FAMILIES[arch]
        act_name = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")
        if act_name not in ACTIVATIONS:
            raise CuvilError(f"{arch}: MLP activation {act_name!r} is not supported (supported: "
                             f"{', '.join(ACTIVATIONS)})")
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        pre_attn = getattr(cfg, "query_pre_attn_scalar", None)
        window = int(getattr(cfg, "sliding_window", None) or 0)
        types = tuple(getattr(cfg, "layer_types", None) or
                      ["sliding_attention" if window else "full_attention"] * cfg.num_hidden_layers)
        if unknown := set(types) - {"full_attention", "sliding_attention"}:
            raise CuvilError(f"{arch}: layer types {sorted(unknown)} are not supported")
        return cls(arch=arch, hidden=cfg.hidden_size, layers=cfg.num_hidden_layers, heads=heads,
                   kv_heads=getattr(cfg, "num_key_value_heads", None) or heads, head_dim=head_dim,
                   intermediate=cfg.intermediate_size, vocab=cfg.vocab_size, rms_eps=float(cfg.rms_norm_eps),
                   qkv_bias=family.qkv_bias or bool(getattr(cfg, "attention_bias", False)),
                   tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
                   max_positions=cfg.max_position_embeddings, family=family, mlp_act=ACTIVATIONS[act_name],
                   attn_scale=float(pre_attn) ** -0.5 if pre_attn else float(head_dim) ** -0.5,
                   attn_softcap=float(getattr(cfg, "attn_logit_softcapping", None) or 0.0),
                   final_softcap=float(getattr(cfg, "final_logit_softcapping", None) or 0.0),
                   layer_types=types, sliding_window=window, **(_moe_fields(cfg) if family.moe else {}))

    def sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers

    def window(self, layer: int) -> int:
        """Keys layer `layer`'s queries see (0: all before them)."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else 0


def _moe_fields(cfg) -> dict:
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", 0)
    step, dense = getattr(cfg, "decoder_sparse_step", 1) or 1, set(getattr(cfg, "mlp_only_layers", None) or ())
    return dict(experts=experts, top_k=cfg.num_experts_per_tok, norm_topk=bool(getattr(cfg, "norm_topk_prob", True)),
                moe_intermediate=getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size,
                shared_intermediate=getattr(cfg, "shared_expert_intermediate_size", 0) or 0,
                sparse_layers=tuple(i for i in range(cfg.num_hidden_layers)
                                    if experts and i not in dense and (i + 1) % step == 0))


def _rotary_class(cfg):
    """The architecture's own rotary-embedding module, so every RoPE variant it knows is honoured."""
    modeling = importlib.import_module(type(cfg).__module__.replace(".configuration_", ".modeling_"))
    found = [c for n, c in vars(modeling).items() if n.endswith("RotaryEmbedding") and isinstance(c, type)
             and not n.startswith("_")]
    if not found:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        return LlamaRotaryEmbedding
    return min(found, key=lambda c: len(c.__name__))       # the model's own, not a variant's


def rope_parameters(cfg, layer_types=()):
    """{layer type: (inv_freq [rotary_dim / 2], attention scaling)} with the config's RoPE scaling
    applied, computed by the model's rotary module (one entry per layer type where they differ)."""
    import torch
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    # one dict, or one per layer type (Gemma 3)
    per_type = list(params.values()) if params and all(isinstance(v, dict) for v in params.values()) else [params]
    for p in per_type:
        kind = p.get("rope_type", p.get("type", "default")) if isinstance(p, dict) else "default"
        if kind in ("dynamic", "longrope"):
            raise CuvilError(f"{kind} RoPE scaling changes with the sequence length and is not supported")
    with torch.device("cpu"):
        rot = _rotary_class(cfg)(config=cfg)
    out = {}
    for lt in set(layer_types) or {"full_attention"}:
        inv = getattr(rot, f"{lt}_inv_freq", None)
        scale = getattr(rot, f"{lt}_attention_scaling", None)
        if inv is None:
            inv, scale = rot.inv_freq, getattr(rot, "attention_scaling", 1.0)
        out[lt] = (inv.detach().float().numpy().astype(np.float32), float(scale if scale is not None else 1.0))
    return out
