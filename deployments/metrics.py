"""The gateway's own Prometheus metrics (served at /metrics by the ingress)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST
REGISTRY = CollectorRegistry()

REQUESTS = Counter(
    "gps_requests",
    "Requests answered by the ingress, by endpoint and HTTP status.",
    ["endpoint", "status"],
    registry=REGISTRY,
)
# Time until the response starts (headers sent); streaming bodies continue after it.
RESPONSE_START_SECONDS = Histogram(
    "gps_response_start_seconds",
    "Seconds from request arrival to the response starting, by endpoint.",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)


def observe_request(endpoint: str, status: int, seconds: float) -> None:
    REQUESTS.labels(endpoint, str(status)).inc()
    RESPONSE_START_SECONDS.labels(endpoint).observe(seconds)


def render() -> bytes:
    return generate_latest(REGISTRY)
