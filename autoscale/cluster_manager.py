"""The cluster manager: notices a pool whose machines died, drains it, has it replaced.

One detached, named actor per app beside the placement actor, started the same way (by the
router replicas, on the gateway's nodes). Every `cluster_manager.interval_s` it reads each pool's
nodes (alive or dead in the GCS, and their probe: NVML readable, GPUs present where the pool's
models need them, no fatal Xid or uncorrectable ECC error) and asks `policy.pool_health.step`
what each pool becomes. It records the events (bounded, newest last; each also POSTed to
`cluster_manager.webhook_url`), runs the pool's provisioner as a task of its own (a provisioner
never blocks the loop; a timed-out one is cancelled, its process group killed), and answers:

- the routers (`report`, pulled every few seconds): pool states, nodes and events for
  `/v1/cluster/status`, `/healthz` and the metrics; routers send no new work to an unhealthy pool;
- the placement actor (`unhealthy_pools`, every round): it evacuates their models to the next
  pool on each model's list, and restores them home once the pool is healthy again.

State is in memory: a restarted manager relearns the pools from the nodes within a round, and a
pool still dead is declared so again after `dead_after_s`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from autoscale.pool_states import MANAGER_NAME, manager_actor_name
from autoscale.probe import NodeSnapshot, RayNodes
from autoscale.provisioners import (
    Provisioner,
    ProvisionFailed,
    ProvisionRequest,
    StandingRequest,
    provisioner_for,
)
from autoscale.vram import NodeReading
from core.clock import Clock, SystemClock
from core.config import ClusterConfig
from policy import pool_health
from policy.pool_health import EventType, PoolFacts, PoolRecord, PoolState, ProvisionOutcome

logger = logging.getLogger("ray.serve")

# Rounds in a row a live node's probe may be late before the node counts as unsound. A probe
# is one small actor call with a 10 s timeout: on a loaded node (a replica starting beside it)
# one reply can be late, and a pool declared unhealthy for it is a false alarm to the webhook.
# A GPU fallen off the bus hangs every read, so it is still caught, one round later.
PROBE_MISSES_FORGIVEN = 1


class NodeSource(Protocol):
    async def nodes(self) -> list[NodeSnapshot]: ...


class EventSink(Protocol):
    def send(self, event: Mapping[str, Any]) -> None:
        """Deliver one event elsewhere without blocking (the webhook)."""
        ...


@dataclass(frozen=True)
class ManagerPorts:
    nodes: NodeSource
    provisioners: Mapping[str, Provisioner]  # by pool
    clock: Clock
    ray_address: str  # what a new node joins (GPS_RAY_ADDRESS)
    events: EventSink | None = None


def pools_needing_gpu(config: ClusterConfig) -> frozenset[str]:
    """Pools that serve some GPU model: a node there without a readable GPU cannot serve."""
    return frozenset(p for m in config.models if m.device == "gpu" for p in m.pools)


def recovery_policy(config: ClusterConfig, pool: str) -> pool_health.RecoveryPolicy:
    settings = config.cluster_manager
    return pool_health.RecoveryPolicy(
        dead_after_s=settings.dead_after_s,
        provision_timeout_s=settings.provision_timeout_s,
        max_attempts=settings.max_attempts,
        backoff_s=settings.backoff_s,
        can_provision=config.pool(pool).provisioner.type != "none",
    )


class ClusterManager:
    def __init__(self, config: ClusterConfig, app: str, ports: ManagerPorts | None = None) -> None:
        self._given_ports = ports
        self._task: asyncio.Task[None] | None = None
        self._reset(config)

    def _reset(self, config: ClusterConfig) -> None:
        self._ports = self._given_ports or ray_ports(config)  # provisioners follow the config
        self._clock = self._ports.clock
        self._config = config
        self._records = {p.name: PoolRecord() for p in config.pools}
        self._nodes: dict[str, list[NodeSnapshot]] = {p.name: [] for p in config.pools}
        self._events: deque[dict[str, Any]] = deque(maxlen=config.cluster_manager.max_events)
        self._seq = 0
        self._outcomes: dict[str, ProvisionOutcome] = {}
        self._provisioning: dict[str, asyncio.Task[None]] = {}
        self._loop_errors = 0
        self._last_readings: dict[str, NodeReading] = {}
        self._probe_misses: dict[str, int] = {}

    async def start(self, config: ClusterConfig) -> None:
        """Run the loop (once; with a new config, from fresh records)."""
        if self._task is not None and not self._task.done() and config == self._config:
            return
        await self.stop()
        if config != self._config:
            self._reset(config)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        for task in (self._task, *self._provisioning.values()):
            if task is not None:
                task.cancel()
        self._provisioning.clear()

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # the loop must outlive any one bad round: log, count, go on
                logger.exception("cluster manager round failed")
                self._loop_errors += 1
            await self._clock.sleep(self._config.cluster_manager.interval_s)

    async def run_once(self) -> None:
        snapshots = self._forgive_late_probes(await self._ports.nodes.nodes())
        needs_gpu = pools_needing_gpu(self._config)
        now = self._clock.monotonic()
        for pool, record in self._records.items():
            # The GCS forgets a dead node's resources: it stays the pool's if it was seen there.
            known = record.known_nodes or frozenset()
            nodes = [
                s for s in snapshots if pool in s.pools or (not s.alive and s.node_id in known)
            ]
            self._nodes[pool] = nodes
            facts = PoolFacts(
                tuple(_node_fact(s, pool in needs_gpu) for s in nodes),
                self._outcomes.pop(pool, None),
            )
            result = pool_health.step(record, facts, now, recovery_policy(self._config, pool))
            self._records[pool] = result.record
            for event in result.events:
                self._record_event(pool, event)
            for action in result.actions:
                self._act(pool, action)

    def _forgive_late_probes(self, snapshots: list[NodeSnapshot]) -> list[NodeSnapshot]:
        """A live node whose probe did not answer this round keeps its last reading, for
        `PROBE_MISSES_FORGIVEN` rounds in a row."""
        kept = []
        for snapshot in snapshots:
            node = snapshot.node_id
            if snapshot.reading is not None:
                self._last_readings[node] = snapshot.reading
                self._probe_misses.pop(node, None)
            elif not snapshot.alive:
                self._last_readings.pop(node, None)
                self._probe_misses.pop(node, None)
            else:
                misses = self._probe_misses[node] = self._probe_misses.get(node, 0) + 1
                last = self._last_readings.get(node)
                if last is not None and misses <= PROBE_MISSES_FORGIVEN:
                    snapshot = replace(snapshot, reading=last)
            kept.append(snapshot)
        return kept

    def _record_event(self, pool: str, event: pool_health.Event) -> None:
        self._seq += 1
        entry: dict[str, Any] = {
            "seq": self._seq,
            "type": event.type.value,
            "pool": pool,
            "at": self._clock.wall(),
            "detail": event.detail,
        }
        if event.seconds is not None:
            entry["seconds"] = round(event.seconds, 1)
        self._events.append(entry)
        log = logger.info if event.type is EventType.NODE_JOINED else logger.warning
        log("cluster manager: %s %s: %s", event.type.value, pool, event.detail)
        if self._ports.events is not None:
            self._ports.events.send(entry)

    def _act(
        self, pool: str, action: pool_health.Provision | pool_health.CancelProvisioning
    ) -> None:
        match action:
            case pool_health.Provision(attempt):
                request = ProvisionRequest(
                    pool=pool,
                    resource=self._config.pool(pool).resource,
                    nodes=_nodes_wanted(self._config, pool),
                    ray_address=self._ports.ray_address,
                    attempt=attempt,
                )
                task = asyncio.create_task(self._provision(request))
                self._provisioning[pool] = task
            case pool_health.CancelProvisioning():
                task_ = self._provisioning.pop(pool, None)
                if task_ is not None:
                    task_.cancel()

    async def _provision(self, request: ProvisionRequest) -> None:
        provisioner = self._ports.provisioners[request.pool]
        try:
            result = await provisioner.provision(request)
        except ProvisionFailed as error:
            outcome = ProvisionOutcome(request.attempt, ok=False, detail=str(error))
        except Exception as error:  # a provisioner's bug is one failed attempt, not the loop's end
            logger.exception("provisioner of %s failed", request.pool)
            outcome = ProvisionOutcome(request.attempt, ok=False, detail=repr(error))
        else:
            outcome = ProvisionOutcome(request.attempt, ok=True, detail=result.detail)
        self._outcomes[request.pool] = outcome

    def unhealthy_pools(self) -> list[str]:
        return sorted(pool_health.unhealthy(self._records.items()))

    def report(self) -> dict[str, Any]:
        """Pools, their nodes and the events, for the routers' status and metrics."""
        pools = {}
        for name, record in self._records.items():
            nodes = self._nodes[name]
            pools[name] = {
                "state": record.state.value,
                "reason": record.reason,
                "provisioner": self._config.pool(name).provisioner.type,
                "attempt": record.attempt,
                "nodes": [{"node_id": s.node_id, "address": s.address} for s in nodes if s.alive],
                "dead_nodes": sum(1 for s in nodes if not s.alive),
            }
        return {"pools": pools, "events": list(self._events), "loop_errors": self._loop_errors}


