"""Free VRAM per pool from the probes' readings, and the probe's injection interface."""

from __future__ import annotations

from collections.abc import Iterable

from autoscale.probe import VramProbe, pool_free_bytes
from autoscale.vram import GpuProcess, GpuReading, NodeReading
from core.types import GIB
from policy.fallback_vram import FORGET_AFTER_S, FallbackVram


def test_free_vram_per_pool_sums_its_nodes_and_unknown_stays_unknown() -> None:
    gpu = GpuReading(0, "H100", 80 * GIB, 70 * GIB, 10 * GIB)
    readings = [
        NodeReading("a", (gpu,)),
        NodeReading("b", (gpu, gpu)),
        NodeReading("c", error="no NVIDIA GPU readable: driver not loaded"),
    ]
    pools = {"a": {"local"}, "b": {"local", "mesh"}, "c": {"cloud"}}
    assert pool_free_bytes(readings, pools) == {
        "local": 30 * GIB,
        "mesh": 20 * GIB,
        "cloud": None,
    }
    probe = VramProbe("a")  # the actor's class, used in-process
    probe.inject(readings[0].to_json())
    assert NodeReading.from_json(probe.read()) == readings[0]
    probe.inject(None)
    assert NodeReading.from_json(probe.read()).node == "a"  # NVML again


class Readings:
    """A VramSource that reports whatever the test sets (the interface NVML is read through)."""

    def __init__(self, reading: NodeReading) -> None:
        self.reading = reading

    def read(self) -> NodeReading:
        return self.reading


def node_with(free_gib: int, processes: tuple[GpuProcess, ...] = ()) -> NodeReading:
    total = 80 * GIB
    gpu = GpuReading(0, "H100", total, total - free_gib * GIB, free_gib * GIB, processes)
    return NodeReading("a", (gpu,))


def test_a_probe_keeps_the_fallback_engines_share_free_for_it_while_the_engine_restarts() -> None:
    engine, vllm = 4242, 777
    source = Readings(node_with(20, (GpuProcess(engine, 2 * GIB), GpuProcess(vllm, 58 * GIB))))
    pids, now = [frozenset({engine})], [0.0]
    asked: list[set[int] | None] = []

    def engine_pids(among: Iterable[int] | None) -> frozenset[int]:
        asked.append(None if among is None else set(among))
        return pids[0] if among is None else pids[0] & frozenset(among)

    probe = VramProbe("a", source=source, engine_pids=engine_pids, clock=lambda: now[0])

    def placeable_gib() -> float:
        reading = NodeReading.from_json(probe.read())
        return pool_free_bytes([reading], {"a": {"local"}})["local"] / GIB  # type: ignore[operator]

    running = NodeReading.from_json(probe.read())
    assert (running.fallback_held_bytes, running.fallback_withheld_bytes) == (2 * GIB, 0)
    assert placeable_gib() == 20  # NVML already counts what the running engine holds
    assert asked[0] == {engine, vllm}  # nothing kept yet: only the GPU's processes are read
    assert asked[-1] is None  # a share kept: every process, a restarted one may be loading
    # The engine dies: NVML frees its 2 GiB, the probe keeps them out of what may be placed.
    source.reading, pids[0], now[0] = node_with(22, (GpuProcess(vllm, 58 * GIB),)), frozenset(), 5
    assert placeable_gib() == 20
    # Restarted, still loading (alive, nothing on the GPU yet): still its share.
    pids[0], now[0] = frozenset({engine + 1}), 12
    assert placeable_gib() == 20
    # Its CUDA context in VRAM, not yet its layers: still the 2 GiB in all.
    source.reading = node_with(21, (GpuProcess(engine + 1, GIB), GpuProcess(vllm, 58 * GIB)))
    assert placeable_gib() == 20
    # Gone for good (moved, or its GPU hidden by config): after FORGET_AFTER_S the share is free.
    source.reading = node_with(22, (GpuProcess(vllm, 58 * GIB),))
    pids[0], now[0] = frozenset(), 13
    assert placeable_gib() == 20
    now[0] = 13 + FORGET_AFTER_S
    assert placeable_gib() == 22
    # Another node's probe knows nothing of it; a node without a GPU reads nothing.
    assert NodeReading.from_json(VramProbe("b", source=Readings(node_with(9))).read()).free_bytes
    assert VramProbe("c", source=Readings(NodeReading("c", error="no GPU"))).read()["error"]


def test_the_fallbacks_share_follows_what_its_engine_last_held() -> None:
    share = FallbackVram().observed(0, alive=True, now=0)  # loading before it ever held any
    assert share.withheld_bytes == 0
    share = share.observed(3 * GIB, alive=True, now=1)
    share = share.observed(3 * GIB, alive=True, now=1.5)
    # Restarted: its CUDA context first, its layers later; the share stays until it settles.
    loading = share.observed(GIB // 2, alive=True, now=1.8)
    assert (loading.reserved_bytes, loading.withheld_bytes) == (3 * GIB, 3 * GIB - GIB // 2)
    share = loading.observed(1 * GIB, alive=True, now=2)  # reconfigured with fewer layers
    assert share.withheld_bytes == 2 * GIB
    share = share.observed(1 * GIB, alive=True, now=2)  # the same twice running: its share now
    assert (share.reserved_bytes, share.withheld_bytes) == (1 * GIB, 0)
    share = share.observed(0, alive=False, now=3)
    assert share.withheld_bytes == 1 * GIB
    assert share.observed(0, alive=False, now=2 + FORGET_AFTER_S).withheld_bytes == 1 * GIB
    assert share.observed(0, alive=False, now=2 + FORGET_AFTER_S + 1).reserved_bytes == 0
