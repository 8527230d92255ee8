"""from_transformers(): a transformers decoder-only model (spec.ARCHITECTURES) or checkpoint directory ->
a compiled LLM artifact, with the measured error of lossy precisions against fp32."""
from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..build import cache, toolchain
from ..driver import Progress, build_graph
from ..errors import CuvilError
from ..options import make_options
from ..target import native_cpu, resolve_target
from ..ir import quant as quantize
from . import sampling, weights
from .lower import build_step_graph
from .model import LLM, copy_tokenizer
from .spec import LlamaSpec, rope_parameters

GROUPS = (32, 64, 128)
KV_CACHES = {"fp32": "float32", "fp16": "float16"}     # kv_cache= -> the cache arrays' dtype


def _check(precision, group, max_seq_len, max_batch, kv_cache="fp32"):
    if kv_cache not in KV_CACHES:
        raise ValueError(f"option kv_cache={kv_cache!r} is not one of {', '.join(KV_CACHES)}")
    if precision not in quantize.PRECISIONS:
        raise ValueError(f"option precision={precision!r} is not one of {', '.join(quantize.PRECISIONS)}")
    if group not in GROUPS:
        raise ValueError(f"option group={group!r} is not one of {GROUPS}")
    for name, v in (("max_seq_len", max_seq_len), ("max_batch", max_batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"option {name}={v!r} must be a positive int")


def _check_step_tokens(max_step_tokens, max_seq_len, max_batch):
    least = max(max_seq_len, max_batch)
    if max_step_tokens is not None and (not isinstance(max_step_tokens, int) or isinstance(max_step_tokens, bool)
                                        or max_step_tokens < least):
        raise ValueError(f"option max_step_tokens={max_step_tokens!r} must be an int >= {least} (max_seq_len and "
                         "max_batch: a whole prompt, and a decode step of every sequence)")


def _eos_ids(cfg, src_dir):
    ids = set()
    for v in (getattr(cfg, "eos_token_id", None),):
        ids.update(v if isinstance(v, (list, tuple)) else [v] if v is not None else [])
    if src_dir and (Path(src_dir) / "generation_config.json").exists():
        v = json.loads((Path(src_dir) / "generation_config.json").read_text()).get("eos_token_id")
        ids.update(v if isinstance(v, list) else [v] if v is not None else [])
    return sorted(int(i) for i in ids)


def from_transformers(src, *, precision="fp32", max_seq_len=2048, max_batch=1, num_threads=None, group=64,
                      cache_dir=None, verbose=False, measure_error=True, error_prompts=None, profile=False,
                      target="native", kv_cache="fp32", max_step_tokens=None):
    """Compile a decoder-only language model of spec.ARCHITECTURES (a transformers model object or a
    checkpoint directory of config.json + safetensors) into prefill/decode code sharing weights and
    a KV cache. target: as cuvil.compile's (an aarch64 artifact built here runs under qemu-user).
    profile=True times every node (`llm.module.profile_counters()`), as cuvil.compile's does.
    kv_cache="fp16" keeps the KV cache in IEEE halves (half the memory, so twice the sequences or the
    context; keys and values rounded once as they are stored, attention computed in fp32): its error
    against fp32 is measured as a lossy precision's is. max_step_tokens: the most tokens one step runs
    (rows x tokens each; default max_seq_len): the step's buffers are sized by it, and continuous batching
    (cuvil.serve) puts prompt tokens beside the decode rows of a step up to it."""
    _check(precision, group, max_seq_len, max_batch, kv_cache)
    t0 = time.perf_counter()
    src_dir = None
    if isinstance(src, (str, Path)):
        from transformers import AutoConfig
        src_dir = Path(src)
        if not (src_dir / "config.json").exists():
            raise CuvilError(f"{src} is not a checkpoint directory (no config.json)")
        cfg = AutoConfig.from_pretrained(str(src_dir))
        tensors = weights.from_directory(src_dir)
    else:
        cfg = src.config
        tensors = weights.from_model(src)
        p = Path(getattr(src, "name_or_path", "") or "")
        src_dir = p if (p / "tokenizer.json").exists() else None
    spec = LlamaSpec.from_config(cfg, None if isinstance(src, (str, Path)) else type(src).__name__)
    max_seq_len = min(max_seq_len, spec.max_positions)
    _check_step_tokens(max_step_tokens, max_seq_len, max_batch)
    if max_step_tokens is None:
        max_step_tokens = max(max_seq_len, max_batch)
    rope = rope_parameters(cfg, spec.layer_types)

    opts = make_options(num_threads=num_threads, cache_dir=cache_dir, verbose=verbose, profile=profile, target=target)
    settings = (precision, group, max_seq_len, max_batch, profile, kv_cache, max_step_tokens, resolve_target(opts.target))
    cdir = cache.usable_dir(cache_dir)
    skey = _source_key(src, src_dir, settings)
    path = cache.lookup_source(cdir, skey)
    if path is not None and (path / "llm.json").exists():       # same checkpoint and settings: no rebuild
        if verbose:
            print(f"[cuvil] cache hit {path} (checkpoint unchanged)", file=sys.stderr)
        return _finish(LLM(path, num_threads=num_threads), src, src_dir, spec, measure_error, error_prompts, verbose)

    def layer_progress(i, n):
        if verbose:
            print(f"\r[cuvil] converting layer {i}/{n} ({precision})", end="\n" if i == n else "", file=sys.stderr,
                  flush=True)
    graph = build_step_graph(spec, tensors, rope, precision=precision, group=group, max_batch=max_batch,
                             max_seq_len=max_seq_len, progress=layer_progress, kv_dtype=KV_CACHES[kv_cache],
                             max_step_tokens=max_step_tokens)
    path = build_graph(graph, opts, cdir, Progress(verbose), load=False)
    del graph, tensors               # the graph's constants: free them before the artifact is loaded
    gc.collect()                     # (the graph's nodes and values refer to each other)
    _return_freed_memory()
    meta = {"arch": spec.arch, "layers": spec.layers, "heads": spec.heads, "kv_heads": spec.kv_heads,
            "head_dim": spec.head_dim, "hidden": spec.hidden, "vocab": spec.vocab, "max_batch": max_batch,
            "max_seq_len": max_seq_len, "max_step_tokens": max_step_tokens, "precision": precision, "group": group if precision == "int4" else None,
            "kv_cache": kv_cache,
            "eos_token_ids": _eos_ids(cfg, src_dir), "compile_seconds": time.perf_counter() - t0}
    (path / "llm.json").write_text(json.dumps(meta, indent=1))
    if src_dir:
        copy_tokenizer(src_dir, path)
    cache.remember_source(cdir, skey, path.name)
    return _finish(LLM(path, num_threads=num_threads), src, src_dir, spec, measure_error, error_prompts, verbose)


def _return_freed_memory():
    """glibc keeps freed heap pages (its mmap threshold grows after large frees, so gigabytes of
    converted weights end up on the heap): hand them back before the artifact is mapped."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):       # not glibc
        pass


def _finish(llm, src, src_dir, spec, measure_error, error_prompts, verbose):
    """Measure a lossy precision's error against fp32 (once per artifact, unless new prompts are given)."""
    meta = llm.meta
    lossless = meta["precision"] == "fp32" and meta.get("kv_cache", "fp32") == "fp32"
    if lossless or not measure_error or ("error" in meta and not error_prompts):
        return llm
    ref = src if not isinstance(src, (str, Path)) else _load_reference(src_dir)
    meta["error"] = measure(llm, ref, error_prompts or _default_prompts(spec.vocab))
    (llm.path / "llm.json").write_text(json.dumps(meta, indent=1))
    if verbose:
        e = meta["error"]
        print(f"[cuvil] {meta['precision']} (KV cache {meta.get('kv_cache', 'fp32')}) vs fp32: top-1 agreement {e['top1_agreement']:.3f}, "
              f"mean KL {e['kl_mean']:.4g}", file=sys.stderr)
    return llm


def _source_key(src, src_dir, settings) -> str:
    """What decides the artifact, read cheaply: a checkpoint directory's files by name, size and
    modification time (re-reading gigabytes of weights to hash them would cost what it saves), a
    model object's weights by content; plus the settings, the compiler and cuvil's own sources."""
    h = hashlib.sha256(repr(settings).encode())
    for f in sorted(Path(src_dir).iterdir()) if src_dir else ():     # weights, config, tokenizer
        if f.suffix in (".json", ".safetensors"):
            st = f.stat()
            h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    if not isinstance(src, (str, Path)):
        import torch
        h.update(repr(src.config.to_dict()).encode())
        for name, t in src.state_dict().items():
            h.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    h.update(toolchain.compiler_version(settings[-1]).encode())
    h.update(native_cpu("native").encode())       # built for -march=native
    h.update(toolchain.cuvil_source_digest().encode())
    return "llm-" + h.hexdigest()[:32]


def _default_prompts(vocab):
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, 24).tolist(), rng.integers(0, vocab, 40).tolist()]


def _load_reference(src_dir):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(src_dir), torch_dtype=torch.float32).eval()


def measure(llm: LLM, reference, prompts):
    """Top-1 agreement and KL(fp32 || compiled) of the next-token distribution at every prompt position."""
    import torch
    agree, kls = [], []
    for ids in prompts:
        ids = ids[: llm.max_seq_len]
        got = llm.prefill(ids)
        with torch.no_grad():
            ref = reference(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
        lp, lq = sampling.log_softmax(ref), sampling.log_softmax(got)
        kls.extend((np.exp(lp) * (lp - lq)).sum(-1).tolist())
        agree.extend((ref.argmax(-1) == got.argmax(-1)).tolist())
    return {"top1_agreement": float(np.mean(agree)), "kl_mean": float(np.mean(kls)), "kl_max": float(np.max(kls)),
            "positions": len(agree)}
