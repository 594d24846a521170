"""The gateway's own Prometheus metrics (served at /metrics by the ingress)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from core.wire import Routed

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


# Context safety, counted per backend from the router's report on each job.
CONTEXT_FITS = Counter(
    "gps_context_fits",
    "Requests whose conversation was altered to fit the window (compressed or trimmed).",
    ["backend"],
    registry=REGISTRY,
)
CONTEXT_COMPRESSIONS = Counter(
    "gps_context_system_compressions",
    "Requests whose system message was compressed extractively.",
    ["backend"],
    registry=REGISTRY,
)
CONTEXT_DROPPED_MESSAGES = Counter(
    "gps_context_dropped_messages",
    "Messages dropped by the sliding window (replaced by one marker per request).",
    ["backend"],
    registry=REGISTRY,
)
OUTPUT_CLAMPS = Counter(
    "gps_output_clamps",
    "Requests whose max_tokens was set or lowered to fit the window's output share.",
    ["backend"],
    registry=REGISTRY,
)
DEPTH_DECISIONS = Counter(
    "gps_depth_decisions",
    "`model: auto` requests by the depth the depth router chose.",
    ["depth"],
    registry=REGISTRY,
)


def observe_routing(routed: Routed, depth: str | None) -> None:
    backend = routed.backend
    if routed.context_fitted:
        CONTEXT_FITS.labels(backend).inc()
    if routed.system_compressed:
        CONTEXT_COMPRESSIONS.labels(backend).inc()
    if routed.dropped_messages:
        CONTEXT_DROPPED_MESSAGES.labels(backend).inc(routed.dropped_messages)
    if routed.output_clamped:
        OUTPUT_CLAMPS.labels(backend).inc()
    if depth is not None:
        DEPTH_DECISIONS.labels(depth).inc()


def observe_request(endpoint: str, status: int, seconds: float) -> None:
    REQUESTS.labels(endpoint, str(status)).inc()
    RESPONSE_START_SECONDS.labels(endpoint).observe(seconds)


def render() -> bytes:
    return generate_latest(REGISTRY)
