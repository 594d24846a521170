"""The cost of metrics that sum: one request's records through Ray's metrics pipeline as well.

Every gateway metric is recorded twice (deployments/fleet_metrics.py): in the replica's
prometheus_client registry and through `ray.util.metrics`. In one Ray worker (a replica's
process, connected to a real one-node cluster) this times the records one answered request
makes in the ingress and its router (request count and start, answer seconds, tokens, a context
fit, queue wait, in-flight up and down) both ways; the anchor is the same records into
prometheus_client alone, what the gateway did before, timed in the same worker in the same run.

Target: at most 50 us added per request (the gateway's own cost per request is milliseconds:
bench/overhead.py). Run with `make bench` or `python -m bench.metrics`.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import ray

ROUNDS = 5
REQUESTS = 2000  # per round
TARGET_ADDED_US = 50.0


class Replica:
    """A worker like an ingress replica's: the real metric objects, and their local halves."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        from deployments.ingress import metrics as ingress
        from deployments.router import metrics as router

        self.ingress, self.router = ingress, router
        registry = CollectorRegistry()
        # The anchor: the same metrics, prometheus_client alone.
        self.a_requests = Counter("a_requests", "", ["endpoint", "status"], registry=registry)
        self.a_start = Histogram("a_start", "", ["endpoint"], registry=registry)
        self.a_seconds = Histogram(
            "a_seconds", "", ["backend", "priority", "status"], registry=registry
        )
        self.a_tokens = Counter("a_tokens", "", ["backend", "kind"], registry=registry)
        self.a_fits = Counter("a_fits", "", ["backend"], registry=registry)
        self.a_wait = Histogram("a_wait", "", ["priority"], registry=registry)
        self.a_in_flight = Gauge("a_in_flight", "", ["backend"], registry=registry)

    def ours(self, requests: int) -> float:
        ingress, router = self.ingress, self.router
        started = time.perf_counter()
        for _ in range(requests):
            router.QUEUE_WAIT_SECONDS.labels("user").observe(0.001)
            router.IN_FLIGHT.labels("coding@local").set(1)
            ingress.CONTEXT_FITS.labels("coding@local").inc()
            ingress.observe_tokens("coding@local", 120, 16)
            ingress.observe_answer("coding@local", "user", 200, 0.2)
            router.IN_FLIGHT.labels("coding@local").set(0)
            ingress.observe_request("chat", 200, 0.2)
        return (time.perf_counter() - started) / requests * 1e6

    def anchor(self, requests: int) -> float:
        started = time.perf_counter()
        for _ in range(requests):
            self.a_wait.labels("user").observe(0.001)
            self.a_in_flight.labels("coding@local").set(1)
            self.a_fits.labels("coding@local").inc()
            self.a_tokens.labels("coding@local", "prompt").inc(120)
            self.a_tokens.labels("coding@local", "completion").inc(16)
            self.a_seconds.labels("coding@local", "user", "200").observe(0.2)
            self.a_in_flight.labels("coding@local").set(0)
            self.a_requests.labels("chat", "200").inc()
            self.a_start.labels("chat").observe(0.2)
        return (time.perf_counter() - started) / requests * 1e6


def main() -> int:
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        actor: Any = ray.remote(num_cpus=0)(Replica)
        replica = actor.remote()
        ours, anchor = [], []
        for _ in range(ROUNDS):  # alternating, so a busy moment hits both
            anchor.append(ray.get(replica.anchor.remote(REQUESTS)))
            ours.append(ray.get(replica.ours.remote(REQUESTS)))
    finally:
        ray.shutdown()
    mine, theirs = statistics.median(ours), statistics.median(anchor)
    added = mine - theirs
    print(f"metrics per request ({ROUNDS} rounds of {REQUESTS}, median):")
    print(f"  prometheus_client alone (anchor)    {theirs:7.1f} us")
    print(f"  and through Ray's metrics pipeline  {mine:7.1f} us  ({mine / theirs:.1f} x)")
    verdict = "meets" if added <= TARGET_ADDED_US else "MISSES"
    print(f"  added {added:.1f} us per request: {verdict} the target of {TARGET_ADDED_US:.0f} us")
    return 0 if added <= TARGET_ADDED_US else 1


if __name__ == "__main__":
    sys.exit(main())
