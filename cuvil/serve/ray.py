"""Ray Serve: the app `cuvil serve` runs (KServe v2, or the OpenAI APIs for an LLM artifact), as a Ray
Serve deployment whose replicas each load the artifact (numpy and the runtime only) and batch with
their own AsyncInferenceSession / continuous batcher. Needs the `ray` extra.

    import ray
    from ray import serve
    from cuvil.serve.ray import deployment
    ray.init()                                   # or ray.init(address="auto") on a cluster
    serve.run(deployment("net.cuvil", num_replicas=4), route_prefix="/")

On a multi-node cluster the same code runs unchanged: the artifact path must exist on every node
that hosts a replica (a shared file system, or the artifact copied to the same path), and Serve's
proxy spreads requests over the replicas."""
from __future__ import annotations

from pathlib import Path

from .http import app_for
from .wire import model_name_of


def deployment(artifact, *, num_replicas=1, name=None, max_batch=8, max_wait_ms=2.0, num_threads=1,
               prefill_chunk=64, ray_actor_options=None):
    """A bound Ray Serve application of `num_replicas` replicas, each building the HTTP app from
    `artifact` when it starts (nothing of the artifact is pickled). num_threads: the artifact's
    threads per replica, and the CPUs each replica asks Ray for."""
    from ray import serve
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"option num_replicas={num_replicas!r} must be a positive int")
    path = str(Path(artifact).resolve())
    name = name or model_name_of(path)
    def build():            # a function of no arguments: Serve calls it in each replica as it starts
        return app_for(path, name=name, max_batch=max_batch, max_wait_ms=max_wait_ms, num_threads=num_threads,
                       prefill_chunk=prefill_chunk)
    options = ray_actor_options or {"num_cpus": num_threads}
    return serve.deployment(serve.ingress(build)(), name=f"cuvil-{name}", num_replicas=num_replicas,
                            ray_actor_options=options).bind()
