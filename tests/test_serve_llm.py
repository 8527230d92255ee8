"""The OpenAI-compatible server: a real uvicorn on loopback, a real HTTP client, answers checked against
the same artifact's LLM.generate run alone (greedy)."""
import asyncio
import json
import time

import pytest

import cuvil.llm

from .llm_fixtures import checkpoint
from .test_serve import _server

httpx = pytest.importorskip("httpx", reason="the tests' HTTP client (a dev requirement)")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("llmserve")
    checkpoint(d / "ckpt")
    llm = cuvil.llm.from_transformers(d / "ckpt", max_seq_len=96, max_batch=2)
    llm.save(d / "tiny.cuvil")
    from cuvil.serve.openai import create_llm_app
    reference = cuvil.llm.load(d / "tiny.cuvil")
    # the served copy steps at a big model's pace (3 ms a step), so a disconnect is seen mid-stream
    slow = _paced(cuvil.llm.load(d / "tiny.cuvil"), 0.003)
    with _server(create_llm_app(d / "tiny.cuvil", prefill_chunk=4, llm=slow)) as url:
        yield url, reference


def _paced(llm, seconds):
    """llm, each step of it taking `seconds` more (a big model's pace)."""
    step = llm._step

    def paced(*a, **k):
        time.sleep(seconds)
        return step(*a, **k)
    llm._step = paced
    return llm


PROMPTS = ["cuvil compiles", "le café est très", "the quick brown fox", "数据 编译器", "emoji test"]


def test_completions_concurrent_streams_and_whole(served):
    url, ref = served
    alone = [ref.generate(p, 20) for p in PROMPTS]

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            async def whole(p):
                r = await c.post("/v1/completions", json={"model": "tiny", "prompt": p, "max_tokens": 20,
                                                          "temperature": 0})
                assert r.status_code == 200, r.text
                return r.json()

            async def streamed(p):
                text, events = "", []
                async with c.stream("POST", "/v1/completions", json={"prompt": p, "max_tokens": 20,
                                                                      "temperature": 0, "stream": True}) as r:
                    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                for e in events[:-1]:
                    text += json.loads(e)["choices"][0]["text"]
                return text, events
            return await asyncio.gather(*(whole(p) for p in PROMPTS), *(streamed(p) for p in PROMPTS))
    res = asyncio.run(main())
    wholes, streams = res[:len(PROMPTS)], res[len(PROMPTS):]
    for p, a, w, (text, events) in zip(PROMPTS, alone, wholes, streams):
        assert w["choices"][0]["text"] == a and text == a
        assert w["object"] == "text_completion" and w["choices"][0]["finish_reason"] in ("length", "stop")
        n = len(ref.tokenizer.encode(p))
        assert w["usage"]["prompt_tokens"] == n and w["usage"]["total_tokens"] == n + w["usage"]["completion_tokens"]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"] == w["usage"]


def test_chat_completions_and_models(served):
    url, ref = served
    messages = [{"role": "user", "content": "the quick brown"}]
    expected = ref.generate(messages, 16, chat=True, stop=["\n"])
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"
        r = c.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 16,
                                                 "temperature": 0, "stop": "\n"})
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        assert msg == {"role": "assistant", "content": expected}
        with c.stream("POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 16, "temperature": 0,
                                                            "stop": ["\n"], "stream": True}) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == expected
    assert chunks[-1]["object"] == "chat.completion.chunk" and chunks[-1]["choices"][0]["finish_reason"]


def test_seeded_sampling_repeats(served):
    url, _ = served
    body = {"prompt": "cuvil", "max_tokens": 12, "temperature": 0.9, "top_p": 0.9, "seed": 7}
    with httpx.Client(base_url=url, timeout=60) as c:
        a, b = (c.post("/v1/completions", json=body).json()["choices"][0]["text"] for _ in range(2))
    assert a == b


