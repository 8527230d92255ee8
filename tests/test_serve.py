"""Serving: AsyncInferenceSession's batching against unbatched runs (the oracle: the same artifact
run request by request, and torch eager), and the KServe v2 server as a real uvicorn on loopback
with a real HTTP client."""
import asyncio
import contextlib
import io
import shutil
import socket
import threading
import time

import numpy as np
import pytest
import torch

import cuvil
from cuvil.serve import v2

httpx = pytest.importorskip("httpx", reason="the tests' HTTP client (a dev requirement)")
uvicorn = pytest.importorskip("uvicorn", reason="the server runs on uvicorn (the serve extra)")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x, scale):
        return self.b(torch.relu(self.a(x))) * scale, x.sum(-1)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    torch.manual_seed(0)
    model = Net().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    x, s = torch.randn(2, 16), torch.rand(2, 1)
    cm = cuvil.compile(model, (x, s), dynamic_shapes=({0: batch}, {0: batch}))
    path = tmp_path_factory.mktemp("serve") / "net.cuvil"
    cm.save(path)
    return path, model


def _eager(model, x, s):
    with torch.no_grad():
        return [t.numpy() for t in model(torch.from_numpy(x), torch.from_numpy(s))]


def _request(rng, rows):
    return [rng.standard_normal((rows, 16)).astype(np.float32), rng.random((rows, 1)).astype(np.float32)]


# ---- AsyncInferenceSession -------------------------------------------------------------------
def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(artifact):
    path, model = artifact
    rng = np.random.default_rng(0)
    reqs = [_request(rng, int(rng.integers(1, 4))) for _ in range(40)]

    async def main():
        sess = cuvil.AsyncInferenceSession(path, max_batch=8, max_wait_ms=20)

        async def one(i, req):
            await asyncio.sleep((i % 7) * 0.002)         # ragged arrival
            return await sess.run(req)
        outs = await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
        stats = sess.stats()
        await sess.close()
        return outs, stats
    outs, stats = asyncio.run(main())
    for req, got in zip(reqs, outs):
        for g, e in zip(got, _eager(model, *req)):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert stats["requests"] == 40 and stats["errors"] == 0
    assert max(stats["batch_sizes"]) > 3, f"requests were not stacked: {stats['batch_sizes']}"
    assert max(stats["batch_sizes"]) <= 8
    assert sum(rows * n for rows, n in stats["batch_sizes"].items()) == sum(r[0].shape[0] for r in reqs)
    assert stats["qps"] > 0 and stats["total_ms"]["p99"] >= stats["run_ms"]["p50"] >= 0


def test_an_error_reaches_only_the_request_that_caused_it(artifact):
    path, model = artifact
    rng = np.random.default_rng(1)
    good = [_request(rng, 2) for _ in range(6)]
    bad = {"wrong dtype": [good[0][0].astype(np.float64), good[0][1]],
           "wrong feature dim": [rng.standard_normal((2, 15)).astype(np.float32), good[0][1]],
           "batch dims disagree": [good[0][0], rng.random((3, 1)).astype(np.float32)],
           "over the compiled bound": _request(rng, 17),
           "unknown input": {"x": good[0][0], "nope": good[0][1]},
           "missing input": [good[0][0]]}

    async def main():
        sess = cuvil.AsyncInferenceSession(path, max_batch=16, max_wait_ms=30)
        calls = [sess.run(r) for r in good] + [sess.run(b) for b in bad.values()]
        res = await asyncio.gather(*calls, return_exceptions=True)
        await sess.close()
        return res
    res = asyncio.run(main())
    for req, got in zip(good, res[:len(good)]):
        assert not isinstance(got, BaseException), got
        np.testing.assert_allclose(got[0], _eager(model, *req)[0], rtol=1e-5, atol=1e-5)
    for what, got in zip(bad, res[len(good):]):
        assert isinstance(got, cuvil.ShapeError), f"{what}: {got!r}"


