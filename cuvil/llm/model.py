"""A compiled language model at run time: KV cache, prefill/decode, generate() with streaming.
Needs numpy and the runtime (plus `tokenizers` for text); never torch."""
from __future__ import annotations

import json
import numbers
import shutil
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, CuvilError, ShapeError
from ..runtime import artifact
from ..runtime.loader import load
from . import sampling
from .tokenizer import FILES as TOKENIZER_FILES
from .textstream import TextStream
from .tokenizer import Tokenizer


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


# llm.json entries the runtime sizes things by
SIZES = ("layers", "max_batch", "kv_heads", "max_seq_len", "head_dim", "vocab")
# seconds a call waits for the LLM before warning (then it waits on): an unclosed stream may hold it
WAIT_WARNING_S = 60.0


class CacheLock:
    """Who may use the KV cache now: one thread (re-entrantly, so `with llm.lock:` can hold it around
    several step() calls), or one generate(stream=True) iterator from its first next() until it is
    exhausted, closed or garbage-collected. A plain Lock underneath: the collector may finalize an
    abandoned stream in any thread, and that thread must be able to release it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread = None         # the holder's thread (a stream's: the thread that started it)
        self._depth = 0
        self._stream = False

    def acquire(self, stream=False):
        me = threading.get_ident()
        if self._thread == me:
            if stream or self._stream:      # waiting would be waiting on ourselves, forever
                raise CuvilError("this thread already holds this LLM through an unfinished generate(stream=True) "
                                 "iterator (or `with llm.lock:`): exhaust or close() it first, as two sequences "
                                 "cannot share the one KV cache")
            self._depth += 1
            return
        if not self._lock.acquire(timeout=WAIT_WARNING_S):
            warnings.warn(f"waited {WAIT_WARNING_S:g} s for this LLM, which another thread is using; if that is an "
                          "abandoned generate(stream=True) iterator, close() it; still waiting", RuntimeWarning,
                          stacklevel=3)
            self._lock.acquire()
        self._thread, self._depth, self._stream = me, 1, stream

    def release(self):
        self._depth -= 1
        if self._depth == 0:
            self._thread = None
            self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class LLM:
    """`step(ids[B, T], start[B])` runs the compiled graph, reading and extending the KV cache.

    Threads may share one LLM: each generate() (and each step/prefill/decode/reset call) holds
    `llm.lock` for its whole length, so concurrent requests run one after another and never mix
    sequences. A stream=True iterator holds it from its first next() until it ends, is close()d or
    is garbage-collected; close() one you abandon early, or other threads wait for it (warning
    after WAIT_WARNING_S s) and this thread's next use of the LLM raises CuvilError. To run several
    step()/decode() calls as one sequence, hold the lock around them: `with llm.lock: ...`.
    `last_stats` is per thread: the stats of this thread's latest generate()."""

    def __init__(self, path, num_threads=None):
        self.path = Path(path)
        meta_file = self.path / "llm.json"
        if not meta_file.exists():
            raise ArtifactError(f"{path} is not a cuvil LLM artifact (no llm.json)")
        self.meta = m = _read_meta(meta_file)
        self.module = load(self.path, num_threads=num_threads)    # emulated where built for another machine
        shape = (m["layers"], m["max_batch"], m["kv_heads"], m["max_seq_len"], m["head_dim"])
        # an edited size: named here, not an absurd allocation or a shape error at the first step
        ins = {i["name"]: i["shape"] for i in self.module.inputs}
        vocab = self.module.outputs[0]["shape"][-1] if self.module.outputs else m["vocab"]
        if ins.get("k_cache", list(shape)) != list(shape) or vocab != m["vocab"]:
            raise ArtifactError(f"{meta_file} does not match model.so: KV cache {list(shape)} and vocab {m['vocab']} "
                                f"there, {ins.get('k_cache')} and {vocab} in the compiled code")
        kv = {"fp32": np.float32, "fp16": np.float16}.get(m.get("kv_cache", "fp32"))
        cache_dtype = {i["name"]: i["dtype"] for i in self.module.inputs}.get("k_cache", "float32")
        if kv is None or np.dtype(kv).name != cache_dtype:
            raise ArtifactError(f"{meta_file}: kv_cache {m.get('kv_cache')!r} does not match the compiled cache "
                                f"({cache_dtype})")
        self.k_cache = np.zeros(shape, kv)
        self.v_cache = np.zeros(shape, kv)
        self.lengths = np.zeros(m["max_batch"], np.int64)     # tokens in the cache per sequence slot
        self._first_slots = np.arange(m["max_batch"], dtype=np.int64)
        self._takes_slots = "slots" in ins
        self._takes_logit_rows = "logit_rows" in ins     # before: logits of every token
        # a step's rows and rows x tokens: before max_step_tokens, rows were the slots and buffers were
        # sized for max_batch x max_seq_len tokens
        symbols = self.module.manifest.get("symbols") or {}
        self.max_rows = int(symbols.get("batch", [1, m["max_batch"]])[1])
        self.max_step_tokens = next((int(n) for a, b, n in self.module.manifest.get("symbol_products") or ()
                                     if {a, b} == {"batch", "seq"}), self.max_rows * m["max_seq_len"])
        self.tokenizer = Tokenizer(self.path) if (self.path / "tokenizer.json").exists() else None
        self.lock = CacheLock()
        self._local = threading.local()

    @property
    def max_seq_len(self):
        return self.meta["max_seq_len"]

    @property
    def last_stats(self) -> GenerationStats:
        """The stats of this thread's latest generate() call (another thread's cannot clobber them)."""
        if not hasattr(self._local, "stats"):
            self._local.stats = GenerationStats()
        return self._local.stats

    @last_stats.setter
    def last_stats(self, stats):
        self._local.stats = stats

    def reset(self, slots=None):
        with self.lock:
            if slots is None:
                self.lengths[:] = 0
            else:
                self.lengths[np.asarray(slots)] = 0

    def step(self, ids, start=None, slots=None) -> np.ndarray:
        """ids [B, T] appended at `start` (default: each slot's current length) in the KV cache slots
        `slots` (default: 0 .. B-1); returns logits [B, T, V]. Rows may share a slot at positions apart
        (with `start` given): a prompt's tokens as T = 1 rows beside other sequences' decode rows, each
        row attending to its slot's keys up to its own position, the step's earlier rows' included."""
        ids = self._ids(ids, "ids", (1, 2))
        if ids.ndim == 1:
            ids = ids[None]
        self._check_batch(ids, "ids", slots is not None)
        if start is not None:
            s = np.asarray(start)
            if s.dtype.kind not in "iu" or s.shape != ids.shape[:1] or s.min() < 0:
                raise ShapeError(f"start must be {ids.shape[0]} int position(s) >= 0, one per sequence of ids, "
                                 f"got {start!r}")
            start = np.ascontiguousarray(s, np.int64)
        if slots is not None:
            s = np.asarray(slots)
            if s.dtype.kind not in "iu" or s.shape != ids.shape[:1] or s.min() < 0 or s.max() >= self.meta["max_batch"]:
                raise ShapeError(f"slots must be {ids.shape[0]} KV cache slots in [0, {self.meta['max_batch']}), one "
                                 f"per row of ids, got {slots!r}")
            slots = np.ascontiguousarray(s, np.int64)
            _check_rows_apart(slots, start if start is not None else self.lengths[slots], ids.shape[1])
        with self.lock:
            return self._step(ids, start, slots)

    def prefill(self, ids) -> np.ndarray:
        """A fresh prompt in slot 0: logits of every position [T, V]."""
        ids = self._ids(ids, "ids", (1,))
        with self.lock:
            return self._prefill(ids)

    def decode(self, tokens) -> np.ndarray:
        """One token for each of the first len(tokens) slots: logits [B, V]."""
        t = self._ids(tokens, "tokens", (0, 1)).reshape(-1, 1)
        self._check_batch(t, "tokens")
        with self.lock:
            return self._step(t, None)[:, 0]

    # unchecked and unlocked: for callers that checked the arguments and hold the lock
    def _step(self, ids, start, slots=None):
        """logits [B, T, V] of every token."""
        B, T = ids.shape
        return self._step_rows(ids, start, slots, None).reshape(B, T, -1)

    def _step_last(self, ids, start, slots=None):
        """logits [B, V] of each row's last token: what a prompt chunk needs."""
        B, T = ids.shape
        return self._step_rows(ids, start, slots, np.arange(1, B + 1, dtype=np.int64) * T - 1)

    def _step_rows(self, ids, start, slots, rows):
        """logits [R, V] of tokens `rows` (b * T + t; None: all, in order)."""
        if rows is not None:
            r = np.asarray(rows)
            if r.dtype.kind not in "iu" or r.ndim != 1 or not r.size or r.min() < 0 or r.max() >= ids.size:
                raise ShapeError(f"logit rows must be a 1-d list of integer token indices in [0, {ids.size}), got "
                                 f"{r.tolist()}")
            rows = np.ascontiguousarray(r, np.int64)
        if slots is None:
            slots = self._first_slots[:ids.shape[0]]
        if start is None:
            start = self.lengths[slots]
        if int(start.max(initial=0)) + ids.shape[1] > self.max_seq_len:
            raise ShapeError(f"sequence would reach {int(start.max()) + ids.shape[1]} tokens; this artifact holds "
                             f"{self.max_seq_len} (compile with a larger max_seq_len)")
        if self._takes_logit_rows:
            every = np.arange(ids.size, dtype=np.int64) if rows is None else rows
            (logits,) = self.module.run(ids, start, self.k_cache, self.v_cache, slots, every)
        elif self._takes_slots:
            (logits,) = self.module.run(ids, start, self.k_cache, self.v_cache, slots)
        elif not np.array_equal(slots, self._first_slots[:len(slots)]):
            raise CuvilError(f"{self.path} was compiled before cache slots were addressable: recompile it to run "
                             "sequences in slots other than 0 .. B-1")
        else:
            (logits,) = self.module.run(ids, start, self.k_cache, self.v_cache)
        self.lengths[slots] = start + ids.shape[1]
        if not self._takes_logit_rows:         # an older artifact: every token's, then the rows asked for
            logits = logits.reshape(ids.size, -1)
            logits = logits if rows is None else logits[rows]
        return logits

    def _copy_cache(self, source, dest, start, stop):
        """The keys and values at positions [start, stop) of slot `source` into slot `dest` (a shared
        prompt prefix; unchecked and unlocked, as _step)."""
        for cache in (self.k_cache, self.v_cache):
            cache[:, dest, :, start:stop] = cache[:, source, :, start:stop]
        self.lengths[dest] = stop

    def _prefill(self, ids, last=False):
        """A fresh prompt in slot 0: logits of every position [T, V], or (last) of its last token [V]."""
        self.lengths[:] = 0
        step = self._step_last if last else self._step
        return step(ids[None], np.zeros(1, np.int64))[0]

    def _ids(self, ids, name, ranks):
        """`ids` as C-contiguous int64 token ids of one of `ranks`, in batches the artifact holds. An id
        out of [0, vocab) must not reach the native code: -1 reads the embedding's last row, quietly."""
        try:
            a = np.asarray(ids)
        except (ValueError, TypeError):      # ragged nested lists
            a = np.asarray(None)
        if a.size == 0:
            raise ShapeError(f"{name} is empty: give at least one token id")
        if a.dtype.kind not in "iu" or a.ndim not in ranks:
            raise ShapeError(f"{name} must be integer token ids of rank {' or '.join(map(str, ranks))}, "
                             f"got {a.dtype} of shape {list(a.shape)}")
        lo, hi, vocab = int(a.min()), int(a.max()), self.meta["vocab"]
        if lo < 0 or hi >= vocab:
            raise ShapeError(f"{name} must be token ids in [0, {vocab}), got {lo if lo < 0 else hi}")
        return np.ascontiguousarray(a, np.int64)

    def _check_batch(self, ids, name, slotted=False):
        """Rows within the slots (row b in slot b) or, with slots given, within the step's rows; and rows x
        tokens within max_step_tokens."""
        rows, most = ids.shape[0], self.max_rows if slotted else self.meta["max_batch"]
        if rows > most:
            raise ShapeError(f"{name} holds {rows} {'rows' if slotted else 'sequences'}; this artifact holds "
                             + (f"{most} rows a step" if slotted else f"max_batch={most}"))
        if ids.size > self.max_step_tokens:
            raise ShapeError(f"{name} holds {rows} x {ids.shape[1]} = {ids.size} tokens; a step of this artifact "
                             f"takes at most {self.max_step_tokens} (compile with a larger max_step_tokens)")

    # ---- text -------------------------------------------------------------------------------
    def _encode(self, prompt, chat):
        if chat:
            if self.tokenizer is None:
                raise CuvilError("chat=True needs a tokenizer; this artifact has no tokenizer.json")
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            elif not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)):
                raise TypeError(f"with chat=True, prompt must be text or a list of {{'role', 'content'}} messages, "
                                f"got {type(prompt).__name__}")
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(prompt), add_special_tokens=False)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise CuvilError("this artifact has no tokenizer.json: pass a list of token ids")
            return self.tokenizer.encode(prompt)
        return prompt

    def _stop_ids(self, stop):
        ids = set(self.meta.get("eos_token_ids", []))
        strings = []
        if isinstance(stop, (str, numbers.Integral)) and not isinstance(stop, bool):
            stop = [stop]                     # one stop; a string would otherwise be taken char by char
        if stop is not None and not isinstance(stop, (list, tuple, set, frozenset)):
            raise TypeError(f"stop must be a list of stop strings and/or token ids, got {type(stop).__name__}")
        vocab = self.meta["vocab"]
        for s in stop or []:
            if isinstance(s, str) and s:
                if self.tokenizer is None:
                    raise ValueError(f"stop string {s!r} needs a tokenizer, and this artifact has none: "
                                     "give stop token ids")
                strings.append(s)
            elif isinstance(s, numbers.Integral) and not isinstance(s, bool) and 0 <= s < vocab:
                ids.add(int(s))
            else:
                kind = TypeError if isinstance(s, bool) or not isinstance(s, (str, numbers.Integral)) else ValueError
                raise kind(f"stop entries must be non-empty strings or token ids in [0, {vocab}), got {s!r}")
        return ids, strings

    def generate(self, prompt=None, max_new_tokens=64, *, temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                 stop=None, seed=None, stream=False, chat=False, input_ids=None, attention_mask=None):
        """Text (or ids) in; the generated text (or ids when no tokenizer) out, or an iterator of text
        pieces with stream=True. Greedy when temperature is 0. The arguments are checked here, at
        the call, streaming or not. Thread-safe: see the class's notes on `lock`.

        As Hugging Face callers pass it: `input_ids` [B, T] (array, tensor or nested lists) with an
        optional `attention_mask` (1 on tokens, 0 on left or right padding) -> a list of B lists of new
        token ids, the rows run one after another (seed + row for sampled rows); not with stream."""
        if input_ids is not None:
            if prompt is not None or stream or chat:
                raise TypeError("input_ids replaces prompt, and runs without stream or chat")
            return [self._new_ids(ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop,
                                  None if seed is None else seed + i)
                    for i, ids in enumerate(_unpadded_rows(input_ids, attention_mask))]
        if prompt is None:
            raise TypeError("generate() needs a prompt (text or token ids) or input_ids")
        sampling.check_sampling(temperature, top_k, top_p, repetition_penalty, seed)
        sampling.check_arg("max_new_tokens", max_new_tokens, numbers.Integral, "an int >= 0", lambda v: v >= 0)
        stop_ids, stop_strings = self._stop_ids(stop)
        ids = self._ids(self._encode(prompt, chat), "prompt", (1,)).tolist()
        if len(ids) > self.max_seq_len:
            raise ShapeError(f"prompt has {len(ids)} tokens; this artifact holds {self.max_seq_len} "
                             "(compile with a larger max_seq_len)")
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        sampler = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                       rng=np.random.default_rng(seed))
        it = self._generate(ids, max_new_tokens, sampler, stop_ids, stop_strings, stats, stream)
        if stream:
            return it
        pieces = list(it)
        return stats.tokens if self.tokenizer is None else "".join(pieces)

    def _new_ids(self, ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed):
        """generate()'s new token ids for a prompt of ids, whether or not there is a tokenizer."""
        self.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                      repetition_penalty=repetition_penalty, stop=stop, seed=seed)
        return list(self.last_stats.tokens)

    def _generate(self, ids, max_new_tokens, sampler, stop_ids, stop_strings, stats, stream):
        self.lock.acquire(stream=stream)      # held across the yields; the finally runs on close() and collection
        try:
            yield from self._tokens(ids, max_new_tokens, sampler, stop_ids, stop_strings, stats)
        finally:
            self.lock.release()

    def _tokens(self, ids, max_new_tokens, sampler, stop_ids, stop_strings, stats):
        out = TextStream(self.tokenizer, stop_ids, stop_strings, min(max_new_tokens, self.max_seq_len - len(ids)),
                         tokens=stats.tokens)
        t0 = time.perf_counter()
        logits = self._prefill(np.asarray(ids, np.int64), last=True)
        stats.prefill_seconds = time.perf_counter() - t0
        seen = list(ids)
        t1 = time.perf_counter()
        while out.finish_reason is None:
            tok = sampling.pick(logits, seen=seen, **sampler)
            yield from out.push(tok)
            seen.append(tok)
            stats.new_tokens = len(out.tokens)
            if out.finish_reason is None:
                logits = self._step(np.array([[tok]], np.int64), None)[0, 0]
        stats.finish_reason = out.finish_reason
        stats.decode_seconds = time.perf_counter() - t1

    def save(self, path):
        """Write the artifact (with llm.json and the tokenizer files) to `path` in one step, as
        CompiledModel.save does: a process running the artifact at `path` keeps its copy."""
        return artifact.save(self.path, path)


