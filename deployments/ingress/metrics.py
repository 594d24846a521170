"""The gateway's own Prometheus metrics: served at /metrics by the ingress (this replica's
view) and sent through Ray's metrics pipeline (every replica's: deployments/fleet_metrics.py)."""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.exposition import generate_latest

from core.wire import Routed
from deployments.fleet_metrics import Counter, Histogram

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

# Per backend and priority class: what users feel, and the tokens the engines counted.
NO_BACKEND = "none"  # refused before a backend was chosen (auth, schema, limits, admission)
REQUEST_SECONDS = Histogram(
    "gps_request_seconds",
    "Seconds from request arrival to the answer's last byte, by backend, priority class and "
    "HTTP status (backend `none`: refused before one was chosen).",
    ["backend", "priority", "status"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)
TTFT_SECONDS = Histogram(
    "gps_ttft_seconds",
    "Streams: seconds from request arrival to the first chunk relayed, by backend and "
    "priority class.",
    ["backend", "priority"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
INTER_TOKEN_SECONDS = Histogram(
    "gps_inter_token_seconds",
    "Streams: seconds between successive chunks relayed (a batch of chunks shares its gap).",
    ["backend"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)
TOKENS = Counter(
    "gps_tokens",
    "Tokens by backend and kind (prompt, completion), from the engines' own usage.",
    ["backend", "kind"],
    registry=REGISTRY,
)


class StreamTiming:
    """Times one relayed stream: its first chunk (TTFT), the gaps after it, its end."""

    def __init__(self, backend: str, priority: str, started: float) -> None:
        self._backend, self._priority = backend, priority
        self._gaps = INTER_TOKEN_SECONDS.labels(backend)  # looked up once, observed per chunk
        self._started = started
        self._last: float | None = None
        # HTTP said 200 when the stream began; what it ended as: 200, an error event sent
        # (502), or the client gone before the end (499) until `completed`.
        self._status = 499
        self._failed = False

    def failed(self) -> None:
        self._failed = True

    def completed(self) -> None:
        self._status = 502 if self._failed else 200

    def relayed(self, chunks: int, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self._last is None:
            TTFT_SECONDS.labels(self._backend, self._priority).observe(now - self._started)
        elif chunks:
            gap = (now - self._last) / chunks
            for _ in range(chunks):
                self._gaps.observe(gap)
        self._last = now

    def ended(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        observe_answer(self._backend, self._priority, self._status, now - self._started)


def observe_answer(backend: str, priority: str, status: int, seconds: float) -> None:
    REQUEST_SECONDS.labels(backend, priority, str(status)).observe(seconds)


def observe_tokens(backend: str, prompt: int, completion: int) -> None:
    if prompt > 0:
        TOKENS.labels(backend, "prompt").inc(prompt)
    if completion > 0:
        TOKENS.labels(backend, "completion").inc(completion)


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
CONTEXT_TOOL_SHORTENINGS = Counter(
    "gps_context_tool_shortenings",
    "Requests whose tool definitions were shortened to fit (step 1: first sentences of their "
    "descriptions, 2: no descriptions).",
    ["backend", "step"],
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
    if routed.tools_shortened:
        CONTEXT_TOOL_SHORTENINGS.labels(backend, str(routed.tools_shortened)).inc()
    if routed.output_clamped:
        OUTPUT_CLAMPS.labels(backend).inc()
    if depth is not None:
        DEPTH_DECISIONS.labels(depth).inc()


def observe_request(endpoint: str, status: int, seconds: float) -> None:
    REQUESTS.labels(endpoint, str(status)).inc()
    RESPONSE_START_SECONDS.labels(endpoint).observe(seconds)


def render() -> bytes:
    return generate_latest(REGISTRY)
