"""What both HTTP servers (KServe v2 and OpenAI) need of a request: the model name as a safe URL path
segment, and a body read under a size limit."""
from __future__ import annotations

import re
from pathlib import Path

from .v2 import ProtocolError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def model_name_of(path) -> str:
    """The artifact folder's name as a URL path segment (characters outside [A-Za-z0-9._-] dropped)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "", Path(path).name.removesuffix(".cuvil"))[:64].lstrip("._-")
    return name or "model"


async def read_body(request, limit):
    """The body, refused with 413 as soon as it passes `limit` bytes (not after reading it all)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(f"body of {declared} bytes is over the limit of {limit}", status=413)
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(f"body is over the limit of {limit} bytes", status=413)
        parts.append(chunk)
    return b"".join(parts)
