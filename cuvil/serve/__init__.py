"""Serving: AsyncInferenceSession (dynamic batching; numpy only) and `cuvil serve`, the KServe v2 HTTP
server (http.py; the `serve` extra: fastapi, uvicorn, prometheus_client)."""
from .batching import AsyncInferenceSession

__all__ = ["AsyncInferenceSession"]
