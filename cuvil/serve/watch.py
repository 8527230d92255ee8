"""`cuvil serve --watch`: reload a server's model whenever an artifact is saved over the one it serves
(the KServe v2 session, serve/batching.py, and the LLM, serve/live.py, both have reload(path))."""
from __future__ import annotations

import asyncio
from pathlib import Path

from ..errors import CuvilError


def _stamp(artifact):
    """What changes when an artifact is saved over `artifact` (None while it is being replaced)."""
    try:
        st = (Path(artifact) / "manifest.json").stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


async def watch(sess, artifact, every):
    """Reload the session whenever an artifact is saved over `artifact` (`cuvil serve --watch`). A save
    that does not load (half written, broken) keeps the running one, with a warning, until the next."""
    import warnings
    loop = asyncio.get_running_loop()
    last = _stamp(artifact)
    while True:
        await asyncio.sleep(every)
        now = _stamp(artifact)
        if now is None or now == last:
            continue
        try:
            await loop.run_in_executor(None, sess.reload, artifact)
            last = now
        except (CuvilError, OSError) as e:
            warnings.warn(f"cuvil serve --watch: keeping the running artifact: {e}", RuntimeWarning, stacklevel=1)
            last = now
