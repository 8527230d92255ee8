"""Continuous batching for a compiled LLM: up to max_batch sequences live in the KV cache's slots;
new requests are admitted between steps and finished ones retired, so a long generation never holds
back a short one. Needs numpy and the runtime only.

Policy: the scheduler thread alternates one prefill chunk (for the oldest admitted sequence still
reading its prompt) with one decode step for every sequence that is generating, each at its own
position in its own slot. A long prompt thus delays running streams by one chunk's time per token
they produce, not by its whole prefill. A chunk is `prefill_chunk` tokens (64). With pace_prefill
(`cuvil serve --pace-prefill`), while streams decode a chunk is sized from the measured times to take
about one decode step (at least MIN_PACED_CHUNK tokens), so their inter-token time stays near twice
the step's while prompts are read, at the cost of the prompts' own wait. TinyLlama int4 shape, 8
clients, 2 threads (`python -m benchmarks.serve_llm`): inter-token p99 47 ms against 247 with whole
chunks, but TTFT p50 4.4 s against 0.6 and 104 tokens/s against 137: smooth streams for interactive
use; whole chunks (the default) for throughput and first tokens. With mix_rows=N (`cuvil serve
--mix-rows N`), while streams decode, prompt tokens ride in each decode step as rows of their own (one
per token, at its position in its sequence's slot), filling the step up to N rows (at least one prompt
token): streams wait one step of at most N rows, never a step and a chunk. TinyLlama int4 shape, 8
clients, 2 threads, Zen 5 (benchmarks/README.md): N = 8 (a step's cost rises steeply past 8 rows, where
the int4 GEMM leaves its decode tiles) gave an inter-token p99 of 25-26 ms against 134-140 with whole
chunks (1.9-2.7x the 1-client median, by the host's phase), at the cost of first tokens (p50 2.4 s
against 0.2) and aggregate tokens/s (0.8x). With nothing decoding, prompts are read in whole chunks.

Prefix reuse (prefix_reuse=True, the default): a slot keeps the keys and values of the last sequence
that held it after that sequence ends, and remembers its tokens. A new request takes the free slot
whose remembered tokens share the longest prefix with its prompt (ties: the slot freed longest ago)
and prefills from there on, so a system prompt or a conversation's history shared by requests is
read once per slot, not once per request. And before each prefill chunk, a sequence whose next
prompt tokens another slot already holds (a request admitted with it and read first, a running
sequence, a kept one) copies their keys and values from there instead of reading them: 8 requests
that arrive together with one system prompt read it once, not 8 times. The keys and values at a
position depend only on the tokens up to it, so the reused ones are the ones a fresh prefill would
write (up to the rounding of a different chunking)."""
from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import CuvilError, ShapeError
from ..llm import sampling
from ..llm.textstream import TextStream

DONE = object()        # the last event of a request's stream


@dataclass
class Sequence:
    """A request in the batcher: its prompt, sampling settings and output. Events (text pieces, or
    token ids without a tokenizer; then DONE) arrive through `events`, or `on_event` when given."""
    prompt: list
    out: TextStream
    sampler: dict
    on_event: object = None
    events: queue.Queue = field(default_factory=queue.Queue)
    slot: int = -1
    cursor: int = 0                       # prompt tokens already in the cache
    last: int = -1                        # the token to feed at the next decode step
    seen: list = field(default_factory=list)
    cancelled: bool = False
    error: Exception | None = None
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None

    @property
    def position(self):
        return len(self.prompt) + len(self.out.tokens) - 1

    def emit(self, item):
        if self.on_event is not None:
            self.on_event(item)
        else:
            self.events.put(item)

    def cancel(self):
        """Stop generating (a client that went away): the slot is freed at the next step."""
        self.cancelled = True

    def __iter__(self):
        """The events, blocking, until the sequence ends (raising its error, if it failed)."""
        while (item := self.events.get()) is not DONE:
            yield item
        if self.error is not None:
            raise self.error


def common_prefix(a: list, b: list) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


