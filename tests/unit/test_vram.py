"""VRAM readings: the NVML probe says truthfully when there is no GPU; files inject readings."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

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


class FakeNvml:
    """The slice of pynvml the probe uses, for one GPU with scripted faults."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        pass

    def __init__(self, xids: list[int], ecc: int | None) -> None:
        self.pending = [SimpleNamespace(eventData=x, device="gpu0") for x in xids]
        self.ecc = ecc
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return "gpu0"

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=80 * GIB, used=10 * GIB, free=70 * GIB)

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"H100"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return []

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        if self.ecc is None:
            raise self.NVMLError("not supported")
        return self.ecc

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, handle: str, kinds: int, event_set: str) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        if not self.pending:
            raise self.NVMLError("timeout")
        return self.pending.pop(0)


def test_fatal_xids_and_uncorrectable_ecc_errors_are_faults_and_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml(xids=[13, 79], ecc=2)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    source = NvmlSource(node="gpu-1")
    first = source.read()
    assert first.faults == ("Xid 79 on GPU 0", "2 uncorrectable ECC errors on GPU 0")
    nvml.ecc = 0
    assert source.read().faults == ("Xid 79 on GPU 0",)  # an Xid is not forgotten
    assert nvml.inits == 1  # the event watch keeps NVML open between reads
    assert NodeReading.from_json(first.to_json()) == first


def test_an_application_xid_and_a_gpu_without_ecc_are_not_faults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(xids=[13, 31, 43], ecc=None))
    assert NvmlSource(node="gpu-1").read().faults == ()
