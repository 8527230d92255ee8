"""Continuous batching against the oracle of one sequence at a time (LLM.generate on its own)."""
import threading
import time

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
        with batcher._cv:           # (re-entrant) queued together: the scheduler could otherwise finish one
            seqs = [batcher.submit(p, b) for p, b in zip(PROMPTS, BUDGETS)]     # before the next arrives
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


def test_prefix_reuse_skips_kept_tokens_and_keeps_outputs(llm):
    """A shared system prompt, the same prompt again and a conversation's next turn, each submitted
    after the one it shares with has finished: the batcher reads only the new tokens (counted exactly)
    and every output equals the sequence's greedy run alone; with prefix_reuse=False nothing is reused."""
    system = list(range(200, 224))
    first = system + [5, 6, 7]
    alone_first = llm.generate(first, 6)
    turns = [system + [9, 10], first, first + alone_first + [11, 12]]      # the next turn: history + new text
    alone = [llm.generate(p, 6) for p in turns]
    for reuse in (True, False):
        batcher = ContinuousBatcher(llm, prefill_chunk=8, prefix_reuse=reuse)
        try:
            got = [list(batcher.submit(first, 6))]
            got += [list(batcher.submit(p, 6)) for p in turns]   # one at a time: each finds the last one's slot
        finally:
            batcher.close()
        assert got == [alone_first] + alone
        total = len(first) + sum(len(p) for p in turns)
        # kept after `first`: its prompt and the 5 outputs fed back. The system prompt's turn takes that
        # slot (24 shared), so `first` again finds 24 there; then the history: its prompt and outputs
        # fed back (32 of 34)
        reused = [len(system), len(system), len(first) + len(alone_first) - 1] if reuse else [0, 0, 0]
        assert batcher.prompt_tokens == {"reused": sum(reused), "read": total - sum(reused)}, batcher.prompt_tokens


def test_requests_arriving_together_read_a_shared_prefix_once(llm):
    """Three requests with one 24-token system prompt, submitted together into empty slots: the first
    reads its prompt, the other two copy the system prompt's keys and values from its slot (48 tokens
    reused, counted exactly), and every output equals the sequence's greedy run alone."""
    system = list(range(200, 224))
    prompts = [system + [5], system + [9, 10], system + [7, 8, 9]]
    alone = [llm.generate(p, 6) for p in prompts]
    batcher = ContinuousBatcher(llm, prefill_chunk=8)
    try:
        with batcher._cv:           # (re-entrant) the scheduler admits them together, into empty slots
            seqs = [batcher.submit(p, 6) for p in prompts]
        got = [list(s) for s in seqs]
    finally:
        batcher.close()
    assert got == alone
    assert len({s.slot for s in seqs}) == 3
    total = sum(len(p) for p in prompts)
    assert batcher.prompt_tokens == {"reused": 2 * len(system), "read": total - 2 * len(system)}, \
        batcher.prompt_tokens


def test_prefix_reuse_picks_the_slot_with_the_longest_prefix(llm):
    """Three slots keep three different prompts; a request sharing most with the second goes there (and
    its output equals its greedy run alone), one sharing nothing goes to the slot freed longest ago."""
    prompts = [[1] * 10, list(range(30, 50)), [2] * 12]
    probe = list(range(30, 45)) + [7, 8]
    want = llm.generate(probe, 4)              # before the batcher: it holds the model while it runs
    batcher = ContinuousBatcher(llm, prefill_chunk=8)
    try:
        seqs = [batcher.submit(p, 2) for p in prompts]
        for s in seqs:
            list(s)
        slots = {tuple(p): s.slot for p, s in zip(prompts, seqs)}
        seq = batcher.submit(probe, 4)
        got = list(seq)
        assert seq.slot == slots[tuple(prompts[1])] and got == want
        assert batcher.prompt_tokens["reused"] == 15
        freed_first = min((s for s in range(3) if s != seq.slot), key=batcher._freed.__getitem__)
        fresh = batcher.submit([250, 251, 252], 2)
        list(fresh)
        assert fresh.slot == freed_first
    finally:
        batcher.close()


