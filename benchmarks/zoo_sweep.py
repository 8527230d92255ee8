"""Sweep of Hugging Face model families the test zoo (tests/models.py) does not cover.

Each model is built from a tiny config with random weights (no downloads), wrapped so forward returns
a tensor or a tuple of tensors, compiled with cuvil at fp32 and compared with torch eager:
max |cuvil - eager| / max |eager| over all outputs, ok at <= 1e-3.

    python -m benchmarks.zoo_sweep                 # every model, each in its own subprocess (300 s timeout)
    python -m benchmarks.zoo_sweep bart t5 mamba   # some of them
    python -m benchmarks.zoo_sweep --one bart      # one model in this process (what the sweep runs)
    python -m benchmarks.zoo_sweep --eager         # build and run each model in eager only (checks the table)

Full stderr of each subprocess goes to --log-dir (default /tmp/zoo_sweep_logs).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

TOL = 1e-3
TIMEOUT_S = 300
SEQ = 12
VOCAB = 128


# ---------------------------------------------------------------------------------------------- helpers

class Wrap(torch.nn.Module):
    """Calls the model with keyword inputs (and fixed extra kwargs) and returns the chosen output fields."""

    def __init__(self, model, names, out=("last_hidden_state",), **extra):
        super().__init__()
        self.model, self.names, self.out, self.extra = model, tuple(names), tuple(out), extra

    def forward(self, *args):
        o = self.model(**dict(zip(self.names, args)), **self.extra)
        res = tuple(o[k] if isinstance(o, dict) else getattr(o, k) for k in self.out)
        return res[0] if len(res) == 1 else res


def _ids(vocab=VOCAB, shape=(2, SEQ), seed=1, low=4):
    # ids above the special tokens (0-3) so no pad-id masking path differs between runs
    return torch.randint(low, vocab, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int64)


def _image(size=32, channels=3):
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(3))


def _audio(n=1600):
    return torch.randn(1, n, generator=torch.Generator().manual_seed(3))


def _randomize_norms(m):
    """Fresh batch norms are identities; give them real statistics so folding is exercised."""
    g = torch.Generator().manual_seed(2)
    for mod in m.modules():
        if isinstance(mod, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            n = mod.num_features
            mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            if mod.weight is not None:
                mod.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
                mod.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


def _T():
    import transformers
    return transformers


def _has(*names):
    T = _T()
    return all(hasattr(T, n) for n in names)


class Absent(Exception):
    pass


def _need(*names):
    if not _has(*names):
        raise Absent(", ".join(n for n in names if not _has(n)))
    T = _T()
    return [getattr(T, n) for n in names]


# ---------------------------------------------------------------------------------------------- encoders

_ENC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=64)


def _encoder(model_cls, cfg_cls, **kw):
    def build():
        M, C = _need(model_cls, cfg_cls)
        torch.manual_seed(0)
        m = M(C(**{**_ENC, **kw})).eval()
        return Wrap(m, ["input_ids"]), (_ids(),)
    return build


def distilbert():
    M, C = _need("DistilBertModel", "DistilBertConfig")
    torch.manual_seed(0)
    m = M(C(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=VOCAB, max_position_embeddings=64)).eval()
    return Wrap(m, ["input_ids"]), (_ids(),)


def layoutlm():
    M, C = _need("LayoutLMModel", "LayoutLMConfig")
    torch.manual_seed(0)
    m = M(C(**_ENC, max_2d_position_embeddings=128)).eval()
    g = torch.Generator().manual_seed(4)
    xy0 = torch.randint(0, 60, (2, SEQ, 2), generator=g)
    wh = torch.randint(0, 60, (2, SEQ, 2), generator=g)
    bbox = torch.cat([xy0, xy0 + wh], -1).to(torch.int64)
    return Wrap(m, ["input_ids", "bbox"]), (_ids(), bbox)


def esm():
    M, C = _need("EsmModel", "EsmConfig")
    torch.manual_seed(0)
    m = M(C(**{**_ENC, "vocab_size": 33}, pad_token_id=1, mask_token_id=32, position_embedding_type="rotary",
            token_dropout=False)).eval()
    return Wrap(m, ["input_ids"]), (_ids(33),)


# ---------------------------------------------------------------------------------------------- decoders

_DEC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=64, use_cache=False)


def _causal(model_cls, cfg_cls, base=True, **kw):
    def build():
        M, C = _need(model_cls, cfg_cls)
        torch.manual_seed(0)
        cfg = C(**{**(_DEC if base else {}), **kw})
        m = M(cfg).eval()
        return Wrap(m, ["input_ids"], out=("logits",), use_cache=False), (_ids(),)
    return build


def mamba():
    M, C = _need("MambaForCausalLM", "MambaConfig")
    torch.manual_seed(0)
    m = M(C(hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=VOCAB, expand=2, conv_kernel=4,
            use_cache=False)).eval()
    return Wrap(m, ["input_ids"], out=("logits",), use_cache=False), (_ids(),)


# ---------------------------------------------------------------------------------------------- seq2seq

def _seq2seq(model_cls, cfg_cls, mask=False, **cfgkw):
    """mask=True passes an all-ones encoder attention mask: for models whose traced (torch.export) path needs one."""
    def build():
        M, C = _need(model_cls, cfg_cls)
        torch.manual_seed(0)
        m = M(C(**cfgkw)).eval()
        ids = _ids()
        if mask:
            return (Wrap(m, ["input_ids", "attention_mask", "decoder_input_ids"], out=("logits",), use_cache=False),
                    (ids, torch.ones_like(ids), _ids(shape=(2, 7), seed=5)))
        return (Wrap(m, ["input_ids", "decoder_input_ids"], out=("logits",), use_cache=False),
                (ids, _ids(shape=(2, 7), seed=5)))
    return build


_BART = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
             encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64, use_cache=False,
             pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)


# ---------------------------------------------------------------------------------------------- vision

def _vision(model_cls, cfg_cls, size=32, out=("last_hidden_state",), norms=False, **kw):
    def build():
        M, C = _need(model_cls, cfg_cls)
        torch.manual_seed(0)
        m = M(C(**kw)).eval()
        if norms:
            _randomize_norms(m)
        return Wrap(m, ["pixel_values"], out=out), (_image(size),)
    return build


_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8)


# ---------------------------------------------------------------------------------------------- audio

def _speech(model_cls, cfg_cls, **extra):
    def build():
        M, C = _need(model_cls, cfg_cls)
        torch.manual_seed(0)
        cfg = C(**{**dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                          num_conv_pos_embedding_groups=4), **extra})
        m = M(cfg).eval()
        return Wrap(m, ["input_values"]), (_audio(),)
    return build


def ast():
    M, C = _need("ASTModel", "ASTConfig")
    torch.manual_seed(0)
    m = M(C(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=16,
            frequency_stride=10, time_stride=10, max_length=64, num_mel_bins=32)).eval()
    x = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(3))
    return Wrap(m, ["input_values"]), (x,)


# ---------------------------------------------------------------------------------------------- table

CASES = {
    # text encoders
    "distilbert": distilbert,
    "roberta": _encoder("RobertaModel", "RobertaConfig", pad_token_id=1),
    "albert": _encoder("AlbertModel", "AlbertConfig", embedding_size=16),
    "electra": _encoder("ElectraModel", "ElectraConfig", embedding_size=16),
    "deberta_v2": _encoder("DebertaV2Model", "DebertaV2Config", relative_attention=True, position_buckets=16,
                           pos_att_type=["p2c", "c2p"], max_relative_positions=-1, position_biased_input=False),
    "mpnet": _encoder("MPNetModel", "MPNetConfig", pad_token_id=1),
    "xlm_roberta": _encoder("XLMRobertaModel", "XLMRobertaConfig", pad_token_id=1),
    "convbert": _encoder("ConvBertModel", "ConvBertConfig", embedding_size=32, head_ratio=2, conv_kernel_size=5,
                         num_groups=1),
    "squeezebert": _encoder("SqueezeBertModel", "SqueezeBertConfig", embedding_size=32, q_groups=2, k_groups=2,
                            v_groups=2, post_attention_groups=2, intermediate_groups=4, output_groups=4),
    "esm": esm,
    "layoutlm": layoutlm,
    # decoders
    "gpt_neo": _causal("GPTNeoForCausalLM", "GPTNeoConfig", base=False, hidden_size=32, num_layers=2, num_heads=2,
                       attention_types=[[["global", "local"], 1]], window_size=4, vocab_size=VOCAB,
                       max_position_embeddings=64, intermediate_size=64, use_cache=False),
    "gptj": _causal("GPTJForCausalLM", "GPTJConfig", base=False, n_embd=32, n_layer=2, n_head=2, rotary_dim=8,
                    vocab_size=VOCAB, n_positions=64, use_cache=False),
    "opt": _causal("OPTForCausalLM", "OPTConfig", base=False, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=2, ffn_dim=64, word_embed_proj_dim=32, vocab_size=VOCAB,
                   max_position_embeddings=64, use_cache=False, pad_token_id=1),
    "bloom": _causal("BloomForCausalLM", "BloomConfig", base=False, hidden_size=32, n_layer=2, n_head=2,
                     vocab_size=VOCAB, use_cache=False),
    "falcon": _causal("FalconForCausalLM", "FalconConfig", base=False, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, vocab_size=VOCAB, use_cache=False, new_decoder_architecture=False,
                      multi_query=True, parallel_attn=True, alibi=False),
    "phi": _causal("PhiForCausalLM", "PhiConfig"),
    "phi3": _causal("Phi3ForCausalLM", "Phi3Config", pad_token_id=0),
    "qwen2": _causal("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=1),
    "gemma": _causal("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=1, head_dim=16),
    "gemma2": _causal("Gemma2ForCausalLM", "Gemma2Config", num_key_value_heads=1, head_dim=16, sliding_window=4,
                      query_pre_attn_scalar=16),
    "mistral": _causal("MistralForCausalLM", "MistralConfig", num_key_value_heads=1, sliding_window=None),
    "stablelm": _causal("StableLmForCausalLM", "StableLmConfig", num_key_value_heads=2),
    "gpt_bigcode": _causal("GPTBigCodeForCausalLM", "GPTBigCodeConfig", base=False, n_embd=32, n_layer=2, n_head=2,
                           n_inner=64, vocab_size=VOCAB, n_positions=64, multi_query=True, use_cache=False),
    "codegen": _causal("CodeGenForCausalLM", "CodeGenConfig", base=False, n_embd=32, n_layer=2, n_head=2,
                       rotary_dim=8, vocab_size=VOCAB, n_positions=64, n_ctx=64, use_cache=False),
    "olmo": _causal("OlmoForCausalLM", "OlmoConfig", pad_token_id=1),
    "starcoder2": _causal("Starcoder2ForCausalLM", "Starcoder2Config", num_key_value_heads=1, sliding_window=None),
    "mamba": mamba,
    # seq2seq (full encoder-decoder forward)
    "bart": _seq2seq("BartForConditionalGeneration", "BartConfig", **_BART),
    "t5": _seq2seq("T5ForConditionalGeneration", "T5Config", d_model=32, num_layers=2, num_decoder_layers=2,
                   num_heads=2, d_ff=64, d_kv=16, vocab_size=VOCAB, use_cache=False, decoder_start_token_id=0),
    "pegasus": _seq2seq("PegasusForConditionalGeneration", "PegasusConfig", **_BART),
    "marian": _seq2seq("MarianMTModel", "MarianConfig", **{**_BART, "decoder_start_token_id": 1}),
    # vision
    "deit": _vision("DeiTModel", "DeiTConfig", **_VIT),
    "dinov2": _vision("Dinov2Model", "Dinov2Config", **_VIT),
    "levit": _vision("LevitModel", "LevitConfig", size=128, norms=True, out=("last_hidden_state", "pooler_output"),
                     image_size=128, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
                     key_dim=[8, 8, 8], mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2]),
    "mobilevit": _vision("MobileViTModel", "MobileViTConfig", size=64, norms=True, image_size=64,
                         hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                         num_attention_heads=2),
    "mobilevitv2": _vision("MobileViTV2Model", "MobileViTV2Config", size=64, norms=True, image_size=64,
                           width_multiplier=0.25),
    "poolformer": _vision("PoolFormerModel", "PoolFormerConfig", size=64, image_size=64, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]),
    "convnextv2": _vision("ConvNextV2Model", "ConvNextV2Config", size=64, hidden_sizes=[16, 32, 48],
                          depths=[1, 1, 1], num_stages=3),
    "cvt": _vision("CvtModel", "CvtConfig", size=64, norms=True, embed_dim=[16, 32], num_heads=[1, 2], depth=[1, 2],  # depth[i] > i: transformers indexes
                   # its per-layer drop-path list by the stage
                   patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], mlp_ratio=[2.0, 2.0],
                   attention_drop_rate=[0.0, 0.0], drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0],
                   qkv_bias=[True, True], cls_token=[False, True], qkv_projection_method=["dw_bn", "dw_bn"],
                   kernel_qkv=[3, 3], padding_kv=[1, 1], stride_kv=[2, 2], padding_q=[1, 1], stride_q=[1, 1]),
    "focalnet": _vision("FocalNetModel", "FocalNetConfig", image_size=32, patch_size=4, embed_dim=16,
                        depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3]),
    "bit": _vision("BitModel", "BitConfig", size=64, embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], num_groups=4,
                   out=("last_hidden_state", "pooler_output")),
    "swinv2": _vision("Swinv2Model", "Swinv2Config", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                      num_heads=[1, 2], window_size=4),
    "pvt_v2": _vision("PvtV2Model", "PvtV2Config", size=64, image_size=64, num_encoder_blocks=2, depths=[1, 1],
                      sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                      num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
    "data2vec_vision": _vision("Data2VecVisionModel", "Data2VecVisionConfig", **_VIT, use_relative_position_bias=True),
    "yolos": _vision("YolosForObjectDetection", "YolosConfig", out=("logits", "pred_boxes"),
                     **{**_VIT, "image_size": [32, 32]}, num_detection_tokens=5, num_labels=3),
    # audio
    "wavlm": _speech("WavLMModel", "WavLMConfig", num_buckets=16, max_bucket_distance=32),
    "data2vec_audio": _speech("Data2VecAudioModel", "Data2VecAudioConfig", conv_pos_kernel_size=5,
                              num_conv_pos_embeddings=5),
    "sew": _speech("SEWModel", "SEWConfig", squeeze_factor=2),
    "unispeech": _speech("UniSpeechModel", "UniSpeechConfig"),
    "ast": ast,
}

# families beyond the brief's list: unusual ops (FFT, LSH-free chunked attention, recurrences, Conv3d, LSTM, ...)
CASES.update({
    "fnet": _encoder("FNetModel", "FNetConfig", use_tpu_fourier_optimizations=False, pad_token_id=1),
    "xlnet": lambda: _xlnet(),
    "funnel": lambda: _funnel(),
    "reformer_local": _encoder("ReformerModel", "ReformerConfig", attn_layers=["local", "local"],
                               attention_head_size=16, axial_pos_embds=False, feed_forward_size=64,
                               local_attn_chunk_length=4, is_decoder=False, pad_token_id=1),
    "canine": _encoder("CanineModel", "CanineConfig", downsampling_rate=4, upsampling_kernel_size=4,
                       num_hash_functions=4, num_hash_buckets=64, local_transformer_stride=4),
    "modernbert": _encoder("ModernBertModel", "ModernBertConfig", local_attention=4, global_attn_every_n_layers=2,
                           pad_token_id=1, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3),
    "nystromformer": _encoder("NystromformerModel", "NystromformerConfig", num_landmarks=4, segment_means_seq_len=SEQ,
                              conv_kernel_size=3, pad_token_id=1),
    "deberta": _encoder("DebertaModel", "DebertaConfig", relative_attention=True, pos_att_type=["c2p", "p2c"],
                        max_relative_positions=-1, position_biased_input=False),
    "gpt_neox": _causal("GPTNeoXForCausalLM", "GPTNeoXConfig", rotary_pct=0.25),
    "mpt": _causal("MptForCausalLM", "MptConfig", base=False, d_model=32, n_heads=2, n_layers=2, expansion_ratio=2,
                   max_seq_len=64, vocab_size=VOCAB, use_cache=False),
    "cohere": _causal("CohereForCausalLM", "CohereConfig", num_key_value_heads=1, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2),
    "qwen3": _causal("Qwen3ForCausalLM", "Qwen3Config", num_key_value_heads=1, head_dim=16),
    "gemma3_text": _causal("Gemma3ForCausalLM", "Gemma3TextConfig", num_key_value_heads=1, head_dim=16,
                           sliding_window=4, query_pre_attn_scalar=16,
                           layer_types=["sliding_attention", "full_attention"]),
    "xglm": _causal("XGLMForCausalLM", "XGLMConfig", base=False, d_model=32, num_layers=2, attention_heads=2, ffn_dim=64,
                    vocab_size=VOCAB, max_position_embeddings=64, use_cache=False, pad_token_id=1),
    "persimmon": _causal("PersimmonForCausalLM", "PersimmonConfig"),
    "olmo2": _causal("Olmo2ForCausalLM", "Olmo2Config", pad_token_id=1, bos_token_id=None, eos_token_id=2),
    "deepseek_v3": _causal("DeepseekV3ForCausalLM", "DeepseekV3Config", num_key_value_heads=2, kv_lora_rank=16,
                           q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
                           num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                           moe_intermediate_size=32, n_shared_experts=1, pad_token_id=None, bos_token_id=0,
                           eos_token_id=1),
    "rwkv": _causal("RwkvForCausalLM", "RwkvConfig", base=False, vocab_size=VOCAB, context_length=64, hidden_size=32,
                    num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, use_cache=False),
    "mamba2": _causal("Mamba2ForCausalLM", "Mamba2Config", base=False, hidden_size=32, num_hidden_layers=2,
                      num_heads=4, head_dim=16, state_size=8, expand=2, n_groups=1, vocab_size=VOCAB, chunk_size=4,
                      use_cache=False),
    "recurrent_gemma": _causal("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", base=False, num_hidden_layers=2,
                               vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                               num_key_value_heads=1, lru_width=32, attention_window_size=8, conv1d_width=4,
                               block_types=["recurrent", "attention"], use_cache=False),
    "jamba": _causal("JambaForCausalLM", "JambaConfig", num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                     expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
                     mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False),
    "mbart": _seq2seq("MBartForConditionalGeneration", "MBartConfig", **_BART),
    "m2m100": _seq2seq("M2M100ForConditionalGeneration", "M2M100Config", **_BART),
    # without an attention mask, torch.export fails in transformers' transient-global side bias (batch 1 vs 2)
    "longt5": _seq2seq("LongT5ForConditionalGeneration", "LongT5Config", mask=True, d_model=32, num_layers=2,
                       num_decoder_layers=2, num_heads=2, d_ff=64, d_kv=16, vocab_size=VOCAB, use_cache=False,
                       decoder_start_token_id=0, local_radius=4, global_block_size=4,
                       encoder_attention_type="transient-global"),
    "switch_transformers": _seq2seq("SwitchTransformersForConditionalGeneration", "SwitchTransformersConfig",
                                    d_model=32, num_layers=2, num_decoder_layers=2, num_heads=2, d_ff=64, d_kv=16,
                                    num_experts=4, expert_capacity=32, encoder_sparse_step=1, decoder_sparse_step=1,
                                    vocab_size=VOCAB, use_cache=False, decoder_start_token_id=0),
    "efficientnet": _vision("EfficientNetModel", "EfficientNetConfig", size=64, norms=True,
                            out=("last_hidden_state", "pooler_output"), image_size=64, width_coefficient=0.25,
                            depth_coefficient=0.25, hidden_dim=320),
    "mobilenet_v1": _vision("MobileNetV1Model", "MobileNetV1Config", size=64, norms=True,
                            out=("last_hidden_state", "pooler_output"), image_size=64, depth_multiplier=0.25),
    "mobilenet_v2": _vision("MobileNetV2Model", "MobileNetV2Config", size=64, norms=True,
                            out=("last_hidden_state", "pooler_output"), image_size=64, depth_multiplier=0.25),
    "regnet": _vision("RegNetModel", "RegNetConfig", size=64, norms=True, out=("last_hidden_state", "pooler_output"),
                      embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8),
    "hiera": _vision("HieraModel", "HieraConfig", size=64, embed_dim=16, image_size=[64, 64], patch_size=[7, 7],
                     patch_stride=[4, 4], patch_padding=[3, 3], depths=[1, 1], num_heads=[1, 2], query_stride=[2, 2],
                     masked_unit_size=[8, 8], masked_unit_attention=[True, False], mlp_ratio=2.0,
                     num_query_pool=1),
    "swin2sr": _vision("Swin2SRForImageSuperResolution", "Swin2SRConfig", out=("reconstruction",), image_size=32,
                       patch_size=1, embed_dim=16, depths=[1], num_heads=[2], window_size=4, upscale=2,
                       upsampler="pixelshuffle"),
    "videomae": lambda: _videomae(),
    "encodec": lambda: _encodec(),
    "patchtst": lambda: _patchtst(),
})


def _xlnet():
    M, C = _need("XLNetModel", "XLNetConfig")
    torch.manual_seed(0)
    m = M(C(d_model=32, n_layer=2, n_head=2, d_inner=64, vocab_size=VOCAB, use_mems_eval=False)).eval()
    return Wrap(m, ["input_ids"]), (_ids(),)


def _funnel():
    M, C = _need("FunnelModel", "FunnelConfig")
    torch.manual_seed(0)
    m = M(C(d_model=32, n_head=2, d_head=16, d_inner=64, block_sizes=[1, 1], num_decoder_layers=1,
            vocab_size=VOCAB)).eval()
    return Wrap(m, ["input_ids"]), (_ids(),)


def _videomae():
    M, C = _need("VideoMAEModel", "VideoMAEConfig")
    torch.manual_seed(0)
    m = M(C(**_VIT, num_frames=4, tubelet_size=2)).eval()
    x = torch.randn(1, 4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    return Wrap(m, ["pixel_values"]), (x,)


def _encodec():
    M, C = _need("EncodecModel", "EncodecConfig")
    torch.manual_seed(0)
    m = M(C(target_bandwidths=[1.5], sampling_rate=1600, hidden_size=16, num_filters=4, num_residual_layers=1,
            upsampling_ratios=[4, 2], codebook_size=32, num_lstm_layers=1)).eval()
    x = torch.randn(1, 1, 1600, generator=torch.Generator().manual_seed(3)) * 0.1
    return Wrap(m, ["input_values"], out=("audio_values",)), (x,)


def _patchtst():
    M, C = _need("PatchTSTModel", "PatchTSTConfig")
    torch.manual_seed(0)
    m = M(C(num_input_channels=2, context_length=32, patch_length=8, patch_stride=8, d_model=32,
            num_hidden_layers=2, num_attention_heads=2, ffn_dim=64)).eval()
    x = torch.randn(1, 32, 2, generator=torch.Generator().manual_seed(3))
    return Wrap(m, ["past_values"]), (x,)


# ---------------------------------------------------------------------------------------------- one model

def _leaves(out):
    from torch.utils import _pytree
    return [t for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def run_one(name, eager_only=False):
    torch.set_num_threads(1)
    try:
        model, inputs = CASES[name]()
    except Absent as e:
        return {"name": name, "status": f"absent ({e})", "compile_s": None}
    with torch.no_grad():
        expected = [t.detach().numpy() for t in _leaves(model(*inputs))]
    if eager_only:
        return {"name": name, "status": "eager ok " + ", ".join(str(tuple(e.shape)) for e in expected),
                "compile_s": None}
    import cuvil
    with tempfile.TemporaryDirectory(prefix="zoo_sweep_") as cache:
        t0 = time.perf_counter()
        cm = cuvil.compile(model, inputs, cache_dir=cache, num_threads=1)
        compile_s = time.perf_counter() - t0
        got = cm.run(*[t.numpy() for t in inputs])
    return _compare(name, expected, got, compile_s)


def _compare(name, expected, got, compile_s):
    import numpy as np
    if len(got) != len(expected):
        return {"name": name, "status": f"mismatch: {len(got)} outputs vs {len(expected)}", "compile_s": compile_s}
    worst = 0.0
    for e, g in zip(expected, got):
        if tuple(g.shape) != tuple(e.shape):
            return {"name": name, "status": f"mismatch: shape {tuple(g.shape)} vs {tuple(e.shape)}",
                    "compile_s": compile_s}
        g = np.asarray(g, dtype=np.float64)
        e = e.astype(np.float64)
        if not np.all(np.isfinite(g)):
            return {"name": name, "status": "mismatch: non-finite output", "compile_s": compile_s}
        worst = max(worst, float(np.max(np.abs(g - e)) / max(float(np.max(np.abs(e))), 1e-30)))
    status = "ok" if worst <= TOL else "mismatch"
    return {"name": name, "status": f"{status} (rel err {worst:.2e})", "compile_s": compile_s}


def _one_main(name, eager_only):
    try:
        res = run_one(name, eager_only)
    except Exception as e:  # noqa: BLE001 - reported, with the traceback on stderr
        import traceback
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        res = {"name": name, "status": f"{type(e).__name__}: {first}"[:160], "compile_s": None}
    sys.stdout.flush()
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------------------- sweep

def sweep(names, eager_only, log_dir):
    os.makedirs(log_dir, exist_ok=True)
    rows = []
    for name in names:
        cmd = [sys.executable, "-m", "benchmarks.zoo_sweep", "--one", name] + (["--eager"] if eager_only else [])
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            res = None
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    res = json.loads(line[7:])
            if res is None:
                res = {"name": name, "status": f"crash (return code {proc.returncode})", "compile_s": None}
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the subprocess and any compiler it started
            out, err = proc.communicate()
            res = {"name": name, "status": f"timeout (> {TIMEOUT_S} s)", "compile_s": None}
        res["wall_s"] = time.perf_counter() - t0
        with open(os.path.join(log_dir, f"{name}.log"), "w") as f:
            f.write(out + "\n--- stderr ---\n" + err)
        rows.append(res)
        cs = f"{res['compile_s']:.1f}" if res.get("compile_s") is not None else "-"
        print(f"{name:16s} {res['status']}  compile {cs} s  (wall {res['wall_s']:.0f} s)", flush=True)
    print()
    print("| model | status | compile s |")
    print("|---|---|---|")
    for r in rows:
        cs = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else "-"
        print(f"| {r['name']} | {r['status']} | {cs} |")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"models (default: all): {', '.join(CASES)}")
    ap.add_argument("--one", help="run one model in this process and print a RESULT line")
    ap.add_argument("--eager", action="store_true", help="build and run in eager only; no compile")
    ap.add_argument("--log-dir", default="/tmp/zoo_sweep_logs")
    a = ap.parse_args(argv)
    if a.one:
        _one_main(a.one, a.eager)
        return
    bad = [n for n in a.names if n not in CASES]
    if bad:
        ap.error(f"unknown model(s): {', '.join(bad)}")
    sweep(a.names or list(CASES), a.eager, a.log_dir)


if __name__ == "__main__":
    main()