def _node_fact(snapshot: NodeSnapshot, needs_gpu: bool) -> pool_health.NodeFact:
    reading = snapshot.reading
    return pool_health.node_fact(
        snapshot.node_id,
        alive=snapshot.alive,
        probe_answered=reading is not None,
        needs_gpu=needs_gpu,
        has_gpu=reading is not None and reading.has_gpu,
        nvml_error=reading.error if reading is not None else None,
        faults=reading.faults if reading is not None else (),
    )


def _nodes_wanted(config: ClusterConfig, pool: str) -> int:
    provisioner = config.pool(pool).provisioner
    return getattr(provisioner, "nodes", 1)


def ray_ports(config: ClusterConfig) -> ManagerPorts:
    """The real ports: Ray's node table and probes, the configured provisioners, the webhook."""
    import ray

    from autoscale.webhook import WebhookSender

    standing = StandingRequest()
    url = config.cluster_manager.webhook_url
    return ManagerPorts(
        nodes=RayNodes(),
        provisioners={
            p.name: provisioner_for(p.provisioner, config.base_dir, standing) for p in config.pools
        },
        clock=SystemClock(),
        ray_address=ray.get_runtime_context().gcs_address,
        events=WebhookSender(url) if url else None,
    )


def ensure_cluster_manager(config: ClusterConfig, app: str, namespace: str) -> Any:
    """The app's cluster manager, started (or restarted with this config) on the gateway's
    nodes."""
    import ray

    remote_manager = ray.remote(num_cpus=0)(ClusterManager)
    actor = remote_manager.options(
        name=manager_actor_name(app),
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        resources=config.gateway_resources,
    ).remote(config, app)
    actor.start.remote(config)
    return actor


__all__ = [
    "MANAGER_NAME",
    "ClusterManager",
    "EventSink",
    "ManagerPorts",
    "NodeSnapshot",
    "NodeSource",
    "PoolState",
    "ensure_cluster_manager",
    "pools_needing_gpu",
]