def test_paced_prefill_chunks_follow_the_step_time(llm, monkeypatch):
    """pace_prefill=True: while streams decode, a chunk takes about one decode step by the running estimates
    (at least MIN_PACED_CHUNK tokens, at most prefill_chunk); with nothing decoding, whole chunks. The
    outputs still equal each sequence's greedy run alone."""
    from cuvil.serve import continuous
    batcher = ContinuousBatcher(llm, prefill_chunk=32, pace_prefill=True)
    try:
        assert batcher._chunk_tokens(True) == 32                      # no estimates yet
        batcher._step_s, batcher._token_s = 0.030, 0.003
        assert batcher._chunk_tokens(True) == 10 and batcher._chunk_tokens(False) == 32
        batcher._token_s = 0.1
        assert batcher._chunk_tokens(True) == continuous.MIN_PACED_CHUNK
        batcher._token_s = 1e-6
        assert batcher._chunk_tokens(True) == 32
    finally:
        batcher.close()
    fixed = ContinuousBatcher(llm, prefill_chunk=32)                  # the default: whole chunks
    try:
        fixed._step_s, fixed._token_s = 0.030, 0.003
        assert fixed._chunk_tokens(True) == 32
    finally:
        fixed.close()
    # a long prompt read while streams decode is read in paced chunks, the estimates held fixed (a decode
    # step costs what 5.5 prompt tokens do; measured times would make the sizes vary), and every output is
    # the greedy run's
    monkeypatch.setattr(continuous, "_ema", lambda old, new: new if old is None else old)
    long_prompt = list(range(20, 60))
    alone = [llm.generate(p, 50) for p in (PROMPTS[0], PROMPTS[2])] + [llm.generate(long_prompt, 6)]
    batcher = ContinuousBatcher(llm, prefill_chunk=32, pace_prefill=True)
    batcher._step_s, batcher._token_s = 0.011, 0.002
    sizes = []
    real = batcher._prefill_chunk

    def spy(job):                    # runs on the scheduler thread, which alone changes the slots
        decoding = any(s is not job[0] and s.cursor >= len(s.prompt) for s in batcher._slots.values())
        sizes.append((job[1], decoding))
        real(job)
    batcher._prefill_chunk = spy
    real_decode, late = batcher._decode, []

    def decode_then_submit(seqs):    # the long prompt arrives from the scheduler once a stream decodes
        real_decode(seqs)
        if not late:
            late.append(batcher.submit(long_prompt, 6))
    batcher._decode = decode_then_submit
    try:
        seqs = [iter(batcher.submit(p, 50)) for p in (PROMPTS[0], PROMPTS[2])]
        got = [list(s) for s in seqs] + [list(late[0])]
    finally:
        batcher.close()
    assert got == alone
    # whole chunks while nothing decodes, chunks of int(5.5) = 5 while a stream does; the long prompt is
    # submitted by the scheduler after the first decode step, so it is read while the streams decode (49
    # steps left; submitted from the test's thread after the first token, on a loaded CI host the streams
    # had sometimes ended before it arrived)
    assert sizes[0] == (32, False), sizes
    assert all(n == (5 if decoding else 32) for n, decoding in sizes), sizes
    assert sum(decoding for _, decoding in sizes) >= 8, sizes


def test_mixed_steps_carry_prompt_tokens_and_keep_greedy_outputs(llm):
    """mix_rows=4: while streams decode, each decode step also reads prompt tokens, a row each at its
    position in its sequence's slot, up to 4 rows in all and at least one (two sequences' tokens in one
    step where a prompt ends); every sequence's tokens still equal its greedy run alone, token for token."""
    alone = [llm.generate(p, b) for p, b in zip(PROMPTS, BUDGETS)]
    batcher = ContinuousBatcher(llm, prefill_chunk=4, mix_rows=4)
    try:
        with batcher._cv:
            seqs = [batcher.submit(p, b) for p, b in zip(PROMPTS, BUDGETS)]
        got = [list(s) for s in seqs]
    finally:
        batcher.close()
    assert got == alone
    mixed = [(int(k.split("x")[1].split()[0]), int(k.split("+ ")[1].split()[0])) for k in batcher.steps if "prompt" in k]
    assert mixed and all(p >= 1 and d + p <= max(4, d + 1) for d, p in mixed), batcher.steps
    assert any(d + p == 4 for d, p in mixed) and any(d == 2 and p == 1 for d, p in mixed), batcher.steps
    assert batcher.prompt_tokens["read"] + batcher.prompt_tokens["reused"] == sum(map(len, PROMPTS))


def test_mixed_step_rows_stay_within_the_artifact(llm):
    """mix_rows above the rows a step of the artifact takes is cut to them; a negative one is refused."""
    batcher = ContinuousBatcher(llm, mix_rows=10 ** 6)
    try:
        assert batcher.mix == min(llm.max_rows, llm.max_step_tokens) == 64
        assert batcher._mix_room(3) == 61 and ContinuousBatcher._mix_room(batcher, 64) == 1
    finally:
        batcher.close()
    with pytest.raises(ValueError, match="mix_rows"):
        ContinuousBatcher(llm, mix_rows=-1)
