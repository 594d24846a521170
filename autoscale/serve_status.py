"""A deployment's replicas and health, read from Serve (the placer's `DeploymentStatus` port)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from autoscale.ports import DeploymentHealth


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
        running = int(info.replica_states.get("RUNNING", 0))
        return DeploymentHealth(running, healthy=str(info.status.value) == "HEALTHY")
