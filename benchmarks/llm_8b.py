"""Build a Llama-3-8B-shaped int4 artifact on this machine (24 GiB): peak memory of the build and
of the loaded artifact, build time, and decode speed. The checkpoint is random bf16 weights in
safetensors shards, written tensor by tensor (the model object is never built).

    python -m benchmarks.llm_8b [--precision int4] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
                 rope_theta=500000.0, tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
                 model_type="llama", torch_dtype="bfloat16", bos_token_id=128000, eos_token_id=128001,
                 hidden_act="silu")


def make_checkpoint(d: Path, cfg=LLAMA3_8B):
    """Random bf16 weights, one shard per layer, with the index transformers writes."""
    import torch
    from safetensors.torch import save_file
    if (d / "model.safetensors.index.json").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    h, i, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
    weight_map = {}

    def shard(name, tensors):
        save_file(tensors, str(d / name))
        weight_map.update({k: name for k in tensors})
    shard("embed.safetensors", {"model.embed_tokens.weight": rnd(cfg["vocab_size"], h)})
    for layer in range(L):
        p = f"model.layers.{layer}."
        shard(f"layer{layer:02d}.safetensors", {
            p + "self_attn.q_proj.weight": rnd(h, h), p + "self_attn.k_proj.weight": rnd(kv, h),
            p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, h),
            p + "mlp.gate_proj.weight": rnd(i, h), p + "mlp.up_proj.weight": rnd(i, h),
            p + "mlp.down_proj.weight": rnd(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)})
        print(f"[checkpoint] layer {layer + 1}/{L}", flush=True)
    shard("head.safetensors", {"model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
                               "lm_head.weight": rnd(cfg["vocab_size"], h)})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


BUILD = """
import json, sys, time, resource
import cuvil.llm
t = time.perf_counter()
llm = cuvil.llm.from_transformers(sys.argv[1], precision=sys.argv[2], max_seq_len=512, measure_error=False,
                                  num_threads=int(sys.argv[3]))
build_s = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"build_s": build_s, "build_peak_rss_mib": peak, "path": str(llm.path)}))
"""

RUN = """
import json, sys, time, resource
import numpy as np, cuvil.llm
llm = cuvil.llm.load(sys.argv[1], num_threads=int(sys.argv[2]))
prompt = list(range(1000, 1032))
t = time.perf_counter(); llm.prefill(prompt); ttft = time.perf_counter() - t
tok, n = 1, 16
for _ in range(4):                     # first touches of the mapped weights come from the page cache
    tok = int(llm.decode([tok])[0].argmax())
t = time.perf_counter()
for _ in range(n):
    tok = int(llm.decode([tok])[0].argmax())
dec = n / (time.perf_counter() - t)
rss = int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) / 1024
print(json.dumps({"ttft32_ms": 1000 * ttft, "decode_tps": dec, "loaded_rss_mib": rss,
                  "artifact_gib": sum(f.stat().st_size for f in __import__('pathlib').Path(sys.argv[1]).iterdir()) / 2**30}))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    ckpt = make_checkpoint(OUT / "llama3-8b-shape")
    t = time.perf_counter()
    env = dict(os.environ, CUVIL_CACHE_DIR=str(OUT / "cache-8b"))      # a cold build, every time
    shutil.rmtree(OUT / "cache-8b", ignore_errors=True)
    r = subprocess.run([sys.executable, "-c", BUILD, str(ckpt), a.precision, str(a.threads)], capture_output=True,
                       text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"build failed after {time.perf_counter() - t:.0f} s:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"built in {res['build_s']:.0f} s, peak RSS {res['build_peak_rss_mib']:.0f} MiB", flush=True)
    r = subprocess.run([sys.executable, "-c", RUN, res["path"], str(a.threads)], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        sys.exit(f"run failed:\n{r.stderr[-3000:]}")
    res.update(json.loads(r.stdout.strip().splitlines()[-1]), precision=a.precision, threads=a.threads)
    print(json.dumps(res, indent=1))
    (OUT / "llm8b.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
