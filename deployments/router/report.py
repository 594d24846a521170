"""The router's status report (/healthz, /v1/cluster/status): Serve's facts per backend, with
each link's breaker, queue and KV pressure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.config import ClusterConfig
from core.topology import Target
from core.types import PriorityClass
from deployments.router.adapters.ports import DeploymentFacts, DeploymentKey
from deployments.router.request_path.link import Link
from policy.breaker import BreakerState


def status_report(
    config: ClusterConfig,
    links: Mapping[str, Link],
    deployments: Mapping[DeploymentKey, DeploymentFacts],
    placements: Mapping[str, str],
    moves: list[dict[str, Any]],
    now: float,
) -> dict[str, Any]:
    backends = {}
    homes = {t.name for t in config.home_targets}
    for target in config.targets.values():
        link = links.get(target.name)
        if link is None and (target.model is None or target.name not in homes):
            continue  # not part of this app (benchmarks over bare replicas)
        facts = deployments.get(link.backend.deployment) if link else None
        backends[target.name] = backend_report(target, facts, link, now)
    # At zero on purpose (placement parked it, or load put it to sleep): not degraded.
    states = [b["state"] for b in backends.values() if b["state"] not in {"parked", "asleep"}]
    return {
        "status": overall_status(states),
        "backends": backends,
        "placements": {name: links[name].target.pool for name in placements.values()},
        "moves": moves,
    }


def with_pools(
    report: dict[str, Any], pools: Mapping[str, Any], events: list[dict[str, Any]]
) -> dict[str, Any]:
    """The cluster manager's pools and events added; a pool not healthy makes the whole
    status at best degraded (`/healthz` says so while a pool recovers)."""
    unhealthy = [name for name, pool in pools.items() if pool["state"] != "healthy"]
    status = report["status"]
    if unhealthy and status == "ok":
        status = "degraded"
    return {**report, "status": status, "pools": dict(pools), "events": events}


def backend_report(
    target: Target, facts: DeploymentFacts | None, link: Link | None, now: float
) -> dict[str, Any]:
    running = facts.running_replicas if facts else 0
    status = facts.status if facts else "NOT_DEPLOYED"
    report: dict[str, Any] = {
        "model": target.model,  # None: the fallback, any model's last link
        "role": target.role.value if target.role else None,
        "pool": target.pool,
        "state": backend_state(status, running),
        "deployment_status": status,
        "running_replicas": running,
    }
    if link is not None:
        report.update(_link_report(link, report["state"], running, now))
    return report


def _link_report(link: Link, state: str, running: int, now: float) -> dict[str, Any]:
    breaker = link.breaker.state
    if link.facts.parked:  # at zero replicas on purpose, or on its way there
        state = "draining" if running else "parked"
    elif link.facts.asleep:  # at zero by load; a request wakes it
        state = "asleep"
    elif link.facts.pool_down:  # its pool's nodes died: no new work until it recovers
        state = "pool_down"
    elif state == "up" and breaker is not BreakerState.CLOSED:
        state = "degraded"
    queue = link.gate.queue
    return {
        "state": state,
        "breaker": breaker.value,
        # What Serve's handle would send to now (None: it cannot tell); 0 takes the link out.
        "routable_replicas": link.backend.routable_replicas(),
        "in_flight": link.in_flight,
        "cap": queue.cap,  # this router's slots now (its lease, with several routers)
        "cap_total": link.total_cap,  # the backend's slots over every router
        "queue_depth": queue.depth,
        "queue_by_priority": {p.value: n for p, n in queue.depth_by_class().items()},
        # Who holds the slots: seats given by class, what each class may hold (its share of the
        # backend's slots, with the classes below it) and the most it held at once since.
        "seats_by_priority": {p.value: n for p, n in queue.seats().items()},
        "share_slots": {p.value: queue.limit(p) for p in PriorityClass},
        "most_held": {p.value: n for p, n in queue.most_held().items()},
        "kv_cache_usage": link.kv.usage,
        "kv_cache_pressure": link.kv.pressured(now),
        **_engine_counts(link),
    }


def _engine_counts(link: Link) -> dict[str, Any]:
    """The engine's own counts, over the replicas this router has read (each from its own
    start); none for the fallback."""
    if not link.counts_engine:
        return {}
    total = link.engine_counts.total
    return {
        "engine_preemptions": total.preemptions,
        "prefix_cache_hit_rate": total.prefix_hit_rate,
        "prefix_cache_queried_tokens": total.prefix_queries,
    }


def backend_state(deployment_status: str, running_replicas: int) -> str:
    """up: healthy and serving; degraded: serving with trouble; starting; down."""
    if running_replicas and deployment_status == "HEALTHY":
        return "up"
    if running_replicas:
        return "degraded"
    return "starting" if deployment_status in {"UPDATING", "UPSCALING"} else "down"


def overall_status(states: list[str]) -> str:
    """ok when every backend is up, down when none serves, degraded in between."""
    if states and all(s == "up" for s in states):
        return "ok"
    return "degraded" if any(s in {"up", "degraded"} for s in states) else "down"