def test_a_run_time_failure_in_a_batch_is_retried_alone(artifact, monkeypatch):
    """A batch whose run fails is rerun request by request: only the failing request sees the error."""
    path, model = artifact
    rng = np.random.default_rng(2)
    reqs = [_request(rng, 1) for _ in range(5)]
    poison = reqs[2][0]

    async def main():
        sess = cuvil.AsyncInferenceSession(path, max_batch=8, max_wait_ms=30)
        real = sess.module.run

        def run(*arrays, out=None):
            if any(np.array_equal(poison[0], row) for row in arrays[0]):
                raise cuvil.ShapeError("planted run-time failure")
            return real(*arrays)
        monkeypatch.setattr(sess.module, "run", run)
        res = await asyncio.gather(*(sess.run(r) for r in reqs), return_exceptions=True)
        stats = sess.stats()
        await sess.close()
        return res, stats
    res, stats = asyncio.run(main())
    assert isinstance(res[2], cuvil.ShapeError)
    for i in (0, 1, 3, 4):
        np.testing.assert_allclose(res[i][0], _eager(model, *reqs[i])[0], rtol=1e-5, atol=1e-5)
    assert stats["errors"] == 1


def test_reload_swaps_the_artifact_without_dropping_requests(artifact, tmp_path):
    path, model = artifact
    torch.manual_seed(5)
    other = Net().eval()
    x, s = torch.randn(2, 16), torch.rand(2, 1)
    batch = torch.export.Dim("batch", min=1, max=16)
    cuvil.compile(other, (x, s), dynamic_shapes=({0: batch}, {0: batch})).save(tmp_path / "v2.cuvil")
    rng = np.random.default_rng(3)
    reqs = [_request(rng, 1) for _ in range(60)]

    async def main():
        sess = cuvil.AsyncInferenceSession(path, max_batch=4, max_wait_ms=1)
        reloaded = asyncio.Event()

        async def client(i):
            # the first half arrives around the reload; the second half after it (on a loaded host the
            # reload could otherwise finish after every request had run, and none would reach v2)
            if i >= 30:
                await reloaded.wait()
            await asyncio.sleep(i % 30 * 0.001)
            return await sess.run(reqs[i])
        tasks = [asyncio.ensure_future(client(i)) for i in range(60)]
        await asyncio.sleep(0.02)
        await asyncio.get_running_loop().run_in_executor(None, sess.reload, tmp_path / "v2.cuvil")
        reloaded.set()
        res = await asyncio.gather(*tasks)
        await sess.close()
        return res
    res = asyncio.run(main())
    old = new = 0
    for req, got in zip(reqs, res):
        e_old, e_new = _eager(model, *req)[0], _eager(other, *req)[0]
        if np.allclose(got[0], e_old, rtol=1e-5, atol=1e-5):
            old += 1
        else:
            np.testing.assert_allclose(got[0], e_new, rtol=1e-5, atol=1e-5)
            new += 1
    assert old + new == 60 and new > 0


