"""A deployment's replicas and health, read from Serve (the placer's `DeploymentStatus` port)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from autoscale.ports import DeploymentHealth

# Replicas that answer requests. A new Serve controller (after its own restart, or a head's)
# re-attaches each live replica, RECOVERING until the replica answers it again; a replica on a
# node being drained is PENDING_MIGRATION until its replacement runs. Both serve all along
# (handles still route to them): counted as none, a router would open every breaker of an app
# that serves (tests/gcs saw 503s so while a new head's controller recovered).
SERVING_STATES = ("RUNNING", "RECOVERING", "PENDING_MIGRATION")


def serving_replicas(replica_states: Mapping[str, int]) -> int:
    """Replicas that serve, from Serve's count of a deployment's replicas by state."""
    return sum(int(replica_states.get(state, 0)) for state in SERVING_STATES)


@dataclass(frozen=True)
class ServeDeploymentStatus:
    app: str

    async def health(self, deployment: str) -> DeploymentHealth:
        from ray import serve

        status = await asyncio.to_thread(serve.status)  # a blocking call to the controller
        app = status.applications.get(self.app)
        info = app.deployments.get(deployment) if app else None
        if info is None:
            return DeploymentHealth(running=0, healthy=False)
        running = serving_replicas(info.replica_states)
        return DeploymentHealth(running, healthy=str(info.status.value) == "HEALTHY")
