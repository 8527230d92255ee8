"""Prometheus metrics of a server, in a registry of its own (two apps in one process, as the tests
run them, do not share counters)."""
from __future__ import annotations

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self, model_name, queue_depth):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = r = CollectorRegistry()
        self.model = model_name
        self.requests = Counter("cuvil_requests", "requests answered, by endpoint and HTTP status",
                                ["model", "endpoint", "code"], registry=r)
        self.latency = Histogram("cuvil_request_seconds", "time from a request's arrival to its answer",
                                 ["model", "endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("cuvil_batch_rows", "rows per compiled run (requests stacked together)", ["model"],
                               buckets=BATCH_BUCKETS, registry=r)
        depth = Gauge("cuvil_queue_depth", "requests waiting for a run", ["model"], registry=r)
        depth.labels(model_name).set_function(queue_depth)

    def observe_batch(self, rows):
        self.batch.labels(self.model).observe(rows)

    def answered(self, endpoint, code, seconds):
        self.requests.labels(self.model, endpoint, str(code)).inc()
        self.latency.labels(self.model, endpoint).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
