"""VRAM readings: the NVML probe says truthfully when there is no GPU; files inject readings."""

from __future__ import annotations

import json
from pathlib import Path

from autoscale.vram import FileSource, GpuProcess, GpuReading, NodeReading, NvmlSource
from core.types import GIB


def test_a_reading_round_trips_through_a_file(tmp_path: Path) -> None:
    reading = NodeReading(
        node="gpu-1",
        gpus=(
            GpuReading(0, "H100", 80 * GIB, 75 * GIB, 5 * GIB, (GpuProcess(42, 70 * GIB),)),
            GpuReading(1, "H100", 80 * GIB, 10 * GIB, 70 * GIB),
        ),
    )
    path = tmp_path / "reading.json"
    path.write_text(json.dumps(reading.to_json()))
    again = FileSource(path).read()
    assert again == reading
    assert (again.free_bytes, again.total_bytes, again.has_gpu) == (75 * GIB, 160 * GIB, True)


def test_the_nvml_probe_never_invents_memory() -> None:
    reading = NvmlSource(node="here").read()
    if reading.has_gpu:  # a lent GPU machine
        assert all(0 <= g.free_bytes <= g.total_bytes for g in reading.gpus)
        assert reading.error is None
    else:  # this CPU machine: no driver, and the reading says so
        assert reading.error
        assert reading.free_bytes == 0
