"""The `command` provisioner: runs a configured command (argv, no shell) for the escape hatch
of on-prem and mesh nodes, and what the tests use to start a real local Ray node."""

from __future__ import annotations

import os
from pathlib import Path

from autoscale.provisioners import ProvisionFailed, ProvisionRequest, ProvisionResult
from autoscale.provisioners.process import run
from core.config import CommandProvisioner


class CommandRunner:
    def __init__(self, config: CommandProvisioner, base_dir: Path) -> None:
        self._config = config
        self._base_dir = base_dir

    def argv(self) -> list[str]:
        """argv[0] with a slash is a path relative to the config's folder; a bare name is
        looked up on PATH."""
        first, *rest = self._config.command
        if "/" in first and not Path(first).is_absolute():
            first = str((self._base_dir / first).resolve())
        return [first, *rest]

    async def provision(self, request: ProvisionRequest) -> ProvisionResult:
        env = {
            **os.environ,
            **self._config.env,
            "GPS_POOL": request.pool,
            "GPS_RAY_ADDRESS": request.ray_address,
            "GPS_POOL_RESOURCE": request.resource,
            "GPS_NODES": str(request.nodes),
            "GPS_ATTEMPT": str(request.attempt),
        }
        done = await run(self.argv(), env=env, cwd=self._base_dir)
        if done.returncode != 0:
            raise ProvisionFailed(
                f"{self._config.command[0]} exited {done.returncode}: {done.tail(done.stderr)}"
            )
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        return ProvisionResult(detail=lines[-1] if lines else f"{self._config.command[0]} done")
