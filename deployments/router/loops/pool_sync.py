"""Pool states, pulled from the cluster manager (autoscale/cluster_manager.py).

Every few seconds each router replica reads the manager's report: links on a pool that is not
healthy take no new work (their in-flight work fails over as their replicas die), the report's
pools and events go into `/v1/cluster/status`, and its state changes into the metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from core.clock import Clock
from deployments.router import metrics
from deployments.router.adapters.ports import PoolSource
from deployments.router.request_path.faults import describe
from deployments.router.request_path.link import Link

logger = logging.getLogger("ray.serve")

POOL_SYNC_INTERVAL_S = 2.0
POOL_SYNC_TIMEOUT_S = 5.0
POOL_STATES = ("healthy", "draining", "provisioning", "failed")
_OUTCOMES = {"GPU_RECOVERED": "recovered", "POOL_FAILED": "failed"}


class PoolSync:
    def __init__(self, links: Mapping[str, Link], source: PoolSource | None, clock: Clock) -> None:
        self._links = links
        self._source = source
        self._clock = clock
        self._pools: dict[str, Any] = {}
        self._events: list[dict[str, Any]] = []
        self._events_counted: int | None = None  # the last event seq counted; None before any

    @property
    def follows(self) -> bool:
        return self._source is not None

    @property
    def pools(self) -> dict[str, Any]:
        return dict(self._pools)

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def unhealthy(self) -> set[str]:
        return {name for name, pool in self._pools.items() if pool["state"] != "healthy"}

    async def loop(self) -> None:
        source = self._source
        if source is None:
            return
        while True:
            try:
                report = await asyncio.wait_for(source.report(), POOL_SYNC_TIMEOUT_S)
                self.apply(report)
            except Exception as error:  # noqa: BLE001 - the manager restarting: keep the last states
                metrics.LOOP_ERRORS.labels("pool_sync").inc()
                logger.info("pool sync failed: %s", describe(error))
            await self._clock.sleep(POOL_SYNC_INTERVAL_S)

    def apply(self, report: Mapping[str, Any]) -> None:
        """Take the manager's report: mark links on unhealthy pools, count new events."""
        before = self.unhealthy()
        self._pools = dict(report.get("pools", {}))
        self._events = list(report.get("events", []))
        down = self.unhealthy()
        for link in self._links.values():
            pool = link.target.pool
            if pool is not None:
                link.on_pool(pool in down)
        for pool in sorted(down - before):
            logger.warning(
                "pool %s is %s: no new work goes there", pool, self._pools[pool]["state"]
            )
        for pool in sorted(before - down):
            logger.warning("pool %s is healthy again", pool)
        for name, pool in self._pools.items():
            for state in POOL_STATES:
                metrics.POOL_STATE.labels(name, state).set(1 if pool["state"] == state else 0)
        self._count_events()

    def _count_events(self) -> None:
        """Recoveries counted once per event; events from before this replica are not new."""
        newest = max((e["seq"] for e in self._events), default=0)
        if self._events_counted is None or newest < self._events_counted:
            self._events_counted = newest  # first report, or a restarted manager
            return
        for event in self._events:
            if event["seq"] <= self._events_counted:
                continue
            outcome = _OUTCOMES.get(event["type"])
            if outcome is not None:
                metrics.RECOVERIES.labels(event["pool"], outcome).inc()
            if event["type"] == "GPU_RECOVERED" and event.get("seconds") is not None:
                metrics.RECOVERY_SECONDS.labels(event["pool"]).observe(event["seconds"])
        self._events_counted = newest
