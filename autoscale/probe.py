"""One small VRAM probe actor per node, and free VRAM per pool from their readings.

A probe is pinned to its node (node affinity, no CPU, no GPU reserved: it only reads NVML, and
reserving a GPU would hide the memory it is meant to watch). `inject` replaces its readings
until cleared: tests and rehearsals drive placement through the same interface as real NVML.
A probe also keeps the CPU fallback's share of its node's VRAM while the fallback's engine
restarts (`policy.fallback_vram`), so that placement never fills it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autoscale.vram import (
    NodeReading,
    NvmlSource,
    VramSource,
    fallback_engine_pids,
    fallback_held_bytes,
)
from policy.fallback_vram import FallbackVram

PROBE_NAME_PREFIX = "gps-vram-probe:"
# A probe that has not answered in this long is left out of the round: a node busy enough to
# stall its probe this long is unknown, not empty.
PROBE_READ_TIMEOUT_S = 10.0


class VramProbe:
    """`source`, `engine_pids` and `clock` are NVML, /proc and the monotonic clock in the
    actor; tests hand in their own."""

    def __init__(
        self,
        node_id: str,
        source: VramSource | None = None,
        engine_pids: Callable[[Iterable[int] | None], frozenset[int]] = fallback_engine_pids,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source if source is not None else NvmlSource(node=node_id)
        self._engine_pids = engine_pids
        self._clock = clock
        self._fallback = FallbackVram()
        self._injected: NodeReading | None = None

    def read(self) -> dict[str, Any]:
        if self._injected is not None:
            return self._injected.to_json()
        reading = self._source.read()
        if reading.has_gpu:  # the fallback's share of this node's VRAM (`policy.fallback_vram`)
            # Every process only while a share is kept (a restarted engine, not yet in VRAM,
            # counts as alive); else the GPU's own processes are all that can matter.
            holders = {p.pid for gpu in reading.gpus for p in gpu.processes}
            pids = self._engine_pids(None if self._fallback.reserved_bytes else holders)
            held = fallback_held_bytes(reading, pids)
            self._fallback = self._fallback.observed(held, bool(pids), self._clock())
            reading = reading.with_fallback(self._fallback)
        return reading.to_json()

    def inject(self, reading: dict[str, Any] | None) -> None:
        """Report `reading` (NodeReading JSON) instead of NVML's, until called with None."""
        self._injected = None if reading is None else NodeReading.from_json(reading)


def pool_free_bytes(
    readings: Iterable[NodeReading], node_pools: Mapping[str, Iterable[str]]
) -> dict[str, int | None]:
    """Free VRAM per pool: the sum over its nodes' GPUs, less what the CPU fallback's engine is
    owed there while it restarts. A pool none of whose nodes reported a GPU gets None
    (unknown): placement never moves a model there."""
    free: dict[str, int | None] = {}
    for pools in node_pools.values():
        for pool in pools:
            free.setdefault(pool, None)
    for reading in readings:
        if not reading.has_gpu:
            continue
        for pool in node_pools.get(reading.node, ()):
            free[pool] = (free[pool] or 0) + reading.placeable_bytes
    return free


def start_probes(namespace: str, table: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A detached probe on every alive node of `table` (Ray's node table, read now if None; an
    existing probe is reused); handles by node id."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote_probe = ray.remote(num_cpus=0, num_gpus=0)(VramProbe)
    probes = {}
    for node in ray.nodes() if table is None else table:
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        probes[node_id] = remote_probe.options(
            name=f"{PROBE_NAME_PREFIX}{node_id}",
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(node_id)
    return probes


def pools_of(node: dict[str, Any], prefix: str = "pool_") -> frozenset[str]:
    """A node's pools, from the `pool_<name>` resources it was started with."""
    return frozenset(r[len(prefix) :] for r in node.get("Resources", {}) if r.startswith(prefix))


def node_pools() -> dict[str, set[str]]:
    """Each alive node's pools."""
    import ray

    return {node["NodeID"]: set(pools_of(node)) for node in ray.nodes() if node.get("Alive")}


@dataclass(frozen=True)
class NodeSnapshot:
    """One Ray node as the GCS and its probe see it this round."""

    node_id: str
    alive: bool
    address: str
    pools: frozenset[str]
    reading: NodeReading | None  # None: no probe answer (or the node is dead)


async def read_probes(probes: Mapping[str, Any]) -> dict[str, NodeReading]:
    """Each probe's reading, in parallel; one that fails or is late is left out."""
    replies = await asyncio.gather(
        *(asyncio.wait_for(p.read.remote(), PROBE_READ_TIMEOUT_S) for p in probes.values()),
        return_exceptions=True,
    )
    return {
        node: NodeReading.from_json(reply)
        for node, reply in zip(probes, replies, strict=True)
        if isinstance(reply, dict)
    }


class RayNodes:
    """The cluster manager's `NodeSource`: every node in Ray's node table (the dead too), with
    its probe's reading for the alive ones. A probe that cannot answer, on a node the GCS still
    calls alive, is a node to distrust: a GPU fallen off the bus hangs NVML calls."""

    async def nodes(self) -> list[NodeSnapshot]:
        import ray

        table = await asyncio.to_thread(ray.nodes)  # a GCS call: off the actor's event loop
        probes = start_probes(ray.get_runtime_context().namespace, table)
        readings = await read_probes(probes)
        return [
            NodeSnapshot(
                node_id=node["NodeID"],
                alive=bool(node.get("Alive")),
                address=str(node.get("NodeManagerAddress", "")),
                pools=pools_of(node),
                reading=readings.get(node["NodeID"]),
            )
            for node in table
        ]


class ProbeReadings:
    """The placer's `VramReadings` port: every alive node's probe (started on first use, and on
    nodes that joined since), read in parallel; a probe that fails or is late is left out."""

    async def free_bytes_by_pool(self) -> dict[str, int | None]:
        import ray

        probes = start_probes(namespace=ray.get_runtime_context().namespace)
        readings = await read_probes(probes)
        return pool_free_bytes(readings.values(), node_pools())