MIN_PACED_CHUNK = 4       # a paced chunk's fewest tokens: smaller ones cost a weight pass each for little
PACE_EMA = 0.3            # weight of the newest time in the running estimates of a step and a token


def _ema(old, new):
    return new if old is None else old + PACE_EMA * (new - old)


class ContinuousBatcher:
    def __init__(self, llm, *, prefill_chunk: int = 64, prefix_reuse: bool = True, pace_prefill: bool = False,
                 mix_rows: int = 0):
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"option prefill_chunk={prefill_chunk!r} must be a positive int")
        if isinstance(mix_rows, bool) or not isinstance(mix_rows, int) or mix_rows < 0:
            raise ValueError(f"option mix_rows={mix_rows!r} must be an int >= 0")
        for name, v in (("prefix_reuse", prefix_reuse), ("pace_prefill", pace_prefill)):
            if not isinstance(v, bool):
                raise ValueError(f"option {name}={v!r} must be True or False")
        if not llm._takes_slots and llm.meta["max_batch"] > 1:
            raise CuvilError(f"{llm.path} was compiled before cache slots were addressable: recompile it")
        self.llm, self.chunk = llm, prefill_chunk
        self.max_batch = llm.meta["max_batch"]
        # the rows a mixed step fills to, within the rows the artifact's step takes (at least its slots:
        # a reading sequence holds a slot, so its one prompt row always fits beside the decode rows)
        self.mix = min(mix_rows, llm.max_rows, llm.max_step_tokens)
        self._waiting = collections.deque()
        self._slots: dict[int, Sequence] = {}
        self._cv = threading.Condition()
        self._stop = False
        self.prefix_reuse, self.pace_prefill = prefix_reuse, pace_prefill
        self._step_s = self._token_s = None         # running estimates: a decode step, a prefilled token
        # per slot: the tokens whose keys and values it holds from its last sequence, and when it was freed
        self._kept: dict[int, list] = {}
        self._freed: dict[int, int] = {}
        self._clock = itertools.count()
        self.steps = collections.Counter()         # "prefill" / "decode" runs; decode rows per step
        self.prompt_tokens = collections.Counter()  # "read" (prefilled) / "reused" (kept or copied from a slot)
        self._thread = threading.Thread(target=self._run, name="cuvil-continuous-batcher", daemon=True)
        self._thread.start()

    # ---- requests ----------------------------------------------------------------------------
    def submit(self, prompt_ids, max_new_tokens=64, *, temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
               seed=None, stop=None, on_event=None) -> Sequence:
        """Queue a prompt (token ids); the returned Sequence yields its output as it is generated. The
        arguments are checked here, as LLM.generate checks them; a prompt with no room left for one new
        token in the cache is refused up front."""
        llm = self.llm
        sampling.check_sampling(temperature, top_k, top_p, repetition_penalty, seed)
        sampling.check_arg("max_new_tokens", max_new_tokens, int, "an int >= 0", lambda v: v >= 0)
        ids = llm._ids(prompt_ids, "prompt", (1,)).tolist()
        if len(ids) >= llm.max_seq_len:
            raise ShapeError(f"prompt has {len(ids)} tokens; this artifact holds {llm.max_seq_len} in all "
                             "(prompt and new tokens)")
        stop_ids, stop_strings = llm._stop_ids(stop)
        budget = min(max_new_tokens, llm.max_seq_len - len(ids))
        seq = Sequence(ids, TextStream(llm.tokenizer, stop_ids, stop_strings, budget),
                       dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                            rng=np.random.default_rng(seed)), on_event=on_event, seen=list(ids))
        with self._cv:
            if self._stop:
                raise CuvilError("this batcher is closed")
            self._waiting.append(seq)
            self._cv.notify()
        return seq

    def active(self) -> int:
        with self._cv:
            return len(self._slots)

    def waiting(self) -> int:
        with self._cv:
            return len(self._waiting)

    def close(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join()

    # ---- the scheduler thread ------------------------------------------------------------------
    def _run(self):
        with self.llm.lock:            # the batcher owns the KV cache while it runs
            while True:
                with self._cv:
                    self._retire_cancelled()
                    while self._waiting and len(self._slots) < self.max_batch:
                        self._admit(self._waiting.popleft())
                    if self._stop:
                        for seq in list(self._slots.values()) + list(self._waiting):
                            self._finish(seq, CuvilError("the batcher was closed"))
                        return
                    if not self._slots:
                        self._cv.wait()
                        continue
                    reading = [s for s in self._slots.values() if s.cursor < len(s.prompt)]
                    writing = [s for s in self._slots.values() if s.cursor >= len(s.prompt)]
                # a failing step ends the sequences in it, not the batcher
                if reading and writing and self.mix:
                    readers = self._mix_readers(reading, len(writing))
                    self._guarded(readers + writing, self._mixed, (writing, readers))
                    continue
                if reading:
                    oldest = min(reading, key=lambda s: s.submitted)
                    self._guarded([oldest], self._prefill_chunk, (oldest, self._chunk_tokens(bool(writing))))
                if writing:
                    self._guarded(writing, self._decode, writing)

    def _admit(self, seq):
        """seq into a free slot: the one keeping the longest prefix of its prompt (prefix_reuse), whose
        kept tokens it then skips; at least the prompt's last token is read again, for its logits."""
        free = sorted(set(range(self.max_batch)) - set(self._slots), key=lambda s: self._freed.get(s, -1))
        reuse = {s: common_prefix(self._kept.get(s, []), seq.prompt) if self.prefix_reuse else 0 for s in free}
        seq.slot = max(free, key=lambda s: reuse[s])          # max keeps the first of ties: freed longest ago
        seq.cursor = min(reuse[seq.slot], len(seq.prompt) - 1)
        self.prompt_tokens["reused"] += seq.cursor
        self._kept.pop(seq.slot, None)
        self._slots[seq.slot] = seq

    def _written(self, slot) -> list:
        """The tokens whose keys and values `slot` holds now, from position 0."""
        seq = self._slots.get(slot)
        if seq is None:
            return self._kept.get(slot, [])
        return seq.seen[:seq.cursor if seq.cursor < len(seq.prompt) else len(seq.seen) - 1]

    def _borrow(self, seq):
        """The longest run of seq's next prompt tokens that another slot holds, copied from there into
        seq's slot (the scheduler thread only: it alone changes the slots)."""
        best, source = seq.cursor, None
        for slot in range(self.max_batch):
            if slot != seq.slot:
                n = min(common_prefix(self._written(slot), seq.prompt), len(seq.prompt) - 1)
                if n > best:
                    best, source = n, slot
        if source is not None:
            self.llm._copy_cache(source, seq.slot, seq.cursor, best)
            self.prompt_tokens["reused"] += best - seq.cursor
            seq.cursor = best

    def _release(self, seq, valid: bool = True):
        """seq's slot is free again; it keeps the tokens whose keys and values seq wrote (valid: the
        step that ended seq did not fail midway)."""
        kept = self._written(seq.slot) if valid else []        # the last token fed back never ran
        del self._slots[seq.slot]
        self._kept[seq.slot] = kept
        self._freed[seq.slot] = next(self._clock)

    def _guarded(self, seqs, step, arg):
        try:
            step(arg)
        except Exception as e:  # noqa: BLE001 - any failure of a step reaches its requests as their error
            for seq in seqs:
                if seq.out.finish_reason is None:
                    self._finish(seq, e)

    def _chunk_tokens(self, decoding: bool) -> int:
        """The next prefill chunk's tokens: prefill_chunk, or while streams decode (pace_prefill) about
        what takes one decode step by the running estimates."""
        if not (decoding and self.pace_prefill) or self._step_s is None or self._token_s is None:
            return self.chunk
        return max(MIN_PACED_CHUNK, min(self.chunk, int(self._step_s / self._token_s)))

    def _prefill_chunk(self, job):
        seq, tokens = job
        if self.prefix_reuse:
            self._borrow(seq)
        a, b = seq.cursor, min(seq.cursor + tokens, len(seq.prompt))
        t0 = time.perf_counter()
        logits = self.llm._step_last(np.asarray([seq.prompt[a:b]], np.int64), np.array([a], np.int64),
                                     np.array([seq.slot], np.int64))
        self.prompt_tokens["read"] += b - a
        self._token_s = _ema(self._token_s, (time.perf_counter() - t0) / (b - a))
        self.steps["prefill"] += 1
        self._read_to(seq, b, logits[0])

    def _decode(self, seqs):
        ids = np.array([[s.last] for s in seqs], np.int64)
        start = np.array([s.position for s in seqs], np.int64)
        t0 = time.perf_counter()
        logits = self.llm._step(ids, start, np.array([s.slot for s in seqs], np.int64))
        self._step_s = _ema(self._step_s, time.perf_counter() - t0)
        self.steps[f"decode x{len(seqs)}"] += 1
        for s, row in zip(seqs, logits[:, 0]):
            self._accept(s, row)

    def _mix_room(self, decoding):
        """Prompt rows of a mixed step beside `decoding` decode rows: up to mix rows in all, at least one."""
        return max(1, self.mix - decoding)

    def _mix_readers(self, reading, decoding):
        """The sequences whose prompt tokens the next mixed step reads: the oldest, as many as its rows take."""
        readers, left = [], self._mix_room(decoding)
        for seq in sorted(reading, key=lambda s: s.submitted):
            if left <= 0:
                break
            readers.append(seq)
            left -= len(seq.prompt) - seq.cursor
        return readers

    def _mixed(self, job):
        """One step: every decoding sequence's row, then the readers' prompt tokens up to mix rows in all
        (at least one), a row each at its position in its slot."""
        writing, readers = job
        ids, start, slots, ends = [[s.last] for s in writing], [s.position for s in writing], \
            [s.slot for s in writing], []
        room = self._mix_room(len(writing))
        for seq in readers:
            if room == 0:
                break
            if self.prefix_reuse:
                self._borrow(seq)
            a, b = seq.cursor, min(seq.cursor + room, len(seq.prompt))
            ids += [[t] for t in seq.prompt[a:b]]
            start += range(a, b)
            slots += [seq.slot] * (b - a)
            ends.append((seq, b, len(ids) - 1))
            room -= b - a
        # logits of the decode rows and of each reader's last prompt token in the step, not of every row
        rows = list(range(len(writing))) + [last_row for _, _, last_row in ends]
        t0 = time.perf_counter()
        logits = self.llm._step_rows(np.asarray(ids, np.int64), np.asarray(start, np.int64),
                                     np.asarray(slots, np.int64), np.asarray(rows, np.int64))
        self._step_s = _ema(self._step_s, time.perf_counter() - t0)
        read = len(ids) - len(writing)
        self.prompt_tokens["read"] += read
        self.steps[f"decode x{len(writing)} + {read} prompt"] += 1
        for s, row in zip(writing, logits[:len(writing)]):
            self._accept(s, row)
        for (seq, b, _), row in zip(ends, logits[len(writing):]):
            self._read_to(seq, b, row)

    def _read_to(self, seq, b, logits):
        """seq's prompt is in the cache up to b; `logits`: those at its last token read, whose pick is the
        sequence's first token once the whole prompt is in."""
        seq.cursor = b
        if b == len(seq.prompt):
            seq.first_token = time.perf_counter()
            self._accept(seq, logits)

    def _accept(self, seq, logits):
        tok = sampling.pick(logits, seen=seq.seen, **seq.sampler)
        for piece in seq.out.push(tok):
            seq.emit(piece)
        seq.seen.append(tok)
        seq.last = tok
        if seq.out.finish_reason is not None:
            self._finish(seq)

    def _finish(self, seq, error=None):
        seq.error = error
        with self._cv:
            if self._slots.get(seq.slot) is seq:
                self._release(seq, valid=error is None)
        seq.emit(DONE)

    def _retire_cancelled(self):
        for seq in [s for s in self._slots.values() if s.cancelled]:
            self._release(seq)
            seq.out.finish_reason = seq.out.finish_reason or "cancelled"
            seq.emit(DONE)
        for seq in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(seq)
            seq.out.finish_reason = "cancelled"
            seq.emit(DONE)
