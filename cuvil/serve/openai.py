"""`cuvil serve` for an LLM artifact: the OpenAI-compatible completions and chat completions APIs
(Server-Sent Events when stream is true), on a ContinuousBatcher, with Prometheus metrics.

    GET  /v1/models
    POST /v1/completions              prompt (text or token ids), max_tokens, temperature, top_p, stop,
    POST /v1/chat/completions         seed, stream; cuvil's extensions: top_k, repetition_penalty
    GET  /health, /metrics

A request the model cannot take is a 400 with OpenAI's error body ({"error": {"message", "type",
"param"}}), checked before it is queued (a prompt with no room left in the context, a temperature
out of range, n > 1, an unknown field type); an unknown model is a 404. A client that disconnects
frees its slot at the next step."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..errors import CuvilError
from .continuous import DONE
from .live import LiveLLM
from .watch import watch
from .wire import NAME_RE, model_name_of, read_body
from .metrics import LATENCY_BUCKETS

MAX_BODY_BYTES = 16 << 20
MAX_STOPS = 4


class BadRequest(ValueError):
    def __init__(self, message, param=None, status=400, kind="invalid_request_error"):
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind


def _field(body, name, kinds, default, what, ok=lambda v: True):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds) or not ok(v):
        raise BadRequest(f"{name} must be {what}, got {json.dumps(v)[:60]}", param=name)
    return v


def parse_sampling(body) -> dict:
    """The generation settings of a completions or chat body, checked (OpenAI's defaults)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    _field(body, "n", (int,), 1, "1 (one choice per request)", lambda v: v == 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and len(stop) <= MAX_STOPS and
                                 all(isinstance(s, str) and s for s in stop)):
        raise BadRequest(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", param="stop")
    return dict(max_new_tokens=_field(body, "max_tokens", (int,), 16, "an int >= 0", lambda v: v >= 0),
                temperature=float(_field(body, "temperature", (int, float), 1.0, "a number in [0, 2]",
                                         lambda v: 0 <= v <= 2)),
                top_p=float(_field(body, "top_p", (int, float), 1.0, "a number in (0, 1]", lambda v: 0 < v <= 1)),
                top_k=_field(body, "top_k", (int,), 0, "an int >= 0", lambda v: v >= 0),
                repetition_penalty=float(_field(body, "repetition_penalty", (int, float), 1.0, "a number > 0",
                                                lambda v: 0 < v < float("inf"))),
                seed=_field(body, "seed", (int,), None, "an int in [0, 2^63)", lambda v: 0 <= v < 2 ** 63),
                stop=stop)


def create_llm_app(artifact, *, name=None, prefill_chunk=64, pace_prefill=False, mix_rows=0, num_threads=None,
                   llm=None, max_body_bytes=MAX_BODY_BYTES, watch_seconds=0.0):
    """The OpenAI APIs on the LLM artifact (or `llm`, loaded from it); watch_seconds > 0: reload the
    artifact whenever one is saved over it (`cuvil serve --watch`, serve/live.py). prefill_chunk,
    pace_prefill, mix_rows: how the continuous batcher reads prompts (serve/continuous.py)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from ..llm import load
    name = name or model_name_of(artifact)
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"model name {name!r} must match {NAME_RE.pattern}")
    live = LiveLLM(llm or load(artifact, num_threads=num_threads), num_threads=num_threads,
                   prefill_chunk=prefill_chunk, pace_prefill=pace_prefill, mix_rows=mix_rows)
    reg = CollectorRegistry()
    requests = Counter("cuvil_llm_requests", "requests answered, by endpoint and HTTP status", ["endpoint", "code"],
                       registry=reg)
    tokens = Counter("cuvil_llm_generated_tokens", "tokens generated", registry=reg)
    prompt_tokens = Counter("cuvil_llm_prompt_tokens", "prompt tokens read", registry=reg)
    ttft = Histogram("cuvil_llm_time_to_first_token_seconds", "from a request's arrival to its first token",
                     buckets=LATENCY_BUCKETS, registry=reg)
    latency = Histogram("cuvil_llm_request_seconds", "from a request's arrival to its last token",
                        buckets=LATENCY_BUCKETS, registry=reg)
    Gauge("cuvil_llm_active_sequences", "sequences in KV cache slots", registry=reg).set_function(live.active)
    Gauge("cuvil_llm_queue_depth", "requests waiting for a slot", registry=reg).set_function(live.waiting)
    Gauge("cuvil_llm_prompt_tokens_reused", "prompt tokens whose keys and values were not read again: kept in "
          "a slot from an earlier request or copied from another slot (prefix reuse), in all",
          registry=reg).set_function(live.reused)
    Gauge("cuvil_llm_reloads", "artifacts swapped in by --watch", registry=reg).set_function(lambda: live.reloads)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        watcher = asyncio.get_running_loop().create_task(watch(live, artifact, watch_seconds)) \
            if watch_seconds else None
        yield
        if watcher is not None:
            watcher.cancel()
        await asyncio.get_running_loop().run_in_executor(None, live.close)
    app = FastAPI(title="cuvil", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.live = live

    def error(status, message, kind="invalid_request_error", param=None):
        return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                            status_code=status)

    @app.exception_handler(BadRequest)
    async def _bad(request, exc):
        return error(exc.status, str(exc), exc.kind, exc.param)

    @app.exception_handler(HTTPException)
    async def _http(request, exc):
        return error(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404 else "error")

    @app.exception_handler(Exception)
    async def _internal(request, exc):
        return error(500, f"internal error ({type(exc).__name__})", "server_error")

    @app.middleware("http")
    async def _count(request: Request, call_next):
        response = await call_next(request)
        requests.labels(request.url.path.rsplit("/", 1)[-1], str(response.status_code)).inc()
        return response

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "cuvil"}]}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)

    async def body_of(request):
        raw = await read_body(request, max_body_bytes)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise BadRequest(f"the body is not JSON ({type(e).__name__})") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        model = body.get("model", name)
        if model != name:
            raise BadRequest(f"no model {str(model)[:80]!r} here (this server has {name!r})", param="model",
                             status=404, kind="not_found_error")
        return body

    async def read(request):
        """(body, generation settings, stream?) of a completions or chat request."""
        body = await body_of(request)
        return body, parse_sampling(body), _field(body, "stream", (bool,), False, "true or false")

    def start(encode, settings, loop, events):
        """(sequence, ids): encode(llm) -> the prompt's ids, submitted to the live LLM; its batcher's
        thread hands each event to this request's loop (and counts the tokens as the sequence ends,
        cancelled or not)."""
        held = []

        def on_event(item):
            if item is DONE:
                tokens.inc(len(held[0].out.tokens))
            loop.call_soon_threadsafe(events.put_nowait, item)
        try:
            seq, ids = live.submit(encode, on_event=on_event, **settings)
        except BadRequest:
            raise
        except (CuvilError, ValueError, TypeError) as e:
            raise BadRequest(str(e)) from None
        held.append(seq)
        return seq, ids

    async def generate(request, encode, settings, stream, chunk, final, whole):
        """The answer: whole(text, finish_reason, usage) as one JSON body, or SSE events of chunk(piece)
        and final(finish_reason, usage)."""
        t0 = time.perf_counter()
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        seq, ids = start(encode, settings, loop, events)
        prompt_tokens.inc(len(ids))
        first = [None]

        async def pieces():
            try:
                while True:
                    try:
                        item = await asyncio.wait_for(events.get(), 0.5)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            seq.cancel()
                            return
                        continue
                    if item is DONE:
                        break
                    if first[0] is None:
                        first[0] = time.perf_counter()
                        ttft.observe(first[0] - t0)
                    yield item
                if seq.error is not None:
                    raise seq.error
            finally:                         # an abandoned stream (client gone) frees its slot
                seq.cancel()
                latency.observe(time.perf_counter() - t0)

        def usage():
            n = len(seq.out.tokens)
            return {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}

        if stream:
            async def sse():
                try:
                    async for piece in pieces():
                        yield f"data: {json.dumps(chunk(piece))}\n\n"
                except Exception as e:  # noqa: BLE001 - the headers are sent: the error is the last event
                    yield f"data: {json.dumps({'error': {'message': str(e), 'type': 'server_error'}})}\n\n"
                    return
                yield f"data: {json.dumps(final(seq.out.finish_reason, usage()))}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(sse(), media_type="text/event-stream")
        text = "".join([p async for p in pieces()])
        return whole(text, seq.out.finish_reason, usage())

    def envelope(kind):
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": name}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body, settings, stream = await read(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]             # a batch of one
        if isinstance(prompt, str) and prompt:
            def encode(llm):
                return llm.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in prompt):
            def encode(llm):
                return prompt
        else:
            raise BadRequest("prompt must be a non-empty string or list of token ids (one prompt per request)",
                             param="prompt")
        head = envelope("text_completion")

        def choice(text, reason, **extra):
            return dict(head, choices=[{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}], **extra)
        return await generate(request, encode, settings, stream, lambda piece: choice(piece, None),
                              lambda reason, usage: choice("", reason, usage=usage),
                              lambda text, reason, usage: choice(text, reason, usage=usage))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body, settings, stream = await read(request)
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            raise BadRequest("messages must be a non-empty list of {role, content} with string values",
                             param="messages")
        def encode(llm):
            try:
                return llm._encode([{"role": m["role"], "content": m["content"]} for m in messages], chat=True)
            except Exception as e:  # noqa: BLE001 - the checkpoint's own template may raise anything
                raise BadRequest(f"the chat template cannot render these messages ({type(e).__name__}: {e})",
                                 param="messages") from None
        head = envelope("chat.completion.chunk" if stream else "chat.completion")
        said = [False]

        def chunk(piece):
            delta = {"content": piece} if said[0] else {"role": "assistant", "content": piece}
            said[0] = True
            return dict(head, choices=[{"index": 0, "delta": delta, "finish_reason": None}])
        return await generate(
            request, encode, settings, stream, chunk,
            lambda reason, usage: dict(head, choices=[{"index": 0, "delta": {}, "finish_reason": reason}], usage=usage),
            lambda text, reason, usage: dict(head, choices=[{"index": 0, "finish_reason": reason, "message": {
                "role": "assistant", "content": text}}], usage=usage))

    return app
