"""What replaces a dead pool's nodes: one interface, four kinds (`pools[].provisioner`).

`provision` asks for the pool's node(s) and returns once they are asked for; it does not wait
for them to join Ray (the cluster manager watches the node table for that). It raises
`ProvisionFailed` when the ask failed, never blocks the event loop, and is cancellation-safe:
a cancelled call (the manager's timeout) kills the process group it started before the
cancellation goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from core.config import CommandProvisioner as CommandConfig
from core.config import ProvisionerConfig
from core.config import RayAutoscalerProvisioner as RayAutoscalerConfig
from core.config import TerraformProvisioner as TerraformConfig


@dataclass(frozen=True)
class ProvisionRequest:
    pool: str
    resource: str  # pool_<name>
    nodes: int  # how many nodes the pool should have
    ray_address: str  # the head's GCS address, host:port
    attempt: int  # 1, 2, ...


@dataclass(frozen=True)
class ProvisionResult:
    detail: str  # one line for the event log: what was asked for
    outputs: Mapping[str, Any] = field(default_factory=dict)


class ProvisionFailed(Exception):
    """The ask failed; the message says why in a line or two."""


class Provisioner(Protocol):
    async def provision(self, request: ProvisionRequest) -> ProvisionResult: ...


def provisioner_for(
    config: ProvisionerConfig, base_dir: Path, standing: StandingRequest | None = None
) -> Provisioner:
    """The provisioner a pool's config names. `standing`: the cluster's one standing request to
    Ray's autoscaler, shared by every pool that uses it."""
    from autoscale.provisioners.command import CommandRunner
    from autoscale.provisioners.ray_autoscaler import AutoscalerRequest
    from autoscale.provisioners.terraform import TerraformApply

    match config:
        case CommandConfig():
            return CommandRunner(config, base_dir)
        case TerraformConfig():
            return TerraformApply(config, base_dir)
        case RayAutoscalerConfig():
            return AutoscalerRequest(config, standing or StandingRequest())
        case _:
            return NoProvisioner()


class NoProvisioner:
    async def provision(self, request: ProvisionRequest) -> ProvisionResult:
        raise ProvisionFailed(
            f"pool {request.pool} has no provisioner (pools[].provisioner: none): waiting for a "
            f"node with {request.resource} to join"
        )


class StandingRequest:
    """Ray's autoscaler keeps one standing resource request per cluster, and each call of
    `request_resources` replaces it: every pool's bundles are kept here and sent together."""

    def __init__(self) -> None:
        self._bundles: dict[str, list[dict[str, float]]] = {}

    def set(self, pool: str, bundles: list[dict[str, float]]) -> list[dict[str, float]]:
        """Record `pool`'s bundles; all pools' bundles, to send."""
        self._bundles[pool] = bundles
        return [bundle for pool_bundles in self._bundles.values() for bundle in pool_bundles]
