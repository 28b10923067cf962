"""Prometheus metrics of the server (`/metrics`): requests, latency, batch sizes, queue depth.

Each server owns a `CollectorRegistry`, so several servers in one process (tests) keep separate
counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """The server's metrics, labelled by model (and status for request counts)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "pgx_inference_requests",
            "Inference requests answered, by model, protocol and status",
            ["model", "protocol", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "pgx_request_latency_seconds",
            "Time from a request's arrival at the batcher to its result",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute = Histogram(
            "pgx_batch_compute_seconds",
            "Time one batch ran on a program",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "pgx_batch_size",
            "Rows per executed batch",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.queue_depth = Gauge(
            "pgx_queue_depth", "Requests waiting for a batch", ["model"], registry=r
        )

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
