"""The shape of a Llama-family model, read off its transformers config."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CuvilError

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


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

    @classmethod
    def from_config(cls, cfg) -> "LlamaSpec":
        arch = (getattr(cfg, "architectures", None) or [type(cfg).__name__.replace("Config", "ForCausalLM")])[0]
        if arch not in ARCHITECTURES:
            raise CuvilError(f"cuvil.llm supports {', '.join(ARCHITECTURES)}; this checkpoint is {arch}")
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", arch == "MistralForCausalLM") \
                and cfg.sliding_window < cfg.max_position_embeddings:
            raise CuvilError(f"sliding-window attention (window {cfg.sliding_window}) is not supported yet")
        heads = cfg.num_attention_heads
        return cls(arch=arch, hidden=cfg.hidden_size, layers=cfg.num_hidden_layers, heads=heads,
                   kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                   intermediate=cfg.intermediate_size, vocab=cfg.vocab_size, rms_eps=float(cfg.rms_norm_eps),
                   qkv_bias=arch == "Qwen2ForCausalLM" or bool(getattr(cfg, "attention_bias", False)),
                   tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
                   max_positions=cfg.max_position_embeddings)


def rope_parameters(cfg):
    """(inv_freq [head_dim/2], attention scaling) with the config's RoPE scaling applied, computed by
    transformers' own rotary module so every scaling type it knows is honoured."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    scaling = getattr(cfg, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind == "dynamic":
        raise CuvilError("dynamic NTK RoPE scaling changes with the sequence length and is not supported")
    with torch.device("cpu"):
        rot = LlamaRotaryEmbedding(config=cfg)
    return rot.inv_freq.detach().float().numpy().astype(np.float32), float(getattr(rot, "attention_scaling", 1.0))
