"""The placement actor's class, driven in-process through fake ports: no Ray, no Serve, and a
clock the fakes turn. Its loop, `decide` and the move steps are the product's own; the fakes
stand in for the probes, Serve, the replica store, the saved state and one router replica."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoscale.metrics import REGISTRY
from autoscale.placer import Placer
from autoscale.ports import DeploymentHealth, PlacerPorts
from autoscale.saved import SavedPlacements
from core.config import ClusterConfig, parse_config
from core.types import GIB
from tests.fakes.clock import FakeClock

LOCAL, CLOUD = "model:reasoning@local", "model:reasoning@cloud"
STARTUP_S = 40.0  # how long a fake deployment takes to be RUNNING and HEALTHY once asked for
CONFIG: ClusterConfig = parse_config(
    {
        "pools": [{"name": "local", "kind": "local"}, {"name": "cloud", "kind": "cloud"}],
        "models": [
            {
                "role": "orchestrator",
                "source": "m",
                "context_window": 2048,
                "placement_priority": "P0",
                "pools": ["local"],
            },
            {
                "role": "reasoning",
                "source": "m",
                "context_window": 2048,
                "placement_priority": "P3",
                "pools": ["local", "cloud"],
            },
        ],
        "fallback": {"source": "f.gguf"},
        "placement": {
            "interval_s": 15,
            "offload_below_gb": 6,
            "restore_above_gb": 12,
            "cooldown_s": 120,
            "min_away_s": 60,
            "move_timeout_s": 300,
            "drain_timeout_s": 60,
        },
    },
    base_dir=Path("."),
    environ={},
)


@dataclass
class FakeVram:
    """Free GB per pool from each time on: [(since, {pool: gb})]; or an error every read."""

    clock: FakeClock
    schedule: Sequence[tuple[float, Mapping[str, float]]] = ()
    error: Exception | None = None

    async def free_bytes_by_pool(self) -> Mapping[str, int | None]:
        if self.error is not None:
            raise self.error
        free = [gb for since, gb in self.schedule if since <= self.clock.now][-1]
        return {pool: int(gb * GIB) for pool, gb in free.items()}


@dataclass
class FakeCluster:
    """Serve's deployments and the replica store: an asked-for deployment is up `STARTUP_S`
    later, unless it is `broken`."""

    clock: FakeClock
    broken: frozenset[str] = frozenset()
    asked: dict[str, int] = field(default_factory=dict)
    asked_at: dict[str, float] = field(default_factory=dict)
    log: list[tuple[float, str, int]] = field(default_factory=list)

    def set_replicas(self, deployment: str, replicas: int) -> None:
        self.asked[deployment], self.asked_at[deployment] = replicas, self.clock.now
        self.log.append((self.clock.now, deployment, replicas))

    def asked_replicas(self, deployment: str) -> int | None:
        return self.asked.get(deployment)

    def running(self, deployment: str) -> int:
        started = self.clock.now - self.asked_at.get(deployment, 0.0) >= STARTUP_S
        return self.asked.get(deployment, 0) if started and deployment not in self.broken else 0

    async def health(self, deployment: str) -> DeploymentHealth:
        running = self.running(deployment)
        return DeploymentHealth(running, healthy=running > 0)


@dataclass
class FakeStore:
    saved: SavedPlacements | None = None

    def load(self) -> SavedPlacements | None:
        return self.saved

    def save(self, saved: SavedPlacements) -> None:
        self.saved = saved


@dataclass
class FakeRouter:
    """One router replica: syncs on every tick, sends the role's work where its view says, and
    holds one job on a backend until `busy_until` (its own clock time) when told to."""

    placer: Placer
    cluster: FakeCluster
    clock: FakeClock
    busy_until: dict[str, float] = field(default_factory=dict)
    version: int = 0
    serving: str = ""
    lost: list[str] = field(default_factory=list)  # work sent where nothing was running

    async def sync(self) -> None:
        held = {b: 1 for b, until in self.busy_until.items() if self.clock.now < until}
        for backend in held:
            if self.cluster.running("model:" + backend) == 0:
                self.lost.append(f"{backend} held at {self.clock.now}")
        view = await self.placer.sync("router-1", self.version, held)
        if view["config"] is not None:
            self.version, self.serving = view["version"], view["placements"]["reasoning"]
        if self.cluster.running("model:" + self.serving) == 0:
            self.lost.append(f"{self.serving} routed to at {self.clock.now}")


@dataclass
class Rig:
    placer: Placer
    clock: FakeClock
    vram: FakeVram
    cluster: FakeCluster
    router: FakeRouter
    store: FakeStore

    async def run_until(self, until: float) -> None:
        """Let the placer's loop run until the clock reaches `until`."""
        for _ in range(1_000_000):
            if self.clock.now >= until:
                return
            await asyncio.sleep(0)
        raise AssertionError("the placer's loop stopped turning the clock")

    def moves(self) -> list[tuple[Any, ...]]:
        moves = self.store.saved.moves if self.store.saved else []
        return [(m["seq"], m["kind"], m["from"], m["to"], m["outcome"]) for m in moves]


@dataclass
class FakePools:
    """The cluster manager's verdict: pools declared down."""

    down: frozenset[str] = frozenset()

    async def unhealthy_pools(self) -> frozenset[str]:
        return self.down


