"""Continuous batching against the oracle of one sequence at a time (LLM.generate on its own)."""
import threading
import time

import numpy as np
import pytest

import cuvil
import cuvil.llm
from cuvil.serve.continuous import ContinuousBatcher

from .llm_fixtures import checkpoint, small_model

PROMPTS = [[5, 17, 33], list(range(40, 60)), [7] * 9, [99, 3, 250, 8, 14, 71, 2], list(range(100, 113))]
BUDGETS = [12, 5, 20, 9, 16]


@pytest.fixture(scope="module")
def llm():
    return cuvil.llm.from_transformers(small_model("llama"), max_seq_len=64, max_batch=3)


def test_greedy_output_equals_single_sequence_runs(llm):
    """5 requests over 3 slots (two admitted as others retire), prompts read 4 tokens a chunk between
    decode steps: every sequence's tokens equal its greedy run alone, token for token."""
    alone = [llm.generate(p, b) for p, b in zip(PROMPTS, BUDGETS)]
    batcher = ContinuousBatcher(llm, prefill_chunk=4)
    try:
        seqs = [batcher.submit(p, b) for p, b in zip(PROMPTS, BUDGETS)]
        got = [list(s) for s in seqs]
    finally:
        batcher.close()
    assert got == alone
    assert [s.out.finish_reason for s in seqs] == ["length"] * 5
    decode_rows = {int(k.split("x")[1]) for k in batcher.steps if k.startswith("decode")}
    assert max(decode_rows) == 3, batcher.steps          # slots shared by sequences at different positions
    assert batcher.steps["prefill"] >= sum(-(-len(p) // 4) for p in PROMPTS)


def test_text_stops_and_streams_from_threads(tmp_path):
    ckpt = checkpoint(tmp_path / "ckpt")
    del ckpt
    llm = cuvil.llm.from_transformers(tmp_path / "ckpt", max_seq_len=96, max_batch=2)
    prompts = ["cuvil compiles", "le café est", "the quick brown"]
    alone = [llm.generate(p, 24) for p in prompts]
    stop = alone[1][3:6] if len(alone[1]) > 6 else None
    alone_stop = llm.generate(prompts[1], 24, stop=[stop]) if stop else alone[1]
    batcher = ContinuousBatcher(llm, prefill_chunk=3)
    results = [None] * 3

    def client(i):
        ids = llm.tokenizer.encode(prompts[i])
        results[i] = "".join(batcher.submit(ids, 24, stop=[stop] if i == 1 and stop else None))
    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        batcher.close()
    assert results == [alone[0], alone_stop, alone[2]]


def test_cancel_frees_the_slot_and_errors_are_per_request(llm, monkeypatch):
    step = llm._step

    def paced(*a, **k):          # a big model's pace (3 ms a step): the tiny one could finish all 50
        time.sleep(0.003)        # tokens between the first one and the cancel
        return step(*a, **k)
    monkeypatch.setattr(llm, "_step", paced)
    batcher = ContinuousBatcher(llm, prefill_chunk=8)
    try:
        long = batcher.submit(PROMPTS[0], 50)
        first = next(iter(long))
        long.cancel()
        rest = list(long)
        assert len(rest) < 49 and long.out.finish_reason == "cancelled"
        with pytest.raises(cuvil.ShapeError, match="holds 64"):
            batcher.submit(list(range(64)), 4)            # no room for a new token: refused up front
        with pytest.raises(ValueError, match="temperature"):
            batcher.submit(PROMPTS[0], 4, temperature=-1.0)
        with pytest.raises(cuvil.ShapeError, match="token ids"):
            batcher.submit([1, 10 ** 6], 4)
        again = [batcher.submit(p, 6) for p in PROMPTS[:3]]
        assert [len(list(s)) for s in again] == [6, 6, 6]
        assert batcher.active() == 0 and batcher.waiting() == 0
        del first
    finally:
        batcher.close()