def _check_rows_apart(slots, start, T):
    """Rows of one slot must write positions apart ([start, start + T) disjoint): two writers of one
    position would leave either's keys there."""
    order = np.lexsort((start, slots))
    s, p = slots[order], start[order]
    clash = (s[1:] == s[:-1]) & (p[1:] < p[:-1] + T)
    if clash.any():
        i = int(np.flatnonzero(clash)[0])
        raise ShapeError(f"rows {int(order[i])} and {int(order[i + 1])} both write slot {int(s[i])} at position "
                         f"{int(p[i + 1])}: rows of one slot must be {T} or more positions apart")


def _read_meta(meta_file):
    """llm.json, checked: a hand-edited or truncated file is an ArtifactError naming it, not a KeyError."""
    try:
        meta = json.loads(meta_file.read_text())
    except ValueError as e:                 # JSONDecodeError, UnicodeDecodeError
        raise ArtifactError(f"{meta_file} is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{meta_file} must hold a JSON object, got {type(meta).__name__}")
    for k in SIZES:
        v = meta.get(k)
        if type(v) is not int or v < 1:
            raise ArtifactError(f"{meta_file}: {k!r} must be a positive int, got "
                                + (repr(v) if k in meta else "nothing (missing)"))
    eos = meta.get("eos_token_ids", [])
    if not (isinstance(eos, list) and all(type(i) is int and 0 <= i < meta["vocab"] for i in eos)):
        raise ArtifactError(f"{meta_file}: 'eos_token_ids' must be a list of token ids in [0, {meta['vocab']}), "
                            f"got {eos!r}")
    return meta


def _unpadded_rows(input_ids, attention_mask):
    """The token ids of each row of a [B, T] batch, without the padding its attention mask marks."""
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.size == 0:
        raise ShapeError(f"input_ids must be integer token ids [B, T], got {ids.dtype} of shape {list(ids.shape)}")
    if attention_mask is None:
        return [row.tolist() for row in ids]
    mask = np.asarray(attention_mask)
    if mask.shape != ids.shape and not (mask.ndim == 1 and mask.shape == ids.shape[1:] and len(ids) == 1) or \
            not np.isin(mask, (0, 1)).all():
        raise ShapeError(f"attention_mask must be 0/1 of the shape of input_ids {list(ids.shape)}")
    rows = []
    for b, (row, m) in enumerate(zip(ids, mask.reshape(ids.shape).astype(bool))):
        on = np.flatnonzero(m)
        if on.size == 0 or on[-1] - on[0] + 1 != on.size:
            raise ShapeError(f"attention_mask row {b} must be one run of 1s (left or right padding around it)")
        rows.append(row[on].tolist())
    return rows


def copy_tokenizer(src, dst):
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.exists():
            shutil.copyfile(f, Path(dst) / name)
