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
    raise ValueError(arch)


def checkpoint(dest: Path, arch="llama", seed=0):
    """config.json + model.safetensors + tokenizer files in dest."""
    dest.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer_files(dest)
    m = small_model(arch, vocab, seed)
    m.save_pretrained(str(dest), safe_serialization=True)
    return m
