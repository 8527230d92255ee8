"""A Llama safetensors checkpoint -> GGUF (F32, Q8_0 or Q4_0) for llama.cpp, with the gguf package's
writer and quantizers: the same weights cuvil compiles, so the two run the same model.

    python -m benchmarks.gguf_export CHECKPOINT_DIR OUT.gguf --type q4_0

Q and K projections are permuted from Hugging Face's rotate-half layout to GGUF's interleaved
rope layout, as llama.cpp's own converter does; the vocabulary is placeholder tokens, with the 256
byte tokens of SentencePiece's byte fallback at ids 3..258, so that a text prompt (llama.cpp's server
takes only text) tokenizes one token per byte (benchmarks.serve_llm)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

BYTE_TOKENS = 3              # the first byte token's id
TYPES = {"f32": "F32", "q8_0": "Q8_0", "q4_0": "Q4_0"}
LAYER_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                 "post_attention_layernorm": "ffn_norm"}


def _permute(w, heads):
    """rotate-half rows -> interleaved pairs, per head (llama.cpp's convert_hf_to_gguf permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def export(ckpt: Path, out: Path, qtype: str = "q4_0", progress=print):
    import gguf
    from safetensors.numpy import load_file
    cfg = json.loads((ckpt / "config.json").read_text())
    tensors = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    qt = getattr(gguf.GGMLQuantizationType, TYPES[qtype])
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(ckpt.name)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(h)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(h // heads)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_file_type({"f32": 0, "q8_0": 7, "q4_0": 2}[qtype])
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("llama")
    byte = range(BYTE_TOKENS, BYTE_TOKENS + 256)
    w.add_token_list([(f"<0x{i - byte.start:02X}>" if i in byte else f"<t{i}>").encode() for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([6 if i in byte else 1 for i in range(vocab)])         # 6: llama.cpp's BYTE type
    w.add_bos_token_id(cfg.get("bos_token_id", 1) or 1)
    w.add_eos_token_id(cfg.get("eos_token_id", 2) or 2)

    def put(name, a, quantize=True):
        a = np.ascontiguousarray(a.astype(np.float32))
        if quantize and qt != gguf.GGMLQuantizationType.F32 and a.ndim == 2 and a.shape[-1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, a)

    put("token_embd.weight", tensors["model.embed_tokens.weight"])
    for i in range(L):
        for hf, gg in LAYER_TENSORS.items():
            a = tensors[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                a = _permute(a, heads)
            elif gg == "attn_k":
                a = _permute(a, kv)
            put(f"blk.{i}.{gg}.weight", a, quantize=a.ndim == 2)
        progress(f"[gguf] layer {i + 1}/{L}")
    put("output_norm.weight", tensors["model.norm.weight"], quantize=False)
    put("output.weight", tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("output")
    ap.add_argument("--type", default="q4_0", choices=sorted(TYPES))
    a = ap.parse_args(argv)
    export(Path(a.checkpoint), Path(a.output), a.type)


if __name__ == "__main__":
    main()
