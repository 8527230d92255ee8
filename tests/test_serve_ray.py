"""Ray Serve: a local Ray instance, two replicas of a cuvil artifact, concurrent requests through Serve's
HTTP proxy on loopback, answers checked against torch eager."""
import asyncio
import socket

import numpy as np
import pytest

from .test_serve import _eager, _request, _v2_body, artifact  # noqa: F401 - the module fixture

ray = pytest.importorskip("ray", reason="Ray Serve is the ray extra (a dev requirement)")
httpx = pytest.importorskip("httpx", reason="the tests' HTTP client (a dev requirement)")


def test_two_replicas_answer_through_the_serve_proxy(artifact):  # noqa: F811
    from ray import serve

    from cuvil.serve.ray import deployment
    path, model = artifact
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(path, num_replicas=2, name="net", num_threads=1,
                             ray_actor_options={"num_cpus": 0.5}), route_prefix="/", name="cuvil-test")
        rng = np.random.default_rng(21)
        reqs = [_request(rng, 2) for _ in range(16)]

        async def clients():
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
                return await asyncio.gather(*(c.post("/v2/models/net/infer", json=_v2_body(r)) for r in reqs))
        answers = asyncio.run(clients())
        for req, a in zip(reqs, answers):
            assert a.status_code == 200, a.text
            out = a.json()["outputs"][0]
            np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]), _eager(model, *req)[0],
                                       rtol=1e-5, atol=1e-5)
        status = serve.status().applications["cuvil-test"].deployments["cuvil-net"]
        assert status.replica_states.get("RUNNING") == 2
    finally:
        serve.shutdown()
        ray.shutdown()
