"""`cuvil serve`: an artifact behind the KServe / Triton v2 HTTP protocol (FastAPI on uvicorn), through
an AsyncInferenceSession, with Prometheus metrics. Needs the `serve` extra (fastapi, uvicorn,
prometheus_client).

    GET  /v2/health/live, /v2/health/ready, /v2, /v2/models/{name}, /v2/models/{name}/ready
    POST /v2/models/{name}/infer      JSON tensors; or a .npy body (Content-Type application/x-npy)
                                      for a one-input model, answered as .npy with Accept:
                                      application/x-npy (?output=NAME picks the output)
    GET  /metrics

Every failure is a JSON body {"error": "..."}: 400 for a request the model cannot take, 404 for
an unknown model or path, 413 for a body over the limit; never a traceback."""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ..errors import CuvilError
from . import v2
from .batching import AsyncInferenceSession
from .metrics import Metrics
from .watch import watch
from .wire import NAME_RE, model_name_of, read_body

NPY = "application/x-npy"
MAX_BODY_BYTES = 512 << 20


def _endpoint(path) -> str:
    """A request's metrics label: infer, ready, live, v2 (server metadata) or metadata (anything else)."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return last if last in ("infer", "ready", "live", "v2") else "metadata"


def create_app(artifact, *, name=None, max_batch=8, max_wait_ms=2.0, num_threads=None,
               max_body_bytes=MAX_BODY_BYTES, session=None, watch_seconds=0.0):
    name = name or model_name_of(artifact)
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"model name {name!r} must match {NAME_RE.pattern}")
    sess = session or AsyncInferenceSession(artifact, max_batch=max_batch, max_wait_ms=max_wait_ms,
                                            num_threads=num_threads)
    metrics = Metrics(name, sess.queue_depth)
    sess.batch_observers.append(metrics.observe_batch)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        watcher = asyncio.get_running_loop().create_task(watch(sess, artifact, watch_seconds)) \
            if watch_seconds else None
        yield
        if watcher is not None:
            watcher.cancel()
        await sess.close()
    app = FastAPI(title="cuvil", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.session = sess

    def error(status, message):
        return JSONResponse({"error": message}, status_code=status)

    def check_name(model):
        if model != name:
            raise v2.ProtocolError(f"no model {model[:80]!r} here (this server has {name!r})", status=404)

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(v2.ProtocolError)
    async def _protocol_error(request, exc):
        return error(exc.status, str(exc))

    @app.exception_handler(CuvilError)
    async def _model_error(request, exc):      # a shape, dtype or run-time check of the artifact's
        return error(400, str(exc))

    @app.exception_handler(Exception)
    async def _internal(request, exc):      # no traceback reaches the client
        return error(500, f"internal error ({type(exc).__name__})")

    @app.middleware("http")
    async def _count(request: Request, call_next):
        t0 = time.perf_counter()
        response = await call_next(request)
        if request.url.path != "/metrics":
            metrics.answered(_endpoint(request.url.path), response.status_code, time.perf_counter() - t0)
        return response

    @app.get("/v2/health/live")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready():
        return {"ready": True}

    @app.get("/v2")
    async def server_metadata():
        from ..version import __version__
        return {"name": "cuvil", "version": __version__, "extensions": []}

    @app.get("/v2/models/{model}")
    async def metadata(model: str):
        check_name(model)
        return v2.model_metadata(name, sess.module)

    @app.get("/v2/models/{model}/ready")
    async def model_ready(model: str):
        check_name(model)
        return {"name": name, "ready": True}

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request):
        check_name(model)
        body = await read_body(request, max_body_bytes)
        module = sess.module
        if request.headers.get("content-type", "").split(";")[0].strip() == NPY:
            rid, inputs, asked = None, v2.decode_npy(body, module), None
        else:
            rid, inputs, asked = v2.decode_request(body, module)
        outputs = await sess.run(inputs)
        if NPY in request.headers.get("accept", ""):
            out_names = [o["name"] for o in module.outputs]
            pick = request.query_params.get("output", out_names[0])
            if pick not in out_names:
                raise v2.ProtocolError(f"unknown output {pick[:80]!r}; the model gives {out_names}")
            return Response(v2.encode_npy(outputs[out_names.index(pick)]), media_type=NPY)
        return v2.encode_response(name, rid, module, outputs, asked)

    @app.get("/metrics")
    async def prometheus():
        data, kind = metrics.exposition()
        return Response(data, media_type=kind)

    return app


def app_for(artifact, *, name=None, max_batch=8, max_wait_ms=2.0, num_threads=None, prefill_chunk=64,
            pace_prefill=False, mix_rows=0, watch_seconds=0.0):
    """The app an artifact gets: an LLM artifact (llm.json) the OpenAI APIs, any other KServe v2."""
    if (Path(artifact) / "llm.json").exists():
        from .openai import create_llm_app
        return create_llm_app(artifact, name=name, prefill_chunk=prefill_chunk, pace_prefill=pace_prefill,
                              mix_rows=mix_rows, num_threads=num_threads, watch_seconds=watch_seconds)
    return create_app(artifact, name=name, max_batch=max_batch, max_wait_ms=max_wait_ms, num_threads=num_threads,
                      watch_seconds=watch_seconds)


SETTINGS_ENV = "CUVIL_SERVE_SETTINGS"


def app_from_env():
    """uvicorn's factory for `cuvil serve --workers N` (each worker process builds its own app)."""
    import json
    return app_for(**json.loads(os.environ[SETTINGS_ENV]))


def serve(artifact, *, host="127.0.0.1", port=8000, workers=1, log_level="info", **settings):
    import uvicorn
    if workers > 1:
        import json
        os.environ[SETTINGS_ENV] = json.dumps(dict(settings, artifact=str(artifact)))
        uvicorn.run("cuvil.serve.http:app_from_env", factory=True, host=host, port=port, workers=workers,
                    log_level=log_level)
        return
    uvicorn.run(app_for(artifact, **settings), host=host, port=port, log_level=log_level)


__all__ = ["create_app", "app_for", "serve", "model_name_of"]
