"""Where each model serves now, pulled from the placement actor (autoscale/broadcast.py).

Every router replica pulls the actor's view, so all of them follow each move, and one that
starts late or restarts routes by it at once. Parked backends take no new work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from core.clock import Clock
from core.config import ClusterConfig
from core.wire import SYNC_INTERVAL_S, PlacementView
from deployments.router import metrics
from deployments.router.adapters.ports import PlacementSource
from deployments.router.request_path.faults import describe
from deployments.router.request_path.link import Link
from policy.breaker import BreakerState
from policy.links import Health

logger = logging.getLogger("ray.serve")

# A third of the actor's STALE_AFTER_S: a replica slow to sync still counts as present.
SYNC_TIMEOUT_S = 5.0
FIRST_SYNC_WAIT_S = 5.0  # a new router replica waits this long for where models serve now


def home_placement(config: ClusterConfig) -> dict[str, str]:
    return {b.model: b.name for b in config.home_backends}


class PlacementSync:
    def __init__(
        self,
        config: ClusterConfig,
        links: Mapping[str, Link],
        source: PlacementSource | None,
        clock: Clock,
    ) -> None:
        self._config = config
        self._built_with = config
        self._links = links
        self._source = source
        self._clock = clock
        self._placement = home_placement(config)
        self._moves: list[dict[str, Any]] = []
        self._moves_counted = 0  # the `seq` of the last move counted in the metrics
        self._placer_errors = 0  # the placement actor's failed rounds, last seen
        self._view_version = 0
        self._synced = asyncio.Event()
        for model, backend in self._placement.items():
            if backend in links:
                metrics.MODEL_POOL.labels(model, links[backend].target.pool).set(1)

    def use_config(self, config: ClusterConfig) -> None:
        """A reload's chains from now on. The placement actor is still started with the config
        the app was built with, unless the reload added or removed models: a restarted actor
        starts from the models as they are now (the models that move are not removed or
        changed by a reload, core/config/reload.py, so a running actor's moves stand)."""
        if _model_pools(config) != _model_pools(self._config):
            self._built_with = config
        homes = home_placement(config)  # a model added starts home, one removed is placed nowhere
        kept = {model: backend for model, backend in self._placement.items() if model in homes}
        pools = {b.name: b.pool for c in (self._config, config) for b in c.backends}
        for model, backend in self._placement.items():
            if model not in homes:
                metrics.MODEL_POOL.forget(model, pools[backend])
        for model, backend in homes.items():
            if model not in self._placement:
                metrics.MODEL_POOL.labels(model, pools[backend]).set(1)
        self._placement = homes | kept
        self._config = config

    @property
    def follows(self) -> bool:
        """Whether there is a placement actor to follow (some model can move)."""
        return self._source is not None

    @property
    def placements(self) -> Mapping[str, str]:
        return self._placement

    @property
    def moves(self) -> list[dict[str, Any]]:
        return list(self._moves)

    def chain(self, model: str) -> tuple[str, ...]:
        """The model's chain, led by the backend it is placed on now."""
        chain = self._config.chain(model)
        # An adapter's backends are its base model's: where that was placed.
        placed = self._placement.get(self._config.base_model(model).name)
        if placed is None or (chain and chain[0] == placed):
            return chain
        return (placed, *(link for link in chain if link != placed))

    async def first_sync(self) -> None:
        """Route on the placement actor's view, not the config's home pools, from the start."""
        if self._source is None or self._synced.is_set():
            return
        try:
            await asyncio.wait_for(self._synced.wait(), FIRST_SYNC_WAIT_S)
        except TimeoutError:
            logger.warning("no placement view in %.0f s: routing to home pools", FIRST_SYNC_WAIT_S)
            self._synced.set()

    async def loop(self) -> None:
        source = self._source
        if source is None:
            return
        while True:
            try:
                await self._sync_once(source)
            except Exception as error:  # noqa: BLE001 - the actor restarting: keep routing on the last view
                metrics.LOOP_ERRORS.labels("placement_sync").inc()
                logger.info("placement sync failed: %s", describe(error))
            await self._clock.sleep(SYNC_INTERVAL_S)

    async def _sync_once(self, source: PlacementSource) -> None:
        view = await asyncio.wait_for(source.sync(self._view_version, self.held()), SYNC_TIMEOUT_S)
        if view is None:
            # Restarted by Ray with the config it was first made with, maybe older than ours:
            # start it with the one the app was built with (not a reload's: the actor keeps
            # its saved placements only for the config it was started with, autoscale/saved.py),
            # and keep routing on the last view meanwhile.
            await source.start(self._built_with)
        else:
            self.apply(view)

    def held(self) -> dict[str, int]:
        """Jobs this replica holds per backend: being fitted, queued for a slot or in flight."""
        return {name: link.claims for name, link in self._links.items()}

    def apply(self, view: PlacementView) -> None:
        """Send each model's new work where `view` places it; parked backends take none."""
        for model, backend in view.placements.items():
            if backend in self._links and self._placement.get(model) != backend:
                self._prefer(model, self._links[backend])
        for link in self._links.values():
            if link.target.model is not None:
                link.park(link.target.name in view.parked)
        self._count_moves(view.moves)
        self._count_loop_errors(view.loop_errors)
        self._moves = list(view.moves)
        self._view_version = view.version
        self._synced.set()

    def _count_loop_errors(self, seen: int) -> None:
        """The placement actor's failed rounds, counted here: its process has no /metrics.
        A restarted actor counts from zero again: a smaller figure is all new (as Prometheus
        reads a counter reset)."""
        new = seen - self._placer_errors if seen >= self._placer_errors else seen
        if new:
            metrics.LOOP_ERRORS.labels("placement").inc(new)
        self._placer_errors = seen

    def _count_moves(self, moves: tuple[dict[str, Any], ...]) -> None:
        for move in moves:
            if move["seq"] <= self._moves_counted:
                continue
            if self._view_version:  # on the first view, moves made before this replica are not new
                metrics.PLACEMENT_MOVES.labels(move["model"], move["kind"], move["outcome"]).inc()
            self._moves_counted = move["seq"]

    def _prefer(self, model: str, link: Link) -> None:
        """The placement actor saw `link`'s replicas RUNNING and healthy before it published
        the move, so the link is up now, without waiting for a probe."""
        link.recovered(Health.PLACED)
        if link.breaker.state is not BreakerState.CLOSED:
            link.breaker.reset("placed here: running and healthy")
            link.count_transitions()
        previous = self._links.get(self._placement.get(model, ""))
        if previous is not None:
            metrics.MODEL_POOL.labels(model, previous.target.pool).set(0)
        metrics.MODEL_POOL.labels(model, link.target.pool).set(1)
        self._placement[model] = link.target.name
        logger.info("placement: %s now served by %s", model, link.target.name)


def _model_pools(config: ClusterConfig) -> list[tuple[str, tuple[str, ...]]]:
    return [(m.name, m.pools) for m in config.models]
