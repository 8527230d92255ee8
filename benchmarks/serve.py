"""Serving under concurrent load: MiniLM (real weights) batch-1 requests from N concurrent clients.

    python -m benchmarks.serve [--clients 32] [--requests 384] [--rounds 3] [--threads 2]

Systems, each sent the same requests, in rounds (every system once per round; medians reported):
- cuvil pool:  the artifact's run() called from a thread pool of N threads, one request per call
- cuvil async: cuvil.AsyncInferenceSession (requests stacked along the batch dim), N coroutines
- cuvil http:  `cuvil serve` (KServe v2 JSON) in its own process, N async httpx clients
- ort pool:    ONNX Runtime's session.run from a thread pool of N threads
- ort http:    ONNX Runtime behind the same FastAPI/uvicorn shape (v2 JSON, run in the thread pool),
               in its own process, the same clients
Servers listen on 127.0.0.1 only; clients, counts and durations are bounded."""

import argparse
import asyncio
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from .timing import machine_line


def _sentences(n):
    return [f"request {i}: an ahead-of-time compiler batches concurrent sentences" for i in range(n)]


def build(threads, workdir):
    """(cuvil artifact path with a dynamic batch dim, ONNX path at batch 1, per-request feeds)."""
    import torch
    import transformers as T

    import cuvil
    from tests.models import minilm_path

    from .systems import export_onnx
    path = minilm_path()
    model = T.AutoModel.from_pretrained(path).eval()
    tok = T.AutoTokenizer.from_pretrained(path)
    enc = tok(_sentences(64), padding="max_length", max_length=128, truncation=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    batch = torch.export.Dim("batch", min=1, max=64)
    cm = cuvil.compile(model, (ids[:2], mask[:2]), dynamic_shapes=({0: batch}, {0: batch}), num_threads=threads)
    art = os.path.join(workdir, "minilm.cuvil")
    cm.save(art)
    onnx_path, _ = export_onnx(model, (ids[:1], mask[:1]))
    feeds = [(ids[i:i + 1].numpy(), mask[i:i + 1].numpy()) for i in range(64)]
    return art, onnx_path, feeds


def _summary(latencies, seconds):
    lat = np.array(latencies) * 1e3
    return {"qps": len(lat) / seconds, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))}


def _pool(run, feeds, clients, requests):
    lat = []

    def one(i):
        t = time.perf_counter()
        run(*feeds[i % len(feeds)])
        lat.append(time.perf_counter() - t)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        list(ex.map(one, range(requests)))
    return _summary(lat, time.perf_counter() - t0)


async def _clients(call, feeds, clients, requests):
    lat, next_i = [], iter(range(requests))

    async def client():
        for i in next_i:
            t = time.perf_counter()
            await call(feeds[i % len(feeds)])
            lat.append(time.perf_counter() - t)
    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return _summary(lat, time.perf_counter() - t0)


def _async_session(art, feeds, clients, requests, threads):
    import cuvil

    async def main():
        sess = cuvil.AsyncInferenceSession(art, max_batch=clients, max_wait_ms=2, num_threads=threads)
        out = await _clients(lambda f: sess.run(list(f)), feeds, clients, requests)
        await sess.close()
        return out
    return asyncio.run(main())


def _v2_body(feed, output):
    """A v2 request asking for the pooled sentence embedding only (as a client of an embedding model
    would: the [1, 128, 384] token states cost more to write as JSON than to compute)."""
    return {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
                       for n, a in zip(("input_ids", "attention_mask"), feed)], "outputs": [{"name": output}]}


