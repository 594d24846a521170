"""Free VRAM per pool from the probes' readings, and the probe's injection interface."""

from __future__ import annotations

from autoscale.probe import VramProbe, pool_free_bytes
from autoscale.vram import GpuReading, NodeReading
from core.types import GIB


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
