"""What the placement actor reaches outside itself, as small typed ports.

The real adapters sit beside the I/O they wrap (`probe.ProbeReadings`, `policy.KvReplicaScaler`,
`saved.KvPlacementStore`, `serve_status.ServeDeploymentStatus`, `pool_states.ManagerPoolHealth`,
`core.clock.SystemClock`); unit tests pass fakes, so a whole move runs without Ray on a clock
they turn by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from autoscale.saved import SavedPlacements
from core.clock import Clock


class VramReadings(Protocol):
    async def free_bytes_by_pool(self) -> Mapping[str, int | None]:
        """Free VRAM per pool; None for a pool none of whose nodes reported a GPU."""
        ...


@dataclass(frozen=True)
class DeploymentHealth:
    running: int  # replicas RUNNING
    healthy: bool  # the deployment as a whole is HEALTHY


class DeploymentStatus(Protocol):
    async def health(self, deployment: str) -> DeploymentHealth: ...


class ReplicaScaler(Protocol):
    """The replica counts the placement autoscaling policy (`policy.py`) carries out."""

    def set_replicas(self, deployment: str, replicas: int) -> None: ...

    def asked_replicas(self, deployment: str) -> int | None: ...


class PlacementStore(Protocol):
    def load(self) -> SavedPlacements | None: ...

    def save(self, saved: SavedPlacements) -> None: ...


class PoolHealth(Protocol):
    async def unhealthy_pools(self) -> frozenset[str]:
        """Pools the cluster manager declared unhealthy (draining, provisioning, failed)."""
        ...


class AllPoolsUp:
    """For a cluster with no cluster manager: no pool is ever declared down."""

    async def unhealthy_pools(self) -> frozenset[str]:
        return frozenset()


@dataclass(frozen=True)
class PlacerPorts:
    vram: VramReadings
    deployments: DeploymentStatus
    replicas: ReplicaScaler
    store: PlacementStore
    clock: Clock
    pools: PoolHealth = field(default_factory=AllPoolsUp)
