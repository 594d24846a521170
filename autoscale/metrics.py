"""The placement side's own Prometheus metrics, in their own registry as deployments/ keeps its."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

REGISTRY = CollectorRegistry()

# A background loop never dies on an error (it logs, counts here, sleeps and goes on): this
# counter is how a loop failing every round shows.
LOOP_ERRORS = Counter(
    "gps_loop_errors_total",
    "Rounds of a background loop that ended in an error, by loop",
    ["loop"],
    registry=REGISTRY,
)