def rig(broken: frozenset[str] = frozenset(), pools: FakePools | None = None) -> Rig:
    clock = FakeClock(0.0, advance=True)
    vram = FakeVram(clock, [(0, {"local": 20, "cloud": 40})])
    cluster = FakeCluster(clock, broken)
    store = FakeStore()
    ports = PlacerPorts(vram, cluster, cluster, store, clock, pools or FakePools())
    placer = Placer(CONFIG, "app", ports)
    router = FakeRouter(placer, cluster, clock)
    clock.on_tick.append(router.sync)
    return Rig(placer, clock, vram, cluster, router, store)


async def started(broken: frozenset[str] = frozenset(), pools: FakePools | None = None) -> Rig:
    setup = rig(broken, pools)
    await setup.placer.start(CONFIG)
    setup.clock.now = STARTUP_S  # the home deployments came up with the app
    await setup.router.sync()
    return setup


def test_a_model_moves_out_make_before_break_and_back_after_hysteresis() -> None:
    async def scenario() -> Rig:
        setup = await started()
        setup.router.busy_until["reasoning@local"] = 120.0  # a long job on the source
        setup.vram.schedule = [
            (0, {"local": 2, "cloud": 40}),  # short on local: reasoning goes
            (130, {"local": 8, "cloud": 40}),  # between the thresholds: it stays away
            (400, {"local": 30, "cloud": 40}),  # plenty: it comes back
        ]
        await setup.run_until(399)
        assert setup.moves() == [(1, "offload", "reasoning@local", "reasoning@cloud", "done")]
        await setup.run_until(600)
        await setup.placer.stop()
        return setup

    setup = asyncio.run(scenario())
    assert setup.moves() == [
        (1, "offload", "reasoning@local", "reasoning@cloud", "done"),
        (2, "restore", "reasoning@cloud", "reasoning@local", "done"),
    ]
    assert [(d, n) for _, d, n in setup.cluster.log if d in (LOCAL, CLOUD)] == [
        (LOCAL, 1),
        (CLOUD, 0),  # start: every model home
        (CLOUD, 1),  # the offload: target first,
        (LOCAL, 0),  # the source only once drained
        (LOCAL, 1),  # the restore, the same way round
        (CLOUD, 0),
    ]
    source_dropped_at = next(t for t, d, n in setup.cluster.log if (d, n) == (LOCAL, 0))
    assert source_dropped_at >= 120.0  # the long job on the source finished first
    assert setup.router.lost == []  # never routed to, nor held on, a deployment that was down
    assert setup.router.serving == "reasoning@local"
    assert setup.store.saved is not None
    assert setup.store.saved.pools["reasoning"] == "local"


def test_a_target_that_never_comes_up_is_abandoned_and_the_source_keeps_serving() -> None:
    async def scenario() -> Rig:
        setup = await started(broken=frozenset({CLOUD}))
        setup.vram.schedule = [(0, {"local": 2, "cloud": 40})]
        await setup.run_until(CONFIG.placement.move_timeout_s + 100)
        await setup.placer.stop()
        return setup

    setup = asyncio.run(scenario())
    assert setup.moves() == [(1, "offload", "reasoning@local", "reasoning@cloud", "abandoned")]
    asks = [(t, d, n) for t, d, n in setup.cluster.log if d == CLOUD][1:]  # past the start's
    (asked_at, _, _), (dropped_at, _, _) = asks
    assert [n for _, _, n in asks] == [1, 0]
    assert dropped_at - asked_at >= CONFIG.placement.move_timeout_s
    assert setup.router.serving == "reasoning@local"
    assert setup.router.lost == []
    assert setup.cluster.asked[LOCAL] == 1
    # The failed attempt rests both pools: no new try before the cooldown is over.
    assert setup.clock.now - dropped_at < CONFIG.placement.cooldown_s


def test_a_failing_vram_source_is_counted_and_the_loop_goes_on() -> None:
    def errors() -> float:
        return REGISTRY.get_sample_value("gps_loop_errors_total", {"loop": "placement"}) or 0.0

    async def scenario() -> Rig:
        setup = await started()
        setup.vram.error = RuntimeError("probe unreachable")
        await setup.run_until(STARTUP_S + 3 * CONFIG.placement.interval_s)
        await setup.placer.stop()
        return setup

    before = errors()
    setup = asyncio.run(scenario())
    assert errors() - before == 3  # one per round since the start settled; the loop lived on
    assert setup.moves() == []
    # The routers are told, with each view: the actor's own registry is never scraped.
    reply = asyncio.run(setup.placer.sync("router-1", 0, {}))
    assert reply["loop_errors"] == 3


def test_a_dead_pool_is_evacuated_and_an_evacuation_stops_when_its_source_comes_back() -> None:
    async def scenario(back_at: float | None) -> Rig:
        pools = FakePools()
        setup = await started(pools=pools)
        pools.down = frozenset({"local"})  # local's nodes died (its replicas "run" on here)
        if back_at is None:
            await setup.run_until(STARTUP_S + 120)
        else:
            await setup.run_until(STARTUP_S + back_at)
            pools.down = frozenset()
            await setup.run_until(STARTUP_S + 120)
        await setup.placer.stop()
        return setup

    gone = asyncio.run(scenario(back_at=None))
    local, cloud = "reasoning@local", "reasoning@cloud"
    assert gone.moves() == [(1, "evacuate", local, cloud, "done")]
    assert gone.router.serving == cloud
    back = asyncio.run(scenario(back_at=20))
    assert back.moves() == [(1, "evacuate", local, cloud, "abandoned")]
    assert back.router.serving == local
    assert back.cluster.asked[CLOUD] == 0
    assert back.cluster.asked[LOCAL] == 1