BAD = [({"prompt": "x", "temperature": 3}, 400, "temperature"), ({"prompt": "x", "n": 2}, 400, "n must be"),
       ({"prompt": ""}, 400, "prompt"), ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
       ({"prompt": "x", "stop": ["a"] * 5}, 400, "stop"), ({"prompt": [1, 10 ** 9]}, 400, "token ids"),
       ({"prompt": "x", "model": "gpt-4"}, 404, "no model"), ({"prompt": "x", "stream": "yes"}, 400, "stream"),
       ({"prompt": list(range(2, 98))}, 400, "holds 96"), ({"messages": "hi"}, 400, "messages")]


def test_bad_requests_are_openai_errors(served):
    url, _ = served
    with httpx.Client(base_url=url, timeout=60) as c:
        for body, status, text in BAD:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            r = c.post(path, json=body)
            assert r.status_code == status and text in r.json()["error"]["message"], (body, r.text)
        r = c.post("/v1/completions", content=b"{oops", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
        assert "Traceback" not in r.text


def test_a_client_that_disconnects_frees_its_slot(served):
    url, _ = served
    def generated(c):
        line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith("cuvil_llm_generated_tokens_total"))
        return float(line.split()[-1])
    with httpx.Client(base_url=url, timeout=60) as c:
        before = generated(c)
        with c.stream("POST", "/v1/completions", json={"prompt": "cuvil", "max_tokens": 90, "temperature": 0,
                                                       "stream": True}) as s:
            next(s.iter_lines())                # one event, then the client goes away
        deadline = time.monotonic() + 20
        while "cuvil_llm_active_sequences 0.0" not in c.get("/metrics").text:
            assert time.monotonic() < deadline, "the abandoned stream still holds its slot"
            time.sleep(0.1)
        assert generated(c) - before < 89, "the stream ran to its end: the disconnect did not stop it"


def test_openai_bodies_fuzzed_give_settings_or_bad_requests():
    """Any JSON body: checked settings the batcher accepts, or a BadRequest naming the field."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cuvil.llm import sampling
    from cuvil.serve.openai import BadRequest, parse_sampling
    values = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=5),
                       st.lists(st.one_of(st.text(max_size=3), st.integers()), max_size=6))
    keys = st.sampled_from(["max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop",
                            "n", "other"])

    @settings(max_examples=400, deadline=None)
    @given(st.one_of(values, st.dictionaries(keys, values, max_size=6)))
    def check(body):
        try:
            got = parse_sampling(body)
        except BadRequest:
            return
        sampling.check_sampling(got["temperature"], got["top_k"], got["top_p"], got["repetition_penalty"], got["seed"])
        assert isinstance(got["max_new_tokens"], int) and got["max_new_tokens"] >= 0
        assert got["stop"] is None or all(isinstance(s, str) and s for s in got["stop"])
    check()


def test_a_repeated_conversation_reads_only_its_new_tokens(served):
    """The next turn of a conversation (its history then new text) reuses the slot that kept the history
    (cuvil_llm_prompt_tokens_reused grows by the history's length) and still answers as generate alone."""
    url, ref = served
    history = ref.tokenizer.encode("a long shared system prompt, read once per slot")
    reply = ref.generate(history, 6)
    turn = history + ref.tokenizer.encode(reply) + ref.tokenizer.encode(" and then?")
    want = ref.generate(turn, 6)

    def reused(c):
        line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith("cuvil_llm_prompt_tokens_reused"))
        return float(line.split()[-1])
    with httpx.Client(base_url=url, timeout=60) as c:
        while "cuvil_llm_active_sequences 0.0" not in c.get("/metrics").text:
            time.sleep(0.05)                     # slots free: the history lands in one the turn then finds
        first = c.post("/v1/completions", json={"prompt": history, "max_tokens": 6, "temperature": 0}).json()
        before = reused(c)
        second = c.post("/v1/completions", json={"prompt": turn, "max_tokens": 6, "temperature": 0}).json()
        assert first["choices"][0]["text"] == reply and second["choices"][0]["text"] == want
        assert reused(c) - before >= len(history), "the turn read its history again"


