"""The LLM an OpenAI-compatible server answers with, swappable while it serves (`cuvil serve --watch`,
`LiveLLM.reload`): requests in flight finish on the artifact they started on, every later request runs
on the new one, and the old one's batcher closes once its last sequence has ended. Each artifact has a
KV cache of its own, so for a while both are in memory."""
from __future__ import annotations

import threading
import time

from ..errors import CuvilError
from .continuous import ContinuousBatcher


class Generation:
    """One artifact's LLM and the batcher over its KV cache; `entering`: requests between picking this
    generation and having their sequence queued in its batcher. policy: ContinuousBatcher's prefill
    options (prefill_chunk, pace_prefill, mix_rows)."""

    def __init__(self, llm, policy):
        if llm.tokenizer is None:
            raise CuvilError(f"{llm.path} has no tokenizer.json: the OpenAI APIs take and give text")
        self.llm, self.entering = llm, 0
        self.batcher = ContinuousBatcher(llm, **policy)

    def idle(self) -> bool:
        return self.entering == 0 and self.batcher.active() == 0 and self.batcher.waiting() == 0


class LiveLLM:
    RETIRE_POLL_SECONDS = 0.05

    def __init__(self, llm, *, num_threads=None, **policy):
        self.policy, self.num_threads = policy, num_threads
        self._lock = threading.Lock()
        self._live = Generation(llm, policy)
        self._retiring: list[threading.Thread] = []
        self._reused_before = 0          # prompt tokens reused by retired generations
        self._closing = False
        self.reloads = 0

    def submit(self, encode, **settings):
        """(sequence, ids): encode(llm) -> the prompt's token ids, by the live generation's tokenizer, and
        the sequence queued in that generation's batcher (errors of either raised as they are)."""
        with self._lock:
            g = self._live
            g.entering += 1
        try:
            ids = encode(g.llm)
            return g.batcher.submit(ids, **settings), ids
        finally:
            with self._lock:
                g.entering -= 1

    def reload(self, artifact):
        """Serve `artifact` from now on (an LLM artifact path). One that does not load raises here (the
        running one stays)."""
        from ..llm import load
        new = Generation(load(artifact, num_threads=self.num_threads), self.policy)
        with self._lock:
            old, self._live = self._live, new
            self.reloads += 1
        t = threading.Thread(target=self._retire, args=(old,), name="cuvil-llm-retire", daemon=True)
        self._retiring.append(t)
        t.start()

    def _retire(self, g):
        while True:
            with self._lock:
                if g.idle() or self._closing:
                    self._reused_before += g.batcher.prompt_tokens["reused"]
                    break
            time.sleep(self.RETIRE_POLL_SECONDS)
        g.batcher.close()

    # ---- what /metrics reads --------------------------------------------------------------------
    def active(self) -> int:
        return self._live.batcher.active()

    def waiting(self) -> int:
        return self._live.batcher.waiting()

    def reused(self) -> int:
        return self._reused_before + self._live.batcher.prompt_tokens["reused"]

    def close(self):
        """Close every batcher (requests still running end with an error)."""
        self._closing = True
        self._live.batcher.close()
        for t in self._retiring:
            t.join()
