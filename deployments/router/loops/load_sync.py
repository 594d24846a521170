"""Load-driven autoscaling, the router's side: post the load, follow the replica counts.

Once a second each router replica posts, for every autoscaled backend, the requests waiting in
its queue, those in flight and the engine's last KV-cache usage (`LoadBoard`); the Serve
autoscaling policy sums the replicas' posts and decides the count (autoscale/serve_scaling.py).
Every few seconds the router reads Serve's running replica counts, so each autoscaled backend's
slots follow its replicas (`per_replica_cap` each). Once a second it reads the policy's last
decision and counts the new ones. While that decision is a sleep the backend's link is asleep:
it takes nothing new, and its posts say so, which the policy waits for before it takes the
replicas away. A later decision and a running replica wake it; requests that went past it
asleep are posted as waiting, so it wakes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from core.clock import Clock
from core.wire import ScalingNews
from deployments.router import metrics
from deployments.router.adapters.ports import BackendLoad, DeploymentStatuses, LoadBoard
from deployments.router.request_path.faults import describe
from deployments.router.request_path.link import Link

logger = logging.getLogger("ray.serve")

LOAD_POST_INTERVAL_S = 1.0
REPLICA_READ_EVERY = 5  # posts between reads of Serve's replica counts and the decisions
POST_TIMEOUT_S = 5.0


class LoadSync:
    def __init__(
        self,
        links: Mapping[str, Link],
        board: LoadBoard | None,
        deployments: DeploymentStatuses,
        read_news: Callable[[str], ScalingNews | None],
        clock: Clock,
    ) -> None:
        self._links: dict[str, Link] = {}
        self.use_links(links)
        self._board = board
        self._deployments = deployments
        self._read_news = read_news
        self._clock = clock
        self._seen: dict[str, int | None] = {}
        self._news: dict[str, ScalingNews | None] = {}

    def use_links(self, links: Mapping[str, Link]) -> None:
        """The autoscaled links among `links` (a reload adds and removes backends)."""
        self._links = {name: link for name, link in links.items() if link.target.autoscaled}

    @property
    def follows(self) -> bool:
        return self._board is not None and bool(self._links)

    def load(self) -> dict[str, BackendLoad]:
        """What this replica holds per autoscaled backend deployment, now. Not parked ones:
        placement decides their count (zero, or what a move asks while it brings them up), and
        with no post from any router the policy holds it."""
        return {
            link.target.deployment_name: BackendLoad(
                waiting=link.gate.queue.depth + link.passed_asleep,
                running=link.gate.queue.in_flight,
                kv_usage=link.kv.usage,
                asleep=link.facts.asleep,
            )
            for link in self._links.values()
            if not link.status().parked
        }

    async def loop(self) -> None:
        board = self._board
        if board is None:
            return
        rounds = 0
        while True:
            try:
                await asyncio.wait_for(self.follow_news(), POST_TIMEOUT_S)
                await asyncio.wait_for(board.publish(self.load()), POST_TIMEOUT_S)
                if rounds % REPLICA_READ_EVERY == 0:
                    await self.follow_replicas()
            except Exception as error:  # noqa: BLE001 - GCS or the controller busy: next round
                metrics.LOOP_ERRORS.labels("load_sync").inc()
                logger.info("load sync failed: %s", describe(error))
            rounds += 1
            await self._clock.sleep(LOAD_POST_INTERVAL_S)

    async def follow_news(self) -> None:
        """Count the policy's new decisions; hold asleep each backend whose last is a sleep
        (announced while its replicas are still up: from now on nothing may be sent there)."""
        for name, link in self._links.items():
            news = await asyncio.to_thread(self._read_news, link.target.deployment_name)
            self.count(name, news)
            self._news[name] = news
            if _says_sleep(news):
                link.sleep()

    async def follow_replicas(self) -> None:
        """Resize each autoscaled link's slots to its running replicas; wake an asleep one
        whose last decision is no longer a sleep once a replica runs."""
        deployments = await self._deployments.read()
        for name, link in self._links.items():
            facts = deployments.get(link.backend.deployment)
            running = facts.running_replicas if facts else 0
            if link.facts.asleep and running and not _says_sleep(self._news.get(name)):
                link.wake(running)
            link.scaled(running)
            metrics.BACKEND_REPLICAS.labels(name).set(running)

    def count(self, backend: str, news: ScalingNews | None) -> bool:
        """Count a decision made since this replica's first look (one it finds at its first
        look may be old news: a restarted router does not count it again). True when new."""
        seq = news.seq if news is not None else None
        looked = backend in self._seen
        fresh = news is not None and looked and seq != self._seen[backend] and bool(news.direction)
        if fresh and news is not None:
            metrics.AUTOSCALE_DECISIONS.labels(backend, news.direction).inc()
            logger.info("autoscaling %s: %d replicas (%s)", backend, news.replicas, news.reason)
        self._seen[backend] = seq
        return fresh


def _says_sleep(news: ScalingNews | None) -> bool:
    return news is not None and news.direction == "sleep"
