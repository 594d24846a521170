"""The router's Prometheus metrics; the ingress appends them to its own at /metrics, and each
goes through Ray's metrics pipeline too (deployments/fleet_metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from core.types import PriorityClass
from deployments.fleet_metrics import Counter, Gauge, Histogram
from policy.breaker import BreakerState

REGISTRY = CollectorRegistry()

QUEUE_DEPTH = Gauge(
    "gps_queue_depth",
    "Requests waiting for a slot, by backend and priority class.",
    ["backend", "priority"],
    registry=REGISTRY,
)
QUEUE_WAIT_SECONDS = Histogram(
    "gps_queue_wait_seconds",
    "Seconds a request waited for a slot (admitted or shed), by priority class.",
    ["priority"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
SEATS = Counter(
    "gps_seats",
    "Slots given, by backend and the request's own priority class (aging never changes it).",
    ["backend", "priority"],
    registry=REGISTRY,
)
SHED = Counter(
    "gps_shed",
    "Requests refused with 429 by admission, by priority class and reason.",
    ["priority", "reason"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "gps_backend_in_flight",
    "Requests running on a backend now.",
    ["backend"],
    registry=REGISTRY,
)
BREAKER_STATE = Gauge(
    "gps_breaker_state",
    "1 for each backend's breaker state now (closed, open, half_open), 0 for the others.",
    ["backend", "state"],
    registry=REGISTRY,
)
BREAKER_TRANSITIONS = Counter(
    "gps_breaker_transitions",
    "Circuit breaker state changes, by backend and target state.",
    ["backend", "state"],
    registry=REGISTRY,
)
STREAM_MIGRATIONS = Counter(
    "gps_stream_migrations",
    "Streams whose backend failed after the first token and that went on on another link.",
    ["from", "to"],
    registry=REGISTRY,
)
PREEMPTIONS = Counter(
    "gps_preemptions",
    "Running answers paused for a higher class's request (router.preempt), by backend and "
    "the paused answer's class.",
    ["backend", "class"],
    registry=REGISTRY,
)
PREEMPT_REPREFILL_TOKENS = Counter(
    "gps_preempt_reprefill_tokens",
    "Prompt tokens paused answers sent again to go on (an upper bound of the prefill they "
    "cost: the engine's prefix cache may hold part of them).",
    ["backend"],
    registry=REGISTRY,
)
FAILOVERS = Counter(
    "gps_failovers",
    "Requests moved to the next link of their chain, by the backend that failed.",
    ["backend"],
    registry=REGISTRY,
)
BACKEND_FAULTS = Counter(
    "gps_backend_faults",
    "Faults charged to a backend (5xx, timeouts, dead replicas).",
    ["backend"],
    registry=REGISTRY,
)
BACKEND_OOM = Counter(
    "gps_backend_oom",
    "Requests a backend answered with backend_oom (out of memory, or no KV-cache room).",
    ["backend"],
    registry=REGISTRY,
)
KV_CACHE_USAGE = Gauge(
    "gps_kv_cache_usage",
    "The backend engine's last reported KV-cache usage (0..1).",
    ["backend"],
    registry=REGISTRY,
)
ENGINE_PREEMPTIONS = Counter(
    "gps_engine_preemptions",
    "Sequences the backend's engines preempted (vLLM's own count: a sequence whose KV blocks "
    "were taken back, to be recomputed), summed over its replicas.",
    ["backend"],
    registry=REGISTRY,
)
PREFIX_CACHE_QUERIES = Counter(
    "gps_prefix_cache_queried_tokens",
    "Prompt tokens the backend's engines looked up in their prefix cache.",
    ["backend"],
    registry=REGISTRY,
)
PREFIX_CACHE_HITS = Counter(
    "gps_prefix_cache_hit_tokens",
    "Prompt tokens the backend's engines found in their prefix cache (not computed again).",
    ["backend"],
    registry=REGISTRY,
)
PREFIX_CACHE_HIT_RATE = Gauge(
    "gps_prefix_cache_hit_rate",
    "Hit tokens over queried tokens in the backend's prefix caches, over the replicas this "
    "router has read (each counted from its own start).",
    ["backend"],
    registry=REGISTRY,
)
PLACEMENT_MOVES = Counter(
    "gps_placement_moves",
    "Placement moves recorded by the placement actor, by model, kind (offload, restore) and "
    "outcome (done, abandoned); a router replica counts the recorded ones it had not seen.",
    ["model", "kind", "outcome"],
    registry=REGISTRY,
)
# Load-driven autoscaling (models[].autoscaling): Serve's running count, and the policy's steps.
BACKEND_REPLICAS = Gauge(
    "gps_backend_replicas",
    "Replicas Serve reports running for an autoscaled backend.",
    ["backend"],
    registry=REGISTRY,
)
AUTOSCALE_DECISIONS = Counter(
    "gps_autoscale_decisions",
    "Replica count changes the load decided for a backend, by direction (up, down, bounds); a "
    "router replica counts those it saw.",
    ["backend", "direction"],
    registry=REGISTRY,
)
# A background loop never dies on an error (it logs, counts here, sleeps and goes on): this
# counter is how a loop failing every round shows.
LOOP_ERRORS = Counter(
    "gps_loop_errors",
    "Rounds of a router background loop (health, replicas, kv, placement_sync, ...) that ended"
    " in an error.",
    ["loop"],
    registry=REGISTRY,
)
MODEL_POOL = Gauge(
    "gps_model_pool",
    "1 for the pool each model serves on now (placement may move it off its home pool).",
    ["model", "pool"],
    registry=REGISTRY,
)

# Pool recovery, from the cluster manager's report (its actor has no /metrics of its own).
POOL_STATE = Gauge(
    "gps_pool_state",
    "1 for each pool's current state (healthy, draining, provisioning, failed), 0 for the others.",
    ["pool", "state"],
    registry=REGISTRY,
)
RECOVERIES = Counter(
    "gps_recoveries",
    "Pool recoveries by outcome: recovered (GPU_RECOVERED) or failed (POOL_FAILED).",
    ["pool", "outcome"],
    registry=REGISTRY,
)
RECOVERY_SECONDS = Histogram(
    "gps_recovery_seconds",
    "From a pool declared dead (draining) to healthy again.",
    ["pool"],
    buckets=(30, 60, 120, 300, 600, 1200, 1800, 3600),
    registry=REGISTRY,
)


def render() -> bytes:
    return generate_latest(REGISTRY)


def forget_backend(backend: str) -> None:
    """A backend a reload removed or replaced: its state gauges are no longer news (counters
    and the in-flight gauge stay, its jobs under way still end there)."""
    for priority in PriorityClass:
        QUEUE_DEPTH.forget(backend, priority.value)
    for state in BreakerState:
        BREAKER_STATE.forget(backend, state.value)
    KV_CACHE_USAGE.forget(backend)