def test_artifact_without_a_batch_dim_runs_requests_one_by_one(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 3).eval()
    cuvil.compile(m, (torch.randn(2, 8),)).save(tmp_path / "static.cuvil")
    xs = [np.random.default_rng(i).standard_normal((2, 8)).astype(np.float32) for i in range(6)]

    async def main():
        sess = cuvil.AsyncInferenceSession(tmp_path / "static.cuvil", max_batch=8)
        assert sess.batch_dim is None and sess.max_batch == 1
        res = await asyncio.gather(*(sess.run(x) for x in xs))
        stats = sess.stats()
        await sess.close()
        return res, stats
    res, stats = asyncio.run(main())
    for x, got in zip(xs, res):
        np.testing.assert_allclose(got[0], m(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert stats["batch_sizes"] == {1: 6}        # one request per run, never stacked


@pytest.mark.parametrize("kw", [{"max_batch": 0}, {"max_batch": 2.5}, {"max_batch": True}, {"max_wait_ms": -1},
                                {"max_wait_ms": float("nan")}, {"max_wait_ms": "2"}])
def test_bad_session_options(artifact, kw):
    with pytest.raises(ValueError, match="option max_"):
        cuvil.AsyncInferenceSession(artifact[0], **kw)


# ---- the v2 HTTP server ----------------------------------------------------------------------
@contextlib.contextmanager
def _server(app):
    """uvicorn on 127.0.0.1 at a free port, in a thread; stopped (and joined) on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and t.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(timeout=20)
        assert not t.is_alive()


def _v2_body(req, rid=None):
    body = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}
                       for n, a in zip(("x", "scale"), req)]}
    if rid:
        body["id"] = rid
    return body


def test_v2_server_answers_concurrent_clients(artifact):
    from cuvil.serve.http import create_app
    path, model = artifact
    rng = np.random.default_rng(4)
    reqs = [_request(rng, int(rng.integers(1, 3))) for _ in range(24)]
    with _server(create_app(path, name="net", max_batch=8, max_wait_ms=10)) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.get("/v2/health/ready").json() == {"ready": True}
            assert c.get("/v2/health/live").status_code == 200
            meta = c.get("/v2/models/net").json()
            assert [i["name"] for i in meta["inputs"]] == ["x", "scale"]
            assert meta["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 16]}
            assert c.get("/v2/models/net/ready").json()["ready"] is True

        async def clients():
            async with httpx.AsyncClient(base_url=url, timeout=30) as ac:
                return await asyncio.gather(*(ac.post("/v2/models/net/infer", json=_v2_body(r, f"r{i}"))
                                              for i, r in enumerate(reqs)))
        answers = asyncio.run(clients())
        for i, (req, a) in enumerate(zip(reqs, answers)):
            assert a.status_code == 200, a.text
            body = a.json()
            assert body["id"] == f"r{i}" and body["model_name"] == "net"
            expected = _eager(model, *req)
            for out, e in zip(body["outputs"], expected):
                assert out["shape"] == list(e.shape) and out["datatype"] == "FP32"
                np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]), e,
                                           rtol=1e-5, atol=1e-5)
        with httpx.Client(base_url=url, timeout=30) as c:
            only = c.post("/v2/models/net/infer", json={**_v2_body(reqs[0]), "outputs": [{"name": "output1"}]})
            metrics = c.get("/metrics").text
    assert only.status_code == 200 and [o["name"] for o in only.json()["outputs"]] == ["output1"]
    assert 'cuvil_requests_total{code="200",endpoint="infer",model="net"} 25.0' in metrics
    assert "cuvil_batch_rows_bucket" in metrics and "cuvil_queue_depth" in metrics


def test_v2_server_npy_bodies(tmp_path):
    from cuvil.serve.http import NPY, create_app
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Tanh()).eval()
    batch = torch.export.Dim("batch", min=1, max=4)
    cuvil.compile(m, (torch.randn(2, 8),), dynamic_shapes=({0: batch},)).save(tmp_path / "one.cuvil")
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    with _server(create_app(tmp_path / "one.cuvil")) as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/v2/models/one/infer", content=v2.encode_npy(x), headers={"content-type": NPY, "accept": NPY})
        assert r.status_code == 200 and r.headers["content-type"] == NPY
        got = np.load(io.BytesIO(r.content), allow_pickle=False)
        np.testing.assert_allclose(got, m(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
        bad = c.post("/v2/models/one/infer", content=b"\x93NUMPY garbage", headers={"content-type": NPY})
        assert bad.status_code == 400 and "not a .npy array" in bad.json()["error"]


BAD_BODIES = [
    (b"{not json", 400, "not JSON"),
    (b"[]", 400, '"inputs" list'),
    (b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP64", "data": []}]}', 400, "expected datatype FP32"),
    (b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1, 2]}]}', 400, "holds 16 elements"),
    (b'{"inputs": [{"name": "zz", "shape": [1], "datatype": "FP32", "data": [1]}]}', 400, "unknown input"),
    (b'{"inputs": [{"name": "x", "shape": [-1, 16], "datatype": "FP32", "data": []}]}', 400, "shape must be"),
    (b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": ["a"]}]}', 400, "must be numbers"),
]


def test_v2_server_bad_requests_are_json_4xx(artifact):
    from cuvil.serve.http import create_app
    path, _ = artifact
    with _server(create_app(path, name="net", max_body_bytes=4096)) as url, \
            httpx.Client(base_url=url, timeout=30) as c:
        for body, status, text in BAD_BODIES:
            r = c.post("/v2/models/net/infer", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status and text in r.json()["error"], (body, r.text)
        wrong_rows = _v2_body(_request(np.random.default_rng(0), 2))
        wrong_rows["inputs"][1]["shape"], wrong_rows["inputs"][1]["data"] = [3, 1], [0.5, 0.5, 0.5]
        r = c.post("/v2/models/net/infer", json=wrong_rows)
        assert r.status_code == 400 and "batch" in r.json()["error"]
        r = c.post("/v2/models/other/infer", json=_v2_body(_request(np.random.default_rng(0), 1)))
        assert r.status_code == 404 and "no model" in r.json()["error"]
        r = c.post("/v2/models/net/infer", content=b"x" * 5000)
        assert r.status_code == 413 and "limit" in r.json()["error"]
        assert c.get("/nowhere").status_code == 404 and "error" in c.get("/nowhere").json()
        assert "Traceback" not in r.text


def test_v2_bodies_fuzzed_give_arrays_or_protocol_errors(artifact):
    """Any body: a ProtocolError naming the fault, or arrays of exactly the inputs' dtypes with the
    shapes the body declared (never another exception, never an array the model was not declared for)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    module = cuvil.load(artifact[0])
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=4))
    json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                               st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                               max_leaves=30)
    tensor = st.fixed_dictionaries({"name": st.sampled_from(["x", "scale", "y", ""]),
                                    "shape": st.one_of(st.lists(st.integers(-2, 20), max_size=3), json_values),
                                    "datatype": st.sampled_from(["FP32", "FP64", "INT64", "BOOL", "fp32", "X"]),
                                    "data": st.one_of(st.lists(st.floats(width=32), max_size=40), json_values)})
    bodies = st.one_of(st.binary(max_size=200), json_values.map(lambda v: __import__("json").dumps(v).encode()),
                       st.lists(tensor, max_size=3).map(lambda ins: __import__("json").dumps({"inputs": ins}).encode()))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(bodies)
    def check(body):
        try:
            _, arrays, _ = v2.decode_request(body, module)
        except v2.ProtocolError:
            return
        for spec in module.inputs:
            assert arrays[spec["name"]].dtype == np.dtype(spec["dtype"])

    npy_head = v2.encode_npy(np.zeros(3))[:40]

    @settings(max_examples=200, deadline=None)
    @given(st.one_of(st.binary(max_size=300), st.binary(max_size=60).map(lambda b: npy_head + b)))
    def check_npy(body):
        one = type("M", (), {"inputs": module.inputs[:1]})()
        try:
            got = v2.decode_npy(body, one)
        except v2.ProtocolError:
            return
        assert isinstance(got["x"], np.ndarray)
    check()
    check_npy()


