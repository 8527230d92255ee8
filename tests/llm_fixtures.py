"""Small random Llama-family checkpoints with a real byte-level BPE tokenizer, built offline."""
from __future__ import annotations

import json
from pathlib import Path

import torch

CORPUS = ["cuvil compiles models ahead of time", "le café est très bon à Genève", "数据 编译器 模型",
          "emoji test 🙂🚀 done", "the quick brown fox jumps over the lazy dog"] * 20


def tokenizer_files(dest: Path, vocab_size=300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False,
        "chat_template": "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}"}))
    return tok.get_vocab_size()


def small_model(arch="llama", vocab=300, seed=0):
    import transformers as T
    torch.manual_seed(seed)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=vocab, max_position_embeddings=256, eos_token_id=1,
                  bos_token_id=0)
    if arch == "llama":
        cfg = T.LlamaConfig(**common, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        return T.LlamaForCausalLM(cfg).eval()
    if arch == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(**common, sliding_window=None)).eval()
    if arch == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(**common, tie_word_embeddings=True)).eval()
    # a window of 8 keys, caps small enough to bend random weights' scores: each feature is exercised
    # by a 12-token prompt and 32 decode steps
    if arch == "mistral_window":
        return T.MistralForCausalLM(T.MistralConfig(**common, sliding_window=8)).eval()
    if arch == "qwen3":
        return _randomize_norms(T.Qwen3ForCausalLM(T.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)))
    if arch == "phi3":         # partial RoPE (Phi-4-mini's), fused qkv and gate-up weights
        return _randomize_norms(T.Phi3ForCausalLM(T.Phi3Config(
            **common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            pad_token_id=0)))
    if arch == "olmo2":
        return _randomize_norms(T.Olmo2ForCausalLM(T.Olmo2Config(**common, pad_token_id=0)))
    gemma = dict(common, head_dim=24, hidden_activation="gelu_pytorch_tanh", pad_token_id=0)
    if arch == "gemma":
        return _randomize_norms(T.GemmaForCausalLM(T.GemmaConfig(**gemma)))
    if arch == "gemma2":
        return _randomize_norms(T.Gemma2ForCausalLM(T.Gemma2Config(
            **gemma, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=1.0,
            final_logit_softcapping=3.0, attn_implementation="eager")))
    if arch == "gemma3":
        return _randomize_norms(T.Gemma3ForCausalLM(T.Gemma3TextConfig(
            **gemma, query_pre_attn_scalar=16, sliding_window=8, sliding_window_pattern=2,
            attn_implementation="eager")))
    moe = dict(common, num_experts_per_tok=2)
    if arch == "mixtral":
        return T.MixtralForCausalLM(T.MixtralConfig(**moe, num_local_experts=4)).eval()
    if arch == "qwen2_moe":        # a dense layer (mlp_only_layers), routing weights not renormalized
        return T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(**moe, num_experts=4, moe_intermediate_size=48,
                                                      shared_expert_intermediate_size=80, mlp_only_layers=[1])).eval()
    raise ValueError(arch)


def _randomize_norms(model):
    """Norm weights start at 1 (Gemma's at 0, stored as w - 1): random ones, so a norm read in the
    wrong place or without Gemma's offset shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    return model.eval()


def checkpoint(dest: Path, arch="llama", seed=0):
    """config.json + model.safetensors + tokenizer files in dest."""
    dest.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer_files(dest)
    m = small_model(arch, vocab, seed)
    m.save_pretrained(str(dest), safe_serialization=True)
    return m