def _http(url, model, output, feeds, clients, requests):
    import httpx
    bodies = [_v2_body(f, output) for f in feeds]

    async def main():
        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
            async def call(body):
                r = await c.post(f"/v2/models/{model}/infer", json=body)
                r.raise_for_status()
            return await _clients(call, bodies, clients, requests)
    return asyncio.run(main())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd, port, ready="/v2/health/ready"):
    """cmd as a server process, once GET ready on 127.0.0.1:port answers 200 (within 2 minutes)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{cmd} did not come up") from None
            time.sleep(0.2)


def ort_app(onnx_path, threads):
    """ONNX Runtime behind the v2 endpoint shape cuvil serves (FastAPI, its thread pool)."""
    import onnxruntime as ort
    from fastapi import FastAPI, Request
    from starlette.concurrency import run_in_threadpool

    from cuvil.serve import v2
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    spec = type("Spec", (), {"inputs": [{"name": n, "dtype": "int64", "shape": [1, 128]}
                                        for n in ("input_ids", "attention_mask")],
                             "outputs": [{"name": o.name} for o in sess.get_outputs()]})()
    names = [i.name for i in sess.get_inputs()]
    app = FastAPI()

    @app.get("/v2/health/ready")
    async def ready():
        return {"ready": True}

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request):
        _, arrays, asked = v2.decode_request(await request.body(), spec)
        outs = await run_in_threadpool(sess.run, asked, dict(zip(names, arrays.values())))
        return {"model_name": model, "outputs": [{"name": n, "datatype": "FP32", "shape": list(a.shape),
                                                  "data": a.ravel().tolist()} for n, a in zip(asked, outs)]}
    return app


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ort-server", nargs=2, metavar=("ONNX", "PORT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.ort_server:                     # the ORT server process
        import uvicorn
        uvicorn.run(ort_app(a.ort_server[0], a.threads), host="127.0.0.1", port=int(a.ort_server[1]),
                    log_level="warning")
        return
    import onnxruntime as ort

    import cuvil
    work = tempfile.mkdtemp(prefix="cuvil-bench-serve-")
    art, onnx_path, feeds = build(a.threads, work)
    module = cuvil.load(art, num_threads=a.threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = a.threads, 1
    osess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    onames = [i.name for i in osess.get_inputs()]
    cport, oport = free_port(), free_port()
    servers = [start_server([sys.executable, "-m", "cuvil", "serve", art, "--port", str(cport), "--name", "minilm",
                       "--max-batch", str(a.clients), "--num-threads", str(a.threads)], cport),
               start_server([sys.executable, "-m", "benchmarks.serve", "--threads", str(a.threads), "--ort-server",
                       onnx_path, str(oport)], oport)]
    n, c = a.requests, a.clients
    systems = {
        "cuvil pool": lambda: _pool(module.run, feeds, c, n),
        "cuvil async": lambda: _async_session(art, feeds, c, n, a.threads),
        "cuvil http": lambda: _http(f"http://127.0.0.1:{cport}", "minilm", module.outputs[-1]["name"], feeds, c, n),
        "ort pool": lambda: _pool(lambda i, m: osess.run(None, {onames[0]: i, onames[1]: m}), feeds, c, n),
        "ort http": lambda: _http(f"http://127.0.0.1:{oport}", "minilm", osess.get_outputs()[-1].name, feeds, c, n),
    }
    try:
        results = {k: [] for k in systems}
        for _ in range(a.rounds):
            for name, fn in systems.items():
                time.sleep(0.5)
                results[name].append(fn())
    finally:
        for p in servers:
            p.terminate()
            p.wait(timeout=30)
    base = statistics.median(r["qps"] for r in results["cuvil pool"])
    print(f"machine: {machine_line()}")
    print(f"MiniLM b1 s128 requests, {c} concurrent clients, {n} requests per system per round, "
          f"{a.rounds} rounds, {a.threads} threads per runtime (medians)")
    print("| system | QPS | vs cuvil pool | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for name, rs in results.items():
        qps = statistics.median(r["qps"] for r in rs)
        print(f"| {name} | {qps:.1f} | {qps / base:.2f}x | {statistics.median(r['p50'] for r in rs):.1f} | "
              f"{statistics.median(r['p99'] for r in rs):.1f} |")


if __name__ == "__main__":
    main()