def test_cuvil_serve_command(artifact):
    """`cuvil serve` as a user runs it: a process on a free loopback port, answering v2 requests,
    stopped by the test; a bad model name is one error line and exit 2."""
    import subprocess
    import sys
    path, model = artifact
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "cuvil", "serve", str(path), "--port", str(port), "--name", "net", "--max-batch", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "cuvil serve did not come up"
                time.sleep(0.1)
        req = _request(np.random.default_rng(9), 3)
        r = httpx.post(f"http://127.0.0.1:{port}/v2/models/net/infer", json=_v2_body(req), timeout=30)
        out = r.json()["outputs"][0]
        np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]), _eager(model, *req)[0],
                                   rtol=1e-5, atol=1e-5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    bad = subprocess.run(cmd[:-4] + ["--name", "a/../b"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "model name" in bad.stderr, bad.stderr


def test_watch_reloads_a_saved_artifact_under_load(artifact, tmp_path):
    """An artifact saved over the served one while clients keep sending: every request is answered
    (by the old model or the new one, never an error), and the new one serves after the swap."""
    from cuvil.serve.http import create_app
    path, model = artifact
    served = tmp_path / "live.cuvil"
    shutil.copytree(path, served)
    torch.manual_seed(11)
    other = Net().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    newer = cuvil.compile(other, (torch.randn(2, 16), torch.rand(2, 1)), dynamic_shapes=({0: batch}, {0: batch}))
    rng = np.random.default_rng(12)
    req = _request(rng, 1)
    old_out, new_out = _eager(model, *req)[0], _eager(other, *req)[0]
    with _server(create_app(served, name="net", watch_seconds=0.05)) as url:
        async def load():
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                async def client(k):
                    got = []
                    for _ in range(40):
                        r = await c.post("/v2/models/net/infer", json=_v2_body(req))
                        assert r.status_code == 200, r.text
                        out = r.json()["outputs"][0]
                        got.append(np.array(out["data"], np.float32).reshape(out["shape"]))
                        await asyncio.sleep(0.005)
                    return got

                async def swap():
                    await asyncio.sleep(0.1)
                    await asyncio.get_running_loop().run_in_executor(None, newer.save, served)
                res = await asyncio.gather(*(client(k) for k in range(4)), swap())
                return [g for r in res[:4] for g in r]
        answers = asyncio.run(load())
        with httpx.Client(base_url=url, timeout=30) as c:
            last = c.post("/v2/models/net/infer", json=_v2_body(req)).json()["outputs"][0]
    assert len(answers) == 160
    for a in answers:
        assert np.allclose(a, old_out, rtol=1e-5, atol=1e-5) or np.allclose(a, new_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(last["data"], np.float32).reshape(last["shape"]), new_out, rtol=1e-5, atol=1e-5)
