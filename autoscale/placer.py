"""The placement actor: reads free VRAM, decides (`placement.decide`), and carries moves out.

One detached, named actor per app, started by the router. Every `placement.interval_s` it reads
the node probes (`probe.py`), sums free VRAM per pool and asks `decide` what to change. Router
replicas pull where each model serves from it (`broadcast.py`). A move is make-before-break, so
no request is lost:

An evacuation (off a pool the cluster manager declared down) first asks the source for zero,
and gives up if that pool is healthy again before the target is up (`policy.moves`).

1. ask for the model's replicas on the target pool (`policy.set_replicas`: Serve's autoscaling
   policy scales that deployment alone; nothing else restarts);
2. wait until they are RUNNING and the deployment HEALTHY (past `move_timeout_s` the move is
   abandoned, the target asked back to zero, and the source keeps serving);
3. publish the new view (the model's new work goes to the target, the source is parked) and wait
   until every router replica has applied it (past `drain_timeout_s` the view is switched back
   and the move abandoned);
4. wait until no router replica holds requests on the source, queued or in flight (up to
   `drain_timeout_s`);
5. ask for zero replicas on the source.

Every move (done or abandoned) is logged, counted and recorded in the routers' status.

The decisions are pure (`policy.placement.decide`, the steps of `policy.moves`); this actor only
gathers their facts and carries them out, through the ports in `ports.py`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from autoscale.broadcast import STALE_AFTER_S, Broadcast
from autoscale.metrics import LOOP_ERRORS
from autoscale.pool_states import ManagerPoolHealth
from autoscale.ports import PlacerPorts
from autoscale.probe import ProbeReadings
from autoscale.saved import KvPlacementStore, SavedPlacements, config_fingerprint
from autoscale.serve_scaling import KvReplicaScaler
from autoscale.serve_status import ServeDeploymentStatus
from core.clock import SystemClock
from core.config import ClusterConfig
from core.types import DEPLOYMENT_PREFIX
from core.wire import SYNC_INTERVAL_S
from policy import moves
from policy.placement import History, ModelPlacement, Move, PlacementPolicy, decide

logger = logging.getLogger("ray.serve")

PLACER_NAME = "gps-placement"
POLL_S = 1.0  # between looks at a target coming up: Serve's status is a call to its controller

_ABANDONED_LOGS = {
    moves.AbandonedBecause.TARGET_NOT_UP: (
        "placement: %s did not come up on %s in time: move abandoned; %s keeps serving"
    ),
    moves.AbandonedBecause.ROUTERS_NOT_SWITCHED: (
        "placement: not every router replica switched %s to %s: move abandoned; %s keeps serving"
    ),
    moves.AbandonedBecause.SOURCE_BACK: (
        "placement: %s: the source pool recovered before %s came up: evacuation abandoned; %s "
        "starts again"
    ),
}


def placement_matters(config: ClusterConfig) -> bool:
    """Only a model allowed on more than one pool can move."""
    return any(len(m.pools) > 1 for m in config.models)


def ray_ports(app: str) -> PlacerPorts:
    """The real ports: probes on every node, Serve's status, Ray's key-value store."""
    return PlacerPorts(
        vram=ProbeReadings(),
        deployments=ServeDeploymentStatus(app),
        replicas=KvReplicaScaler(app),
        store=KvPlacementStore(app),
        clock=SystemClock(),
        pools=ManagerPoolHealth(app),
    )


class Placer:
    def __init__(self, config: ClusterConfig, app: str, ports: PlacerPorts | None = None) -> None:
        self._ports = ports if ports is not None else ray_ports(app)
        self._clock = self._ports.clock
        self._task: asyncio.Task[None] | None = None
        self._loop_errors = 0  # failed rounds, reported to the routers with each view
        self._configure(config)

    def _configure(
        self, config: ClusterConfig, saved: SavedPlacements | None = None, version: int = 1
    ) -> None:
        """Placements (model -> pool) and moves from `saved` (made under this config), or every
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
        self._limits = moves.MoveLimits(
            settings.move_timeout_s, settings.drain_timeout_s, POLL_S, SYNC_INTERVAL_S / 2
        )
        self._fingerprint = config_fingerprint(config)
        homes = {m.name: m.home_pool for m in config.models}
        self._current = {
            name: pool
            for name, pool in {**homes, **saved_pools}.items()
            if name in homes and pool in config.model_named(name).pools
        }
        now = self._clock.monotonic()
        self._history = History.resumed(homes, self._current, now)
        self._broadcast = Broadcast.starting(
            {name: f"{name}@{pool}" for name, pool in self._current.items()},
            (b.name for b in config.backends),
            self._clock.monotonic,
            version=version,
        )
        for move in saved_moves:
            self._broadcast.record(move)
        self._started_at = now
        self._settle_pending = saved is not None

    def _save(self) -> None:
        view = self._broadcast.view
        saved = SavedPlacements(self._fingerprint, self._current, view.version, list(view.moves))
        self._ports.store.save(saved)

    async def start(self, config: ClusterConfig) -> None:
        """Run the loop; again, from the home pools, if the config changed (a detached actor
        outlives app redeploys). Every router replica calls this as it starts, and again when
        this actor was restarted (Ray restarts it with the config it was first created with,
        which may be older): with the same config the moves made so far stand."""
        if self._task is not None and not self._task.done() and config == self._config:
            return
        if self._task is not None:
            self._task.cancel()
        saved = self._ports.store.load()
        carried = saved if saved and saved.config == config_fingerprint(config) else None
        self._configure(config, carried, version=saved.version + 1 if saved else 1)
        if carried is None:
            # A new config starts on its home pools: asks left in the store by an earlier run
            # must not scale the fresh deployments.
            for backend in config.backends:
                model = config.model_named(backend.model)
                replicas = model.replicas if backend.pool == model.home_pool else 0
                self._ports.replicas.set_replicas(backend.deployment_name, replicas)
        self._save()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop the loop (a detached actor otherwise runs it until killed)."""
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # the loop must outlive any one bad round: log, count, go on
                logger.exception("placement round failed")
                LOOP_ERRORS.labels(loop="placement").inc()
                self._loop_errors += 1
            await self._clock.sleep(self._config.placement.interval_s)

    async def sync(self, replica: str, version: int, held: dict[str, int]) -> dict[str, Any]:
        """A router replica's pull: the view it applied and the jobs it holds per backend; the
        current view, with `config` null while this actor waits for `start` (restarted: the
        router then starts it with its own config and does not apply this view)."""
        view = self._broadcast.report(replica, version, held).to_json()
        view["loop_errors"] = self._loop_errors
        return {**view, "config": self._fingerprint if self._task is not None else None}

    async def run_once(self) -> list[dict[str, Any]]:
        """One round: read, decide, carry out; the moves' records."""
        if self._clock.monotonic() - self._started_at < STALE_AFTER_S:
            # Just (re)started: the router replicas have not all reported to this incarnation,
            # and an ack or drain judged on no reports would be empty.
            return []
        if self._settle_pending:
            self._settle_pending = False
            await self._settle()
        free = await self._ports.vram.free_bytes_by_pool()
        down = await self._ports.pools.unhealthy_pools()
        read_at = self._clock.wall()  # wall clock: the move records are read off this actor
        decision = decide(
            free, self._placements(), self._history, self._clock.monotonic(), self._policy, down
        )
        for hold in decision.holds:
            logger.info("placement: %s holds (%s): %s", hold.pool, hold.model, hold.reason)
        return [await self._carry_out(move, read_at) for move in decision.moves]

    def _placements(self) -> list[ModelPlacement]:
        return [
            ModelPlacement(m.name, int(m.placement_priority[1]), m.pools, self._current[m.name])
            for m in self._config.models
        ]

    async def _carry_out(self, move: Move, read_at: float) -> dict[str, Any]:
        """Make-before-break (`policy.moves`), step by step; the move's record."""
        replicas = self._config.model_named(move.model).replicas
        plan = moves.MovePlan(
            move.model,
            f"{move.model}@{move.source}",
            f"{move.model}@{move.target}",
            replicas,
            evacuation=move.kind == "evacuate",
        )
        record: dict[str, Any] = {
            "at": self._clock.wall(),
            "read_at": read_at,  # when the reading behind this move was taken
            "model": move.model,
            "from": plan.source,
            "to": plan.target,
            "kind": move.kind,
            "reason": move.reason,
        }
        logger.warning(
            "placement: moving %s from %s to %s (%s)",
            move.model,
            plan.source,
            plan.target,
            move.reason,
        )
        state = moves.begin(plan, self._clock.monotonic())
        while True:
            now = self._clock.monotonic()
            next_step = moves.step(state, await self._move_facts(state), now, self._limits)
            for what in next_step.gave_up_on:
                logger.warning("placement: gave up waiting for %s", what)
            state = next_step.state
            if isinstance(next_step.action, moves.Finish):
                return self._finish(move, plan, next_step.action, record, now)
            await self._act(next_step.action)

    async def _move_facts(self, state: moves.MoveState) -> moves.MoveFacts:
        plan = state.plan
        target = None
        source_back = False
        if state.watches_target:
            target = await self._ports.deployments.health(DEPLOYMENT_PREFIX + plan.target)
            if plan.evacuation:
                source_back = await self._source_back(plan)
        return moves.MoveFacts(
            target_running=target.running if target else 0,
            target_healthy=target.healthy if target else False,
            source_back=source_back,
            # During a move the latest view is the one it published (moves run one at a time).
            views_applied=self._broadcast.applied(self._broadcast.view.version),
            source_held=self._broadcast.held(plan.source),
            target_held=self._broadcast.held(plan.target),
        )

    async def _source_back(self, plan: moves.MovePlan) -> bool:
        """An evacuation's source pool is healthy again (the cluster manager says so)."""
        pool = plan.source.split("@", 1)[1]
        return pool not in await self._ports.pools.unhealthy_pools()

    async def _act(self, action: moves.ScaleTo | moves.Publish | moves.Wait) -> None:
        match action:
            case moves.ScaleTo(backend, replicas):
                self._ports.replicas.set_replicas(DEPLOYMENT_PREFIX + backend, replicas)
            case moves.Publish(model, serving, parked):
                self._broadcast.move(model, parked, serving)
                self._save()  # a restart must publish later versions than this one
            case moves.Wait(seconds):
                await self._clock.sleep(seconds)

    def _finish(
        self,
        move: Move,
        plan: moves.MovePlan,
        finish: moves.Finish,
        record: dict[str, Any],
        now: float,
    ) -> dict[str, Any]:
        record.update(outcome=finish.outcome, seconds=finish.seconds)
        if finish.because is None:
            self._current[move.model] = move.target
            self._history = self._history.after_move(move, now)
            logger.warning(
                "placement: %s now on %s (%.1f s)", move.model, plan.target, finish.seconds
            )
        else:
            self._history = self._history.after_abandoned_move(move, now)
            logger.warning(_ABANDONED_LOGS[finish.because], move.model, plan.target, plan.source)
        self._broadcast.record(record)
        self._save()
        return record

    async def _settle(self) -> None:
        """After a restart: a move cut short may have left replicas asked for on a backend the
        model is not placed on. Once the routers follow this view and hold nothing there, ask
        for zero."""
        leftovers = []
        scaler = self._ports.replicas
        for backend in self._config.backends:
            name = backend.deployment_name
            if self._current[backend.model] == backend.pool:
                scaler.set_replicas(name, self._config.model_named(backend.model).replicas)
            elif scaler.asked_replicas(name):
                leftovers.append(backend)
        if not leftovers:
            return
        version = self._broadcast.view.version
        await self._until(lambda: self._broadcast.applied(version), "routers on this view")
        for backend in leftovers:
            await self._until(functools.partial(self._drained, backend.name), backend.name)
            scaler.set_replicas(backend.deployment_name, 0)
            logger.warning(
                "placement: %s was left up by a cut-short move: scaled to zero", backend.name
            )

    def _drained(self, backend: str) -> bool:
        return self._broadcast.held(backend) == 0

    async def _until(self, done: Callable[[], bool], what: str) -> bool:
        """Wait for the router replicas' reports to show `done`, up to `drain_timeout_s`."""
        deadline = self._clock.monotonic() + self._config.placement.drain_timeout_s
        while not done():
            if self._clock.monotonic() >= deadline:
                logger.warning("placement: gave up waiting for %s", what)
                return False
            await self._clock.sleep(SYNC_INTERVAL_S / 2)
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
        resources=config.gateway_resources,
    ).remote(config, app)
    actor.start.remote(config)
    return actor
