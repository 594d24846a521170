"""The placement actor: reads free VRAM, decides (`placement.decide`), and carries moves out.

One detached, named actor per app, started by the router. Every `placement.interval_s` it reads
the node probes (`probe.py`), sums free VRAM per pool and asks `decide` what to change. Router
replicas pull where each model serves from it (`broadcast.py`). A move is make-before-break, so
no request is lost:

1. ask for the model's replicas on the target pool (`policy.set_replicas`: Serve's autoscaling
   policy scales that deployment alone; nothing else restarts);
2. wait until they are RUNNING and the deployment HEALTHY (past `move_timeout_s` the move is
   abandoned, the target asked back to zero, and the source keeps serving);
3. publish the new view (the role's new work goes to the target, the source is parked) and wait
   until every router replica has applied it (past `drain_timeout_s` the view is switched back
   and the move abandoned);
4. wait until no router replica holds requests on the source, queued or in flight (up to
   `drain_timeout_s`);
5. ask for zero replicas on the source.

Every move (done or abandoned) is logged, counted and recorded in the routers' status.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from autoscale.broadcast import STALE_AFTER_S, SYNC_INTERVAL_S, Broadcast
from autoscale.policy import asked_replicas, set_replicas
from autoscale.probe import node_pools, pool_free_bytes, start_probes
from autoscale.saved import (
    SavedPlacements,
    config_fingerprint,
    save_placements,
    saved_placements,
)
from autoscale.vram import NodeReading
from core.config import ClusterConfig
from core.types import DEPLOYMENT_PREFIX, Role
from policy.placement import History, ModelPlacement, Move, PlacementPolicy, decide

logger = logging.getLogger("ray.serve")

PLACER_NAME = "gps-placement"
PROBE_READ_TIMEOUT_S = 10.0
POLL_S = 1.0


def placement_matters(config: ClusterConfig) -> bool:
    """Only a model allowed on more than one pool can move."""
    return any(len(m.pools) > 1 for m in config.models)


class Placer:
    def __init__(
        self, config: ClusterConfig, app: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._app = app
        self._task: asyncio.Task[None] | None = None
        self._configure(config)

    def _configure(
        self, config: ClusterConfig, saved: SavedPlacements | None = None, version: int = 1
    ) -> None:
        """Placements (role -> pool) and moves from `saved` (made under this config), or every
        model home; the view starts at `version`."""
        saved_pools, saved_moves = (saved.pools, saved.moves) if saved else ({}, [])
        settings = config.placement
        self._config = config
        self._policy = PlacementPolicy.from_gb(
            settings.offload_below_gb,
            settings.restore_above_gb,
            settings.cooldown_s,
            settings.min_away_s,
        )
        self._fingerprint = config_fingerprint(config)
        homes = {m.role.value: m.home_pool for m in config.models}
        self._current = {
            role: pool
            for role, pool in {**homes, **saved_pools}.items()
            if role in homes and pool in config.model_for(Role(role)).pools
        }
        now = self._clock()
        away = {role for role, pool in self._current.items() if pool != homes[role]}
        # Carrying on after a restart: the history is gone, so every cooldown starts again.
        self._left_home_at: dict[str, float] = dict.fromkeys(away, now)
        self._last_change: dict[str, float] = {
            pool: now for role in away for pool in (homes[role], self._current[role])
        }
        self._broadcast = Broadcast.starting(
            {role: f"{role}@{pool}" for role, pool in self._current.items()},
            (b.name for b in config.backends),
            self._clock,
            version=version,
        )
        for move in saved_moves:
            self._broadcast.record(move)
        self._started_at = now
        self._settle_pending = saved is not None

    def _save(self) -> None:
        view = self._broadcast.view
        saved = SavedPlacements(self._fingerprint, self._current, view.version, list(view.moves))
        save_placements(self._app, saved)

    async def start(self, config: ClusterConfig) -> None:
        """Run the loop; again, from the home pools, if the config changed (a detached actor
        outlives app redeploys). Every router replica calls this as it starts, and again when
        this actor was restarted (Ray restarts it with the config it was first created with,
        which may be older): with the same config the moves made so far stand."""
        if self._task is not None and not self._task.done() and config == self._config:
            return
        if self._task is not None:
            self._task.cancel()
        saved = saved_placements(self._app)
        carried = saved if saved and saved.config == config_fingerprint(config) else None
        self._configure(config, carried, version=saved.version + 1 if saved else 1)
        if carried is None:
            # A new config starts on its home pools: asks left in the store by an earlier run
            # must not scale the fresh deployments.
            for backend in config.backends:
                home = backend.pool == config.model_for(backend.role).home_pool
                replicas = config.model_for(backend.role).replicas if home else 0
                set_replicas(self._app, backend.deployment_name, replicas)
        self._save()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # the loop must outlive any one bad round
                logger.exception("placement round failed")
            await asyncio.sleep(self._config.placement.interval_s)

    async def sync(self, replica: str, version: int, held: dict[str, int]) -> dict[str, Any]:
        """A router replica's pull: the view it applied and the jobs it holds per backend; the
        current view, with `config` null while this actor waits for `start` (restarted: the
        router then starts it with its own config and does not apply this view)."""
        view = self._broadcast.report(replica, version, held).to_json()
        return {**view, "config": self._fingerprint if self._task is not None else None}

    async def run_once(self) -> list[dict[str, Any]]:
        """One round: read, decide, carry out; the moves' records."""
        if self._clock() - self._started_at < STALE_AFTER_S:
            # Just (re)started: the router replicas have not all reported to this incarnation,
            # and an ack or drain judged on no reports would be empty.
            return []
        if self._settle_pending:
            self._settle_pending = False
            await self._settle()
        free = await self._free_bytes()
        read_at = time.time()  # wall clock: the move records are read off this actor
        models = [
            ModelPlacement(
                m.role.value, int(m.placement_priority[1]), m.pools, self._current[m.role.value]
            )
            for m in self._config.models
        ]
        history = History(dict(self._last_change), dict(self._left_home_at))
        decision = decide(free, models, history, self._clock(), self._policy)
        for hold in decision.holds:
            logger.info("placement: %s holds (%s): %s", hold.pool, hold.role, hold.reason)
        return [await self._carry_out(move, read_at) for move in decision.moves]

    async def _free_bytes(self) -> dict[str, int | None]:
        import ray

        probes = start_probes(namespace=ray.get_runtime_context().namespace)
        replies = await asyncio.gather(
            *(asyncio.wait_for(p.read.remote(), PROBE_READ_TIMEOUT_S) for p in probes.values()),
            return_exceptions=True,
        )
        readings = [NodeReading.from_json(r) for r in replies if isinstance(r, dict)]
        return pool_free_bytes(readings, node_pools())

    async def _carry_out(self, move: Move, read_at: float) -> dict[str, Any]:
        model = next(m for m in self._config.models if m.role.value == move.role)
        source, target = f"{move.role}@{move.source}", f"{move.role}@{move.target}"
        started = self._clock()
        record: dict[str, Any] = {
            "at": time.time(),
            "read_at": read_at,  # when the reading behind this move was taken
            "role": move.role,
            "from": source,
            "to": target,
            "kind": move.kind,
            "reason": move.reason,
        }
        logger.warning(
            "placement: moving %s from %s to %s (%s)", move.role, source, target, move.reason
        )
        set_replicas(self._app, DEPLOYMENT_PREFIX + target, model.replicas)
        ready = await self._wait_running(DEPLOYMENT_PREFIX + target, model.replicas)
        if not ready:
            set_replicas(self._app, DEPLOYMENT_PREFIX + target, 0)
            record.update(outcome="abandoned", seconds=round(self._clock() - started, 1))
            logger.warning(
                "placement: %s did not come up on %s in time: move abandoned; %s keeps serving",
                move.role,
                target,
                source,
            )
        elif not await self._switch(move.role, source, target):
            record.update(outcome="abandoned", seconds=round(self._clock() - started, 1))
            logger.warning(
                "placement: not every router replica switched %s to %s: move abandoned; %s "
                "keeps serving",
                move.role,
                target,
                source,
            )
        else:
            await self._until(functools.partial(self._drained, source), f"{source} drained")
            set_replicas(self._app, DEPLOYMENT_PREFIX + source, 0)
            self._current[move.role] = move.target
            now = self._clock()
            self._last_change[move.source] = self._last_change[move.target] = now
            if move.kind == "offload":
                self._left_home_at.setdefault(move.role, now)
            else:
                self._left_home_at.pop(move.role, None)
            record.update(outcome="done", seconds=round(now - started, 1))
            logger.warning("placement: %s now on %s (%.1f s)", move.role, target, record["seconds"])
        if record["outcome"] == "abandoned":
            # A failed attempt rests the pools too: the next try costs another engine start.
            self._last_change[move.source] = self._last_change[move.target] = self._clock()
        self._broadcast.record(record)
        self._save()
        return record

    async def _switch(self, role: str, source: str, target: str) -> bool:
        """Publish that `role` serves on `target`; False (and switched back, the target asked
        back to zero) if not every router replica applied it in time."""
        version = self._broadcast.move(role, source, target)
        self._save()  # a restart must publish later versions than this one
        if await self._until(lambda: self._broadcast.applied(version), f"routers on {target}"):
            return True
        back = self._broadcast.move(role, target, source)
        self._save()
        await self._until(lambda: self._broadcast.applied(back), f"routers back on {source}")
        await self._until(functools.partial(self._drained, target), f"{target} drained")
        set_replicas(self._app, DEPLOYMENT_PREFIX + target, 0)
        return False

    async def _settle(self) -> None:
        """After a restart: a move cut short may have left replicas asked for on a backend the
        model is not placed on. Once the routers follow this view and hold nothing there, ask
        for zero."""
        leftovers = []
        for backend in self._config.backends:
            name = backend.deployment_name
            if self._current[backend.role.value] == backend.pool:
                set_replicas(self._app, name, self._config.model_for(backend.role).replicas)
            elif asked_replicas(self._app, name):
                leftovers.append(backend)
        if not leftovers:
            return
        version = self._broadcast.view.version
        await self._until(lambda: self._broadcast.applied(version), "routers on this view")
        for backend in leftovers:
            await self._until(functools.partial(self._drained, backend.name), backend.name)
            set_replicas(self._app, backend.deployment_name, 0)
            logger.warning(
                "placement: %s was left up by a cut-short move: scaled to zero", backend.name
            )

    def _drained(self, backend: str) -> bool:
        return self._broadcast.held(backend) == 0

    async def _wait_running(self, deployment: str, replicas: int) -> bool:
        from ray import serve

        deadline = self._clock() + self._config.placement.move_timeout_s
        while self._clock() < deadline:
            status = await asyncio.to_thread(serve.status)
            app = status.applications.get(self._app)
            info = app.deployments.get(deployment) if app else None
            if (
                info
                and info.replica_states.get("RUNNING", 0) >= replicas
                and (str(info.status.value) == "HEALTHY")
            ):
                return True
            await asyncio.sleep(POLL_S)
        return False

    async def _until(self, done: Callable[[], bool], what: str) -> bool:
        """Wait for the router replicas' reports to show `done`, up to `drain_timeout_s`."""
        deadline = self._clock() + self._config.placement.drain_timeout_s
        while not done():
            if self._clock() >= deadline:
                logger.warning("placement: gave up waiting for %s", what)
                return False
            await asyncio.sleep(SYNC_INTERVAL_S / 2)
        return True


def ensure_placer(config: ClusterConfig, app: str, namespace: str) -> Any:
    """The app's placement actor, started (or restarted with this config) if it matters."""
    import ray

    remote_placer = ray.remote(num_cpus=0)(Placer)
    actor = remote_placer.options(
        name=f"{PLACER_NAME}:{app}",
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
    ).remote(config, app)
    actor.start.remote(config)
    return actor
