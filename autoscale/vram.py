"""Free VRAM on a node, read through NVML (`pynvml`), behind one small interface.

`NvmlSource` reads every GPU's total/used/free memory and the processes holding it. On a node
without an NVIDIA driver it says so (`NodeReading.error`) instead of pretending to have 0 bytes
free. `FileSource` reads the same shape from a JSON file: that is how tests (and anyone
rehearsing a placement) inject readings, through the interface the real probe uses.

`python -m autoscale.vram` prints this node's reading as JSON.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from core.types import FALLBACK_ENGINE_MARKER, GIB
from policy.fallback_vram import FallbackVram


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None where the driver will not say (e.g. in containers)


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class NodeReading:
    node: str
    gpus: tuple[GpuReading, ...] = ()
    error: str | None = None  # why there is no reading ("no NVIDIA driver", ...)
    # Hardware faults NVML reported (uncorrectable ECC errors, fatal Xid events): the node's
    # GPUs cannot be trusted with a replica until the node is replaced or reset.
    faults: tuple[str, ...] = ()
    # The CPU fallback's engine on this node (`policy.fallback_vram`): what it holds now, and
    # the free VRAM that is its share all the same while it restarts.
    fallback_held_bytes: int = 0
    fallback_withheld_bytes: int = 0

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def free_bytes(self) -> int:
        return sum(g.free_bytes for g in self.gpus)

    @property
    def placeable_bytes(self) -> int:
        """Free VRAM a model may be placed into: NVML's free less the fallback's withheld share."""
        return max(0, self.free_bytes - self.fallback_withheld_bytes)

    def with_fallback(self, share: FallbackVram) -> NodeReading:
        return replace(
            self,
            fallback_held_bytes=share.held_bytes,
            fallback_withheld_bytes=share.withheld_bytes,
        )

    @property
    def total_bytes(self) -> int:
        return sum(g.total_bytes for g in self.gpus)

    @classmethod
    def rehearsal(cls, node: str, free_gb: float, total_gb: float = 80.0) -> NodeReading:
        """One GPU with `free_gb` of `total_gb` free: a reading to inject into a probe."""
        free, total = int(free_gb * GIB), int(total_gb * GIB)
        return cls(node, (GpuReading(0, "rehearsal", total, total - free, free),))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeReading:
        gpus = tuple(
            GpuReading(
                **{k: v for k, v in g.items() if k != "processes"},
                processes=tuple(GpuProcess(**p) for p in g.get("processes", ())),
            )
            for g in data.get("gpus", ())
        )
        faults = tuple(str(f) for f in data.get("faults", ()))
        return cls(
            node=str(data["node"]),
            gpus=gpus,
            error=data.get("error"),
            faults=faults,
            fallback_held_bytes=int(data.get("fallback_held_bytes", 0)),
            fallback_withheld_bytes=int(data.get("fallback_withheld_bytes", 0)),
        )


class VramSource(Protocol):
    def read(self) -> NodeReading: ...


@dataclass
class NvmlSource:
    """The real probe: NVML through `pynvml` (the `nvidia-ml-py` package)."""

    node: str = field(default_factory=socket.gethostname)
    _xids: XidWatch | None = field(default=None, init=False, repr=False)

    def read(self) -> NodeReading:
        try:
            import pynvml
        except ImportError:
            return NodeReading(self.node, error="pynvml is not installed (pip nvidia-ml-py)")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:  # no driver, no device: say so, don't guess
            return NodeReading(self.node, error=f"no NVIDIA GPU readable: {error}")
        try:
            count = pynvml.nvmlDeviceGetCount()
            gpus = tuple(_read_gpu(pynvml, i) for i in range(count))
            if self._xids is None:
                self._xids = XidWatch.started(pynvml, count)
            faults = (*self._xids.faults(), *_ecc_faults(pynvml, count))
            return NodeReading(self.node, gpus, faults=faults)
        except pynvml.NVMLError as error:
            return NodeReading(self.node, error=f"NVML read failed: {error}")
        finally:
            pynvml.nvmlShutdown()


# Xids that mean the GPU itself is broken (double-bit ECC, fallen off the bus, row-remapping
# failure, NVLink, contained/uncontained memory errors), not that one program misbehaved
# (13, 31, 43 are application faults and leave the GPU usable).
FATAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})


@dataclass
class XidWatch:
    """An NVML event set registered for critical Xid events, polled without waiting on each
    read. It holds its own NVML init so events between reads are kept; faults are sticky."""

    pynvml: Any
    event_set: Any
    seen: list[str] = field(default_factory=list)

    @classmethod
    def started(cls, pynvml: Any, count: int) -> XidWatch:
        pynvml.nvmlInit()
        event_set = pynvml.nvmlEventSetCreate()
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
            except pynvml.NVMLError:  # not supported on this GPU (e.g. some consumer boards)
                continue
        return cls(pynvml, event_set)

    def faults(self) -> list[str]:
        while True:
            try:
                event = self.pynvml.nvmlEventSetWait_v2(self.event_set, 0)
            except self.pynvml.NVMLError:  # timeout: no event pending
                return list(self.seen)
            xid = int(event.eventData)
            if xid in FATAL_XIDS:
                self.seen.append(f"Xid {xid} on GPU {_gpu_index(self.pynvml, event.device)}")


def _gpu_index(pynvml: Any, handle: Any) -> str:
    try:
        return str(pynvml.nvmlDeviceGetIndex(handle))
    except pynvml.NVMLError:
        return "?"


def _ecc_faults(pynvml: Any, count: int) -> list[str]:
    """Uncorrectable ECC errors since the driver loaded, where the GPU has ECC."""
    faults = []
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            errors = pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        except pynvml.NVMLError:  # no ECC on this GPU
            continue
        if errors:
            faults.append(f"{errors} uncorrectable ECC errors on GPU {index}")
    return faults


def _read_gpu(pynvml: Any, index: int) -> GpuReading:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    try:
        running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError:
        running = []
    processes = tuple(
        GpuProcess(int(p.pid), int(p.usedGpuMemory) if p.usedGpuMemory is not None else None)
        for p in running
    )
    return GpuReading(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        total_bytes=int(memory.total),
        used_bytes=int(memory.used),
        free_bytes=int(memory.free),
        processes=processes,
    )


def fallback_engine_pids(
    among: Iterable[int] | None = None, proc: Path = Path("/proc")
) -> frozenset[int]:
    """This node's processes started with the fallback's marker in their environment (the
    engine and what it forks: Ollama's runners inherit it), of `among` (None: every process).
    Others' processes we may not read are not ours."""
    marker = f"{FALLBACK_ENGINE_MARKER}=".encode()
    pids = set()
    entries = proc.iterdir() if among is None else (proc / str(pid) for pid in among)
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone since the listing, or not ours to read
            continue
        if any(item.startswith(marker) for item in environ.split(b"\0")):
            pids.add(int(entry.name))
    return frozenset(pids)


def fallback_held_bytes(reading: NodeReading, pids: frozenset[int]) -> int:
    """VRAM the processes `pids` hold on the node's GPUs (0 where the driver will not say)."""
    return sum(
        process.used_bytes or 0
        for gpu in reading.gpus
        for process in gpu.processes
        if process.pid in pids
    )


@dataclass
class FileSource:
    """Readings injected from a JSON file in `NodeReading.to_json()` shape."""

    path: Path

    def read(self) -> NodeReading:
        return NodeReading.from_json(json.loads(Path(self.path).read_text()))


def main() -> None:
    json.dump(NvmlSource().read().to_json(), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
