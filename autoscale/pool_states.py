"""The cluster manager's pool states, as the placement actor and the routers read them."""

from __future__ import annotations

import asyncio
from typing import Any

MANAGER_NAME = "gps-cluster-manager"
ASK_TIMEOUT_S = 5.0


def manager_actor_name(app: str) -> str:
    return f"{MANAGER_NAME}:{app}"


async def find_manager(app: str) -> Any | None:
    """The app's cluster manager, or None while it has not started."""
    import ray

    def lookup() -> Any | None:
        try:
            return ray.get_actor(
                manager_actor_name(app), namespace=ray.get_runtime_context().namespace
            )
        except ValueError:  # no such actor (yet)
            return None

    return await asyncio.to_thread(lookup)  # a GCS call: off the event loop


class ManagerPoolHealth:
    """The placer's `PoolHealth` port: the pools the app's cluster manager declared unhealthy.
    Without a manager (not started yet) no pool is down."""

    def __init__(self, app: str) -> None:
        self._app = app

    async def unhealthy_pools(self) -> frozenset[str]:
        manager = await find_manager(self._app)
        if manager is None:
            return frozenset()
        pools = await asyncio.wait_for(manager.unhealthy_pools.remote(), ASK_TIMEOUT_S)
        return frozenset(pools)
