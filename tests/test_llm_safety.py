"""LLM runtime safety (issue 37): one LLM shared by threads never mixes sequences; bad generation
arguments, token ids and llm.json files are refused with errors that name them."""
import json
import math
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import cuvil
import cuvil.llm
from cuvil.errors import ArtifactError, CuvilError, ShapeError
from cuvil.llm import model as llm_model
from cuvil.llm.sampling import choose

from .llm_fixtures import small_model, tokenizer_files

PROMPTS = [[3, 4, 5], [17, 2, 99, 150], [250, 8], [42] * 5, [7, 7, 120, 33, 81, 9]]
N_NEW = 24


@pytest.fixture(scope="module")
def llm():
    return cuvil.llm.from_transformers(small_model("llama"), max_seq_len=64)


@pytest.fixture(scope="module")
def want(llm):
    """Each prompt's greedy tokens, one thread, before any other test touches the cache."""
    return [llm.generate(p, max_new_tokens=N_NEW) for p in PROMPTS]


def _run_threads(work, n=4):
    errors = []

    def guarded(w):
        try:
            work(w)
        except Exception as e:          # noqa: BLE001  (reported by the main thread)
            errors.append(repr(e))
    threads = [threading.Thread(target=guarded, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


# ---- defect 3: threads --------------------------------------------------------------------------
def test_threads_sharing_one_llm_get_the_single_thread_results(llm, want):
    assert len({tuple(w) for w in want}) == len(want)      # distinct: a mixed-up sequence would show

    def work(w):
        for r in range(6):
            i = (w + r) % len(PROMPTS)
            if (w + r) % 3 == 2:        # streaming: the iterator holds the cache across its yields
                got = list(llm.generate(PROMPTS[i], max_new_tokens=N_NEW, stream=True))
            else:
                got = llm.generate(PROMPTS[i], max_new_tokens=N_NEW)
            assert got == want[i], f"thread {w} prompt {i}: {got} != {want[i]}"
            assert llm.last_stats.tokens == want[i], f"thread {w}: last_stats of another thread's call"
    assert _run_threads(work) == []


def test_threads_stepping_under_the_lock_get_the_single_thread_results(llm, want):
    def work(w):
        for r in range(3):
            i = (w + r) % len(PROMPTS)
            with llm.lock:              # prefill and decodes as one sequence
                tok, got = int(llm.prefill(PROMPTS[i])[-1].argmax()), []
                for _ in range(N_NEW):
                    got.append(tok)
                    tok = int(llm.decode([tok])[0].argmax())
            assert got == want[i], f"thread {w} prompt {i}"
    assert _run_threads(work) == []


def test_an_abandoned_stream_is_released_when_closed_or_collected(llm, want):
    it = llm.generate(PROMPTS[0], max_new_tokens=N_NEW, stream=True)
    assert next(it) == want[0][0]
    # this thread using the LLM again would mix two sequences: a clear error, not a deadlock
    with pytest.raises(CuvilError, match="close"):
        llm.generate(PROMPTS[1], max_new_tokens=3)
    with pytest.raises(CuvilError, match="close"):
        llm.decode([5])
    # another thread waits for the stream ...
    out = []
    t = threading.Thread(target=lambda: out.append(llm.generate(PROMPTS[1], max_new_tokens=N_NEW)))
    t.start()
    t.join(timeout=0.5)
    assert t.is_alive() and not out
    it.close()                          # ... until it is closed
    t.join(timeout=60)
    assert out == [want[1]]
    # dropped unfinished: the generator's finally releases the lock
    it = llm.generate(PROMPTS[2], max_new_tokens=N_NEW, stream=True)
    next(it)
    del it
    assert llm.generate(PROMPTS[2], max_new_tokens=N_NEW) == want[2]
    # a stream never started holds nothing
    llm.generate(PROMPTS[3], max_new_tokens=N_NEW, stream=True)
    assert llm.generate(PROMPTS[3], max_new_tokens=N_NEW) == want[3]


def test_waiting_long_for_a_held_llm_warns(llm, want, monkeypatch):
    monkeypatch.setattr(llm_model, "WAIT_WARNING_S", 0.05)
    started, done = threading.Event(), threading.Event()

    def hold():
        it = llm.generate(PROMPTS[0], max_new_tokens=N_NEW, stream=True)
        next(it)
        started.set()
        time.sleep(0.5)
        it.close()
        done.set()
    t = threading.Thread(target=hold)
    t.start()
    assert started.wait(60)
    with pytest.warns(RuntimeWarning, match="close"):
        got = llm.generate(PROMPTS[1], max_new_tokens=N_NEW)
    assert done.is_set() and got == want[1]
    t.join()


# ---- defect 8: arguments ------------------------------------------------------------------------
BAD_GENERATE = [
    (dict(temperature=-1), ValueError, "temperature must be a finite number >= 0.*got -1"),
    (dict(temperature=math.nan), ValueError, "temperature"),
    (dict(temperature=math.inf), ValueError, "temperature"),
    (dict(temperature="0.7"), TypeError, "temperature"),
    (dict(top_p=2), ValueError, r"top_p must be a number in \(0, 1\], got 2"),
    (dict(top_p=0), ValueError, "top_p"),
    (dict(top_p=math.nan), ValueError, "top_p"),
    (dict(top_k=-5), ValueError, "top_k must be an int >= 0.*got -5"),
    (dict(top_k=2.5), TypeError, "top_k"),
    (dict(repetition_penalty=0), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=-1.2), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=math.nan), ValueError, "repetition_penalty"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be an int >= 0.*got -1"),
    (dict(max_new_tokens=8.0), TypeError, "max_new_tokens"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens"),
    (dict(max_new_tokens=None), TypeError, "max_new_tokens"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(seed="7"), TypeError, "seed"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(stop=[3.5]), TypeError, "stop"),
    (dict(stop=[None]), TypeError, "stop"),
    (dict(stop=[-1]), ValueError, "stop"),
    (dict(stop=[300]), ValueError, "stop"),
    (dict(stop=[""]), ValueError, "stop"),
    (dict(stop=5.0), TypeError, "stop"),
    (dict(stop=["the"]), ValueError, "stop.*tokenizer"),     # this artifact has none to see text with
    (dict(prompt=[3, -1, 5]), ShapeError, r"prompt must be token ids in \[0, 300\), got -1"),
    (dict(prompt=[3, 300]), ShapeError, "prompt.*got 300"),
    (dict(prompt=[3.0, 4.0]), ShapeError, "prompt must be integer token ids"),
    (dict(prompt=[True, False]), ShapeError, "prompt"),
    (dict(prompt=[[3, 4]]), ShapeError, "prompt"),
    (dict(prompt=[]), ShapeError, "prompt is empty"),
    (dict(prompt=[3] * 65), ShapeError, "prompt.*65 tokens.*64"),
    (dict(prompt="some text"), CuvilError, "tokenizer"),
    (dict(chat=True), CuvilError, "chat=True.*tokenizer"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kw, exc, match", BAD_GENERATE, ids=[repr(k) for k, _, _ in BAD_GENERATE])
def test_bad_generate_arguments_raise_when_called(llm, monkeypatch, kw, exc, match, stream):
    def no_step(*a, **k):
        raise AssertionError("the model ran before the arguments were checked")
    monkeypatch.setattr(llm, "_step", no_step)
    kw = {"prompt": [3, 4, 5], **kw}
    with pytest.raises(exc, match=match) as e:
        llm.generate(stream=stream, **kw)       # stream=True: at the call, not at the first next()
    assert isinstance(e.value, (CuvilError, ValueError, TypeError))


BAD_STEPS = [
    (lambda m: m.prefill([3, -1]), r"ids must be token ids in \[0, 300\), got -1"),
    (lambda m: m.prefill([3, 300]), "ids.*got 300"),
    (lambda m: m.prefill([]), "ids is empty"),
    (lambda m: m.prefill([1.5]), "ids must be integer token ids"),
    (lambda m: m.decode([-1]), "tokens.*got -1"),
    (lambda m: m.decode(np.array([300])), "tokens.*got 300"),
    (lambda m: m.decode([1, 2]), "max_batch"),
    (lambda m: m.step([[1, -3]]), "ids.*got -3"),
    (lambda m: m.step([[1, 2]], start=[-1]), "start"),
    (lambda m: m.step([[1, 2]], start=[0.5]), "start"),
    (lambda m: m.step([[1, 2]], start=[0, 0]), "start"),
    (lambda m: m.step([[1, 2], [3]]), "ids"),
]


@pytest.mark.parametrize("call, match", BAD_STEPS, ids=range(len(BAD_STEPS)))
def test_bad_token_ids_in_step_calls_are_refused(llm, call, match):
    llm.prefill([5, 6, 7])
    lengths = llm.lengths.copy()
    with pytest.raises(ShapeError, match=match):
        call(llm)
    np.testing.assert_array_equal(llm.lengths, lengths)     # nothing ran


def test_chat_needs_text_or_messages(llm, tmp_path):
    art = llm.save(tmp_path / "m.cuvil")
    tokenizer_files(art)                    # the fixture's 300-token vocabulary, as the model's
    tllm = cuvil.llm.load(art)
    with pytest.raises(TypeError, match="chat=True"):
        tllm.generate([3, 4, 5], chat=True)
    assert isinstance(tllm.generate("hello", max_new_tokens=3, chat=True), str)
    assert isinstance(tllm.generate("hello", max_new_tokens=3, stop="lo"), str)    # one string: one stop


# the sampler: every input gives a token id in [0, V) or a clear error, nothing else. Each example
# breaks at most one parameter, so that most reach the arithmetic (tiny temperatures, huge penalties).
SAMPLING = dict(temperature=st.one_of(st.just(0), st.floats(0, 5), st.floats(0, 1e-300), st.floats(0, 1e308)),
                top_k=st.integers(0, 15), top_p=st.floats(0, 1, exclude_min=True),
                repetition_penalty=st.one_of(st.floats(0.5, 2), st.floats(0, exclude_min=True, allow_infinity=False)),
                seen=st.lists(st.integers(0, 11), max_size=8))
ANYTHING = st.one_of(st.floats(), st.integers(), st.none(), st.booleans(), st.text(max_size=2), st.complex_numbers(),
                     st.lists(st.integers(-20, 20), max_size=3))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logits=arrays(np.float64, st.integers(1, 12), elements=st.floats(width=64)),    # nan and inf included
       params=st.fixed_dictionaries(SAMPLING), broken=st.sampled_from([None] * 5 + list(SAMPLING)),
       value=ANYTHING, seed=st.integers(0, 2**32))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # numpy's overflow notes for extreme values
def test_choose_gives_a_token_or_a_clear_error(logits, params, broken, value, seed):
    params["seen"] = [i for i in params["seen"] if i < logits.size]
    if broken:
        params[broken] = value
    try:
        tok = choose(logits, rng=np.random.default_rng(seed), **params)
    except (ValueError, TypeError, CuvilError) as e:
        assert broken and broken in str(e)          # only a broken parameter, and the message names it
        return
    assert type(tok) is int and 0 <= tok < logits.size


# ---- llm.json ------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, match", [
    (lambda m: m.pop("layers"), "'layers' must be a positive int, got nothing"),
    (lambda m: m.update(vocab=-3), "'vocab' must be a positive int, got -3"),
    (lambda m: m.update(head_dim="16"), "'head_dim'"),
    (lambda m: m.update(max_seq_len=64.0), "'max_seq_len'"),
    (lambda m: m.update(max_seq_len=128), "does not match model.so"),
    (lambda m: m.update(vocab=301), "does not match model.so"),
    (lambda m: m.update(eos_token_ids=[1, "x"]), "eos_token_ids"),
    (lambda m: m.update(eos_token_ids=[9999]), "eos_token_ids"),
    (lambda m: [1, 2], "JSON object, got list"),
    (lambda m: "{not json", "not valid JSON"),
], ids=range(10))
def test_corrupt_llm_json_is_an_artifact_error(llm, tmp_path, edit, match):
    art = llm.save(tmp_path / "m.cuvil")
    meta = json.loads((art / "llm.json").read_text())
    out = edit(meta)
    text = out if isinstance(out, str) else json.dumps(out if isinstance(out, list) else meta)
    (art / "llm.json").write_text(text)
    with pytest.raises(ArtifactError, match=match) as e:
        cuvil.llm.load(art)
    assert "llm.json" in str(e.value)
