"""The background loops that keep the router's view of its links fresh: health (Serve's
replica status, with probes of troubled links), the replicas each Serve handle holds, each
engine's KV-cache usage and its counts."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from core.clock import Clock
from core.config import RouterConfig
from core.wire import ScalingNews
from deployments.router import metrics
from deployments.router.adapters.ports import DeploymentFacts, DeploymentStatuses
from deployments.router.request_path.faults import describe
from deployments.router.request_path.link import REPLICA_POLL_S, Link
from policy.links import Health

logger = logging.getLogger("ray.serve")

_Check = tuple[Link, asyncio.Task[None]]  # a link's health check under way, and its link

HEALTH_PROBE_TIMEOUT_S = 5.0  # a healthy engine answers in milliseconds; a busy one well within
# Counters are for dashboards, not decisions: a reading every few seconds is plenty.
COUNTERS_INTERVAL_S = 5.0


class Watch:
    def __init__(
        self,
        settings: RouterConfig,
        links: Mapping[str, Link],
        deployments: DeploymentStatuses,
        clock: Clock,
        read_news: Callable[[str], ScalingNews | None] = lambda deployment: None,
    ) -> None:
        self._settings = settings
        self._links = links
        self._deployments = deployments
        self._clock = clock
        self._read_news = read_news

    def use_settings(self, settings: RouterConfig) -> None:
        """A reload's settings (its intervals are the same: a reload cannot change them)."""
        self._settings = settings

    async def health_loop(self) -> None:
        """Every interval, Serve's status read and each link checked on its own: a probe that
        waits out its timeout (a replica too stuck to answer) holds up no other link's check,
        and its link is checked again once it has ended."""
        checking: dict[str, _Check] = {}
        try:
            while True:
                try:
                    await self._start_checks(checking)
                    # Each check's first step, up to its probe: a link found without a replica
                    # is troubled before the interval is chosen by it.
                    await asyncio.sleep(0)
                except Exception:  # the loop must outlive any one failed check
                    metrics.LOOP_ERRORS.labels("health").inc()
                    logger.exception("router health check failed")
                # A check still under way (a probe; a sleeping target's scaling read before it
                # is judged) is trouble too: its link's next read comes soon.
                waiting = any(not task.done() for _, task in checking.values())
                await self._clock.sleep(self._health_interval_s(waiting))
        finally:
            for _, task in checking.values():
                task.cancel()

    def _health_interval_s(self, checking: bool = False) -> float:
        troubled = checking or any(link.status().troubled for link in self._links.values())
        settings = self._settings
        return settings.health_interval_s if troubled else settings.health_idle_interval_s

    async def check_health_once(self) -> None:
        """Mark links without a running replica; probe troubled ones and close them if healthy
        (one round, each link's check awaited)."""
        checking: dict[str, _Check] = {}
        await self._start_checks(checking)
        await asyncio.gather(*(task for _, task in checking.values()))

    async def _start_checks(self, checking: dict[str, _Check]) -> None:
        """A check of each link whose last one (in `checking`) has ended, against Serve's
        status read now."""
        deployments = await self._deployments.read()
        for name, link in list(self._links.items()):
            if name in checking:
                checked, task = checking[name]
                if checked is link and not task.done():
                    continue  # still waiting for its probe
                task.cancel()  # ended, or a reload's new link of that name: its own check
            facts = deployments.get(link.backend.deployment)
            task = asyncio.create_task(self._check_link(link, facts))
            task.add_done_callback(functools.partial(_count_failed, "health", name))
            checking[name] = (link, task)
        for name in checking.keys() - self._links.keys():  # a reload removed it
            checking.pop(name)[1].cancel()

    async def _check_link(self, link: Link, facts: DeploymentFacts | None) -> None:
        link.scaled(facts.running_replicas if facts else 0)
        if facts is None or not facts.running_replicas:
            if link.target.sleeps and not link.facts.asleep and await self._slept(link):
                link.sleep()  # before the load loop heard: load's zero is not a fault
            link.read(Health.NO_REPLICA)
            if not link.facts.asleep:
                link.breaker.trip("no running replica")
        elif not link.status().needs_probe:
            link.read(Health.RUNNING)
        elif await self._probe(link):
            link.recovered(Health.PROBE_PASSED)
            link.breaker.reset("health check passed")
        else:
            # Serve may still count a dead replica as RUNNING: trust only a passed probe.
            link.read(Health.PROBE_FAILED)
        link.count_transitions()

    async def _slept(self, link: Link) -> bool:
        try:
            news = await asyncio.to_thread(self._read_news, link.target.deployment_name)
        except Exception as error:  # noqa: BLE001 - the store busy: judged as before
            logger.info("reading %s's scaling failed: %s", link.target.name, describe(error))
            return False
        return news is not None and news.direction == "sleep"

    async def _probe(self, link: Link) -> bool:
        try:
            await asyncio.wait_for(link.backend.check_health(), HEALTH_PROBE_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - whatever the failure, the link is still unhealthy
            logger.info("health probe of %s failed: %s", link.target.name, describe(error))
            return False
        return True

    async def replicas_loop(self) -> None:
        while True:
            try:
                self.check_replicas_once()
            except Exception:  # the loop must outlive any one bad reading
                metrics.LOOP_ERRORS.labels("replicas").inc()
                logger.exception("router replica reading failed")
            await self._clock.sleep(REPLICA_POLL_S)

    def check_replicas_once(self) -> None:
        """Each link's replicas as Serve's handle holds them (a read of memory, no call)."""
        for link in self._links.values():
            link.watch_replicas()

    async def kv_loop(self) -> None:
        await self._each_link_on_its_own(
            self._read_kv, lambda: self._settings.kv_poll_interval_s, "kv"
        )

    async def counters_loop(self) -> None:
        await self._each_link_on_its_own(
            self._read_counters, lambda: COUNTERS_INTERVAL_S, "engine_counters"
        )

    async def _each_link_on_its_own(
        self,
        read: Callable[[Link], Coroutine[Any, Any, None]],
        interval_s: Callable[[], float],
        loop: str,
    ) -> None:
        """Every `interval_s`, a reading of each link whose last one has ended. Not one round
        of all: a reading may wait `kv_stale_after_s` for an engine too busy to answer, and the
        others waited with it, so every link's reading went stale, which counts as pressure:
        each GPU link was passed over and new work went to the CPU fallback (the story of
        tests/chaos/test_kills.py, clean-clone run of 44684cf)."""
        reading: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                for name, link in list(self._links.items()):
                    task = reading.get(name)
                    if task is not None and not task.done():
                        continue  # still waiting for its engine
                    reading[name] = asyncio.create_task(read(link))
                    reading[name].add_done_callback(functools.partial(_count_failed, loop, name))
                for name in reading.keys() - self._links.keys():  # a reload removed it
                    reading.pop(name).cancel()
                await self._clock.sleep(interval_s())
        finally:
            for task in reading.values():
                task.cancel()

    async def _read_counters(self, link: Link) -> None:
        """One replica's counts (whichever Serve picks), added to its backend's."""
        if not link.counts_engine or not link.status().reads_engine:
            return
        try:
            reading = await asyncio.wait_for(
                link.backend.engine_counters(), self._settings.kv_stale_after_s
            )
        except Exception as error:  # noqa: BLE001 - a missed reading is read next time
            logger.info("engine counters of %s: %s", link.target.name, describe(error))
            return
        if reading is None:  # a replica without the method (a plain LLMServer, an older one)
            return
        added = link.engine_counts.read(*reading)
        name = link.target.name
        metrics.ENGINE_PREEMPTIONS.labels(name).inc(added.preemptions)
        metrics.PREFIX_CACHE_QUERIES.labels(name).inc(added.prefix_queries)
        metrics.PREFIX_CACHE_HITS.labels(name).inc(added.prefix_hits)
        rate = link.engine_counts.total.prefix_hit_rate
        if rate is not None:
            metrics.PREFIX_CACHE_HIT_RATE.labels(name).set(rate)

    async def _read_kv(self, link: Link) -> None:
        if not link.status().reads_kv:
            return
        try:
            usage = await asyncio.wait_for(
                link.backend.kv_cache_usage(), self._settings.kv_stale_after_s
            )
        except Exception as error:  # noqa: BLE001 - an unanswered reading goes stale: pressure
            logger.info("KV reading of %s failed: %s", link.target.name, describe(error))
            return
        if usage is None:  # a plain LLMServer: stop asking
            link.no_kv_reading()
            return
        now = self._clock.monotonic()
        link.kv.observe(float(usage), now)
        link.gate.queue.kv_usage = float(usage)  # preemption holds lower classes by it too
        metrics.KV_CACHE_USAGE.labels(link.target.name).set(float(usage))
        if link.kv.pressured(now):
            link.gate.pause()
        else:
            link.gate.resume()


def _count_failed(loop: str, name: str, task: asyncio.Task[None]) -> None:
    """A reading that raised (a reading's own failures are caught inside it: this is a bug's)
    is counted and logged as it ends; the loop goes on."""
    if task.cancelled() or task.exception() is None:
        return
    metrics.LOOP_ERRORS.labels(loop).inc()
    logger.error("router %s reading of %s failed", loop, name, exc_info=task.exception())
