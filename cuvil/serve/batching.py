"""AsyncInferenceSession: concurrent `await sess.run(inputs)` calls stacked along the artifact's dynamic
batch dim, run once (the compiled code releases the GIL) and split back. Needs numpy and the runtime."""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import CuvilError, ShapeError
from ..runtime.module import Module

# requests whose timings stats() reads (the latest ones)
STATS_WINDOW = 10000


def batch_symbol(module: Module):
    """The dynamic dim every input and output leads with and that appears nowhere else (so outputs
    split back along it): its name and upper bound, or (None, 1) where the artifact has none."""
    symbols = module.manifest.get("symbols") or {}
    shapes = [i["shape"] for i in module.inputs] + [o["shape"] for o in module.outputs]
    for name, (_, hi) in symbols.items():
        if shapes and all(s and s[0] == name for s in shapes) and \
                not any(name in str(d) for s in shapes for d in s[1:]):
            return name, int(hi)
    return None, 1


@dataclass
class _Request:
    inputs: list
    rows: int
    key: tuple                    # what must agree for requests to share a run: the non-batch dims
    future: asyncio.Future
    queued: float = field(default_factory=time.perf_counter)


class AsyncInferenceSession:
    """`await sess.run(inputs)` from any number of coroutines of one event loop.

    inputs: a list/tuple of arrays (the model's input order), a dict {name: array}, or one array for
    a one-input model; returns the list of output arrays. Requests that arrive within `max_wait_ms`
    of the first waiting one are stacked along the artifact's dynamic batch dim (up to `max_batch`
    rows and the compiled bound), run once and split back. An artifact without a dynamic batch dim
    (leading every input and output) runs its requests one at a time. A request that fails (bad
    shape, dtype, a run-time error) fails alone: each request is checked before it is queued, and a
    batch that fails is rerun request by request. Runs go one after another on one worker thread,
    each using the artifact's own threads."""

    def __init__(self, artifact, *, max_batch: int = 8, max_wait_ms: float = 2.0, num_threads=None):
        for name, v, lo in (("max_batch", max_batch, 1), ("max_wait_ms", max_wait_ms, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v < float("inf")) or \
                    (name == "max_batch" and not isinstance(v, int)):
                raise ValueError(f"option {name}={v!r} must be a {'positive int' if lo else 'number >= 0'}")
        self._max_batch_asked = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self._num_threads = num_threads
        self._set_module(artifact if isinstance(artifact, Module) else Module(artifact, num_threads=num_threads))
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cuvil-batch")
        self._lock = threading.Lock()
        self._timings = collections.deque(maxlen=STATS_WINDOW)    # (queued, started, finished)
        self._batches = collections.Counter()
        self._errors = 0
        self._started = time.perf_counter()
        self.batch_observers = []          # callables(rows) told of every run (metrics)

    def _set_module(self, module: Module):
        name, bound = batch_symbol(module)
        self.module, self.batch_dim = module, name
        self.max_batch = min(self._max_batch_asked, bound) if name else 1

    # ---- the public face -------------------------------------------------------------------
    @property
    def input_names(self):
        return [i["name"] for i in self.module.inputs]

    async def run(self, inputs) -> list:
        arrays = self._arrays(inputs)
        rows, key = self._check(arrays)
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._work())
        req = _Request(arrays, rows, key, loop.create_future())
        await self._queue.put(req)
        return await req.future

    def queue_depth(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def reload(self, artifact):
        """Swap in another artifact (a path or a Module): batches already running finish on the old
        one, every later batch runs on the new one; nothing queued is dropped."""
        module = artifact if isinstance(artifact, Module) else Module(artifact, num_threads=self._num_threads)
        with self._lock:
            self._set_module(module)

    def stats(self) -> dict:
        """QPS over the requests in the window, the batch-size histogram (rows per run; a request counts
        as one row where the artifact has no batch dim), and queue
        (waiting), run and total latency percentiles in milliseconds."""
        with self._lock:
            t = np.array(self._timings, np.float64).reshape(-1, 3)
            batches, errors = dict(sorted(self._batches.items())), self._errors
        out = {"requests": len(t), "errors": errors, "batch_sizes": batches, "max_batch": self.max_batch,
               "queue_depth": self.queue_depth()}
        if len(t):
            span = max(t[:, 2].max() - t[:, 0].min(), 1e-9)
            out["qps"] = len(t) / span
            for name, v in (("queue_ms", t[:, 1] - t[:, 0]), ("run_ms", t[:, 2] - t[:, 1]),
                            ("total_ms", t[:, 2] - t[:, 0])):
                p = np.percentile(v * 1e3, [50, 90, 99])
                out[name] = {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}
        return out

    async def close(self):
        if self._worker is not None and not self._worker.done():
            await self._queue.put(None)
            await self._worker
        self._executor.shutdown(wait=True)

    # ---- checking a request alone ------------------------------------------------------------
    def _arrays(self, inputs):
        specs = self.module.inputs
        if isinstance(inputs, dict):
            unknown = sorted(set(inputs) - {s["name"] for s in specs})
            missing = [s["name"] for s in specs if s["name"] not in inputs]
            if unknown or missing:
                raise ShapeError(f"inputs: expected {[s['name'] for s in specs]}; missing {missing}, unknown {unknown}")
            inputs = [inputs[s["name"]] for s in specs]
        elif not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        if len(inputs) != len(specs):
            raise ShapeError(f"expected {len(specs)} inputs ({', '.join(s['name'] for s in specs)}), got {len(inputs)}")
        arrays = []
        for spec, a in zip(specs, inputs):
            a = np.asarray(a)
            if a.dtype != np.dtype(spec["dtype"]):
                raise ShapeError(f"input {spec['name']!r}: expected dtype {spec['dtype']}, got {a.dtype}")
            arrays.append(np.ascontiguousarray(a))
        return arrays

    def _check(self, arrays):
        """The request's rows along the batch dim and its stacking key; its shapes checked as a run
        of it alone would check them (so a bad one fails here, alone)."""
        self.module.check_inputs(arrays)
        if self.batch_dim is None:
            return 1, ("alone", id(arrays))
        rows = arrays[0].shape[0] if arrays else 1
        if rows > self.max_batch:        # larger than a batch: it runs by itself
            return rows, ("alone", id(arrays))
        return rows, tuple(a.shape[1:] for a in arrays)

    # ---- the worker --------------------------------------------------------------------------
    async def _work(self):
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            if first is None:
                return
            waiting, rows = [first], first.rows
            deadline = loop.time() + self.max_wait
            while rows < self.max_batch and (timeout := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(self._queue.get(), timeout)
                except asyncio.TimeoutError:
                    break
                if item is None:
                    await self._queue.put(None)      # stop after these
                    break
                waiting.append(item)
                if item.key == first.key:
                    rows += item.rows
            for group in self._groups(waiting):
                live = [r for r in group if not r.future.done()]     # a cancelled caller is not run
                if not live:
                    continue
                results = await loop.run_in_executor(self._executor, self._run_group, live)
                for r, res in zip(live, results):
                    if r.future.done():
                        continue
                    if isinstance(res, BaseException):
                        r.future.set_exception(res)
                    else:
                        r.future.set_result(res)

    def _groups(self, waiting):
        """Requests of one key, in arrival order, cut into runs of at most max_batch rows."""
        by_key = {}
        for r in waiting:
            by_key.setdefault(r.key, []).append(r)
        for group in by_key.values():
            run, rows = [], 0
            for r in group:
                if run and rows + r.rows > self.max_batch:
                    yield run
                    run, rows = [], 0
                run.append(r)
                rows += r.rows
            yield run

    def _run_group(self, group):
        """On the worker thread: one run of the stacked group, split back; a failing batch is rerun
        request by request so the error reaches only the request that caused it."""
        module = self.module
        started = time.perf_counter()
        try:
            if len(group) == 1:
                results = [module.run(*group[0].inputs)]
            else:
                outs = module.run(*[np.concatenate(parts) for parts in zip(*(r.inputs for r in group))])
                cuts = np.cumsum([r.rows for r in group])[:-1]
                results = [list(parts) for parts in zip(*(np.split(o, cuts) for o in outs))]
            self._record(group, started, 0)
            return results
        except (CuvilError, ValueError) as e:
            if len(group) == 1:
                self._record(group, started, 1)
                return [e]
        return [self._run_group([r])[0] for r in group]

    def _record(self, group, started, errors):
        finished, rows = time.perf_counter(), sum(r.rows for r in group)
        with self._lock:
            self._batches[rows] += 1
            self._errors += errors
            self._timings.extend((r.queued, started, finished) for r in group)
        for observe in self.batch_observers:
            observe(rows)