def test_watch_swaps_in_a_saved_llm_under_load(tmp_path):
    """An LLM artifact saved over the served one while streams run: every stream ends whole (the one
    running across the swap with the old model's text), the requests after the swap get the new model's
    text, and nothing is dropped or errors."""
    import shutil
    from cuvil.serve.openai import create_llm_app
    for seed in (0, 1):
        checkpoint(tmp_path / f"ckpt{seed}", seed=seed)
        cuvil.llm.from_transformers(tmp_path / f"ckpt{seed}", max_seq_len=96, max_batch=2).save(tmp_path / f"m{seed}")
    old, new = (cuvil.llm.load(tmp_path / f"m{seed}") for seed in (0, 1))
    prompt = "cuvil compiles"
    want_old, want_new = old.generate(prompt, 40), new.generate(prompt, 40)
    assert want_old != want_new
    served = tmp_path / "live.cuvil"
    shutil.copytree(tmp_path / "m0", served)
    slow = _paced(cuvil.llm.load(served), 0.008)    # 40 tokens take ~0.3 s: the save lands while the first stream runs
    body = {"prompt": prompt, "max_tokens": 40, "temperature": 0}

    async def main(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            async def streamed():
                text = ""
                async with c.stream("POST", "/v1/completions", json=dict(body, stream=True)) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            text += json.loads(line[6:])["choices"][0]["text"]
                return text

            running = asyncio.create_task(streamed())
            await asyncio.sleep(0.05)
            await asyncio.get_running_loop().run_in_executor(None, new.save, served)     # in one step
            during = await running
            deadline = time.monotonic() + 30
            while "cuvil_llm_reloads 1.0" not in (await c.get("/metrics")).text:
                assert time.monotonic() < deadline, "the saved artifact was not swapped in"
                await asyncio.sleep(0.05)
            after = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(3)))
            return during, [r.json()["choices"][0]["text"] for r in after]
    app = create_llm_app(served, prefill_chunk=8, pace_prefill=True, llm=slow, watch_seconds=0.05)
    with _server(app) as url:
        during, after = asyncio.run(main(url))
    assert during == want_old
    assert after == [want_new] * 3
    assert app.state.live._live.batcher.pace_prefill        # the reloaded generation keeps the server's policy


def test_mixed_steps_over_http_keep_greedy_answers(tmp_path):
    """`cuvil serve --mix-rows 3` (create_llm_app(mix_rows=3)): concurrent streamed completions, prompt
    tokens riding in the decode steps of the others, each answer equal to its greedy run alone; the
    server's batcher did run mixed steps."""
    checkpoint(tmp_path / "ckpt")
    cuvil.llm.from_transformers(tmp_path / "ckpt", max_seq_len=96, max_batch=2).save(tmp_path / "tiny.cuvil")
    from cuvil.serve.openai import create_llm_app
    ref = cuvil.llm.load(tmp_path / "tiny.cuvil")
    alone = [ref.generate(p, 12) for p in PROMPTS]
    # steps at a big model's pace (10 ms), so that the requests overlap on a loaded host too: the tiny
    # model alone answered each before the next arrived (one CI run saw no mixed step)
    slow = _paced(cuvil.llm.load(tmp_path / "tiny.cuvil"), 0.01)
    app = create_llm_app(tmp_path / "tiny.cuvil", prefill_chunk=4, mix_rows=3, llm=slow)

    async def main(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            async def streamed(p):
                text = ""
                async with c.stream("POST", "/v1/completions", json={"prompt": p, "max_tokens": 12,
                                                                      "temperature": 0, "stream": True}) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            text += json.loads(line[6:])["choices"][0]["text"]
                return text
            return await asyncio.gather(*(streamed(p) for p in PROMPTS))
    with _server(app) as url:
        assert asyncio.run(main(url)) == alone
        steps = app.state.live._live.batcher.steps
    assert any("prompt" in k for k in steps), steps
