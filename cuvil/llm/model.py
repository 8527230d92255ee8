"""A compiled language model at run time: KV cache, prefill/decode, generate() with streaming.
Needs numpy and the runtime (plus `tokenizers` for text); never torch."""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CuvilError, ShapeError
from ..runtime.module import Module
from . import sampling
from .tokenizer import FILES as TOKENIZER_FILES
from .tokenizer import StreamDecoder, Tokenizer


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str = ""
    tokens: list = field(default_factory=list)

    @property
    def decode_tokens_per_second(self):
        return (self.new_tokens - 1) / self.decode_seconds if self.decode_seconds and self.new_tokens > 1 else 0.0


class LLM:
    """`step(ids[B, T], start[B])` runs the compiled graph, reading and extending the KV cache."""

    def __init__(self, path, num_threads=None):
        self.path = Path(path)
        meta_file = self.path / "llm.json"
        if not meta_file.exists():
            raise CuvilError(f"{path} is not a cuvil LLM artifact (no llm.json)")
        self.meta = json.loads(meta_file.read_text())
        self.module = Module(self.path, num_threads=num_threads)
        m = self.meta
        shape = (m["layers"], m["max_batch"], m["kv_heads"], m["max_seq_len"], m["head_dim"])
        self.k_cache = np.zeros(shape, np.float32)
        self.v_cache = np.zeros(shape, np.float32)
        self.lengths = np.zeros(m["max_batch"], np.int64)     # tokens in the cache per sequence slot
        self.tokenizer = Tokenizer(self.path) if (self.path / "tokenizer.json").exists() else None
        self.last_stats = GenerationStats()

    @property
    def max_seq_len(self):
        return self.meta["max_seq_len"]

    def reset(self, slots=None):
        if slots is None:
            self.lengths[:] = 0
        else:
            self.lengths[np.asarray(slots)] = 0

    def step(self, ids, start=None) -> np.ndarray:
        """ids [B, T] appended at `start` (default: each slot's current length); returns logits [B, T, V]."""
        ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
        if ids.ndim == 1:
            ids = ids[None]
        B, T = ids.shape
        if start is None:
            start = self.lengths[:B].copy()
        start = np.ascontiguousarray(np.asarray(start, dtype=np.int64))
        if int(start.max(initial=0)) + T > self.max_seq_len:
            raise ShapeError(f"sequence would reach {int(start.max()) + T} tokens; this artifact holds "
                             f"{self.max_seq_len} (compile with a larger max_seq_len)")
        (logits,) = self.module.run(ids, start, self.k_cache, self.v_cache)
        self.lengths[:B] = start + T
        return logits

    def prefill(self, ids) -> np.ndarray:
        """A fresh prompt in slot 0: logits of every position [T, V]."""
        self.reset()
        return self.step(np.asarray(ids, np.int64)[None], np.zeros(1, np.int64))[0]

    def decode(self, tokens) -> np.ndarray:
        """One token for each of the first len(tokens) slots: logits [B, V]."""
        t = np.asarray(tokens, np.int64).reshape(-1, 1)
        return self.step(t)[:, 0]

    # ---- text -------------------------------------------------------------------------------
    def _encode(self, prompt, chat):
        if isinstance(prompt, str) or (chat and isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)):
            if self.tokenizer is None:
                raise CuvilError("this artifact has no tokenizer.json: pass a list of token ids")
            if chat:
                msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
                text = self.tokenizer.apply_chat_template(msgs)
                return self.tokenizer.encode(text, add_special_tokens=False)
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def _stop_ids(self, stop):
        ids = set(self.meta.get("eos_token_ids", []))
        strings = []
        for s in stop or []:
            if isinstance(s, int):
                ids.add(s)
            else:
                strings.append(s)
        return ids, strings

    def generate(self, prompt, max_new_tokens=64, *, temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                 stop=None, seed=None, stream=False, chat=False):
        """Text (or ids) in; the generated text (or ids when no tokenizer) out, or an iterator of text
        pieces with stream=True. Greedy when temperature is 0."""
        it = self._generate(prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed, chat)
        if stream:
            return it
        pieces = list(it)
        if self.tokenizer is None:
            return self.last_stats.tokens
        return "".join(pieces)

    def _generate(self, prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed, chat):
        ids = self._encode(prompt, chat)
        if not ids:
            raise CuvilError("empty prompt")
        stop_ids, stop_strings = self._stop_ids(stop)
        rng = np.random.default_rng(seed)
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        decoder = StreamDecoder(self.tokenizer) if self.tokenizer else None
        budget = min(max_new_tokens, self.max_seq_len - len(ids))
        t0 = time.perf_counter()
        logits = self.prefill(ids)[-1]
        stats.prefill_seconds = time.perf_counter() - t0
        seen = list(ids)
        text, sent = "", 0
        t1 = time.perf_counter()
        for i in range(budget):
            tok = sampling.choose(logits, temperature=temperature, top_k=top_k, top_p=top_p, rng=rng, seen=seen,
                                  repetition_penalty=repetition_penalty)
            if tok in stop_ids:
                stats.finish_reason = "stop"
                if decoder is not None and len(text) > sent:
                    yield text[sent:]              # what was held back for a stop string that never came
                break
            stats.tokens.append(tok)
            seen.append(tok)
            stats.new_tokens += 1
            if decoder is not None:
                text += decoder.push(tok)
                hit = min((text.index(s) for s in stop_strings if s in text), default=None)
                if hit is not None:
                    if hit > sent:
                        yield text[sent:hit]
                    stats.finish_reason = "stop"
                    break
                safe = len(text) - _held_back(text, stop_strings)   # could still become a stop string
                if safe > sent:
                    yield text[sent:safe]
                    sent = safe
            else:
                yield tok
            if i + 1 < budget:
                logits = self.decode([tok])[0]
        else:
            stats.finish_reason = "length"
            if decoder is not None:
                text += decoder.flush()
                if len(text) > sent:
                    yield text[sent:]
        stats.decode_seconds = time.perf_counter() - t1

    def save(self, path):
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for f in list((self.path).iterdir()):
            if f.is_file():
                shutil.copyfile(f, path / f.name)
        return path


def _held_back(text, stops):
    """Length of the longest end of `text` that begins some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def copy_tokenizer(src, dst):
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.exists():
            shutil.copyfile(f, Path(dst) / name)
