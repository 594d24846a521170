"""The response keeper: the one writer of an app's stored responses, which every ingress
replica asks.

One detached, named actor per app on the gateway's nodes, beside the key registry, over its
SQLite file (deployments/ingress/responses/store.py: why a file; `gateway.responses_db`:
where). A replica that answered a response with `store` on puts it here before its last event
goes out, so the client's next request (`previous_response_id`), on any replica, finds it.
Expired responses are purged as responses are put, at most once a PURGE_S.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, Protocol

from deployments.detached import gateway_actor
from deployments.ingress.responses.store import ResponseStore, StoredResponse

__all__ = [
    "LocalKeeper",
    "RayKeeper",
    "ResponseKeeper",
    "ResponseKeeperClient",
    "keeper_actor_name",
    "replica_response_keeper",
]

logger = logging.getLogger("ray.serve")

PURGE_S = 60.0
PROTOCOL = 1  # in the actor's name: a deploy that changes the calls names another actor


def keeper_actor_name(app: str, path: str) -> str:
    file = hashlib.sha256(path.encode()).hexdigest()[:8]
    return f"gps-response-keeper-{app}-v{PROTOCOL}-{file}"


class ResponseKeeper:
    """An app's stored responses, over a `ResponseStore`."""

    def __init__(self, app: str, path: str, clock: Callable[[], float] = time.time) -> None:
        self._store = ResponseStore(path, app, clock)
        self._clock = clock
        self._purged_at = -PURGE_S
        logger.info("response keeper of %s over %s", app, self._store.path)

    async def put(self, stored: dict[str, Any], retention_s: float) -> bool:
        """Whether it was kept (a row of that id is another key's: not)."""
        now = self._clock()
        if now - self._purged_at >= PURGE_S:
            self._purged_at = now
            if gone := self._store.purge():
                logger.info("purged %d expired responses", gone)
        return self._store.put(StoredResponse(**stored), retention_s) is not None

    async def find(self, response_id: str, owner: str) -> dict[str, Any] | None:
        found = self._store.find(response_id, owner)
        return asdict(found) if found is not None else None

    async def delete(self, response_id: str, owner: str) -> bool:
        return self._store.delete(response_id, owner)


class ResponseKeeperClient(Protocol):
    async def put(self, stored: StoredResponse, retention_s: float) -> bool: ...

    async def find(self, response_id: str, owner: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str, owner: str) -> bool: ...


class RayKeeper:
    """The keeper actor. A put is retried by Ray where the actor died (a replace of one id is
    harmless); a delete is not (one that committed would answer 404 the second time)."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    async def put(self, stored: StoredResponse, retention_s: float) -> bool:
        kept: bool = await self._actor.put.remote(asdict(stored), retention_s)
        return kept

    async def find(self, response_id: str, owner: str) -> StoredResponse | None:
        found = await self._actor.find.remote(response_id, owner)
        return StoredResponse(**found) if found is not None else None

    async def delete(self, response_id: str, owner: str) -> bool:
        deleted: bool = await self._actor.delete.options(max_task_retries=0).remote(
            response_id, owner
        )
        return deleted


class LocalKeeper:
    """The keeper in this process (unit tests, one-process runs): same calls, no actor."""

    def __init__(self, keeper: ResponseKeeper) -> None:
        self._keeper = keeper

    async def put(self, stored: StoredResponse, retention_s: float) -> bool:
        return await self._keeper.put(asdict(stored), retention_s)

    async def find(self, response_id: str, owner: str) -> StoredResponse | None:
        found = await self._keeper.find(response_id, owner)
        return StoredResponse(**found) if found is not None else None

    async def delete(self, response_id: str, owner: str) -> bool:
        return await self._keeper.delete(response_id, owner)


def replica_response_keeper(path: str, resources: Mapping[str, float]) -> RayKeeper:
    """The response keeper of the app this Serve replica belongs to, started if absent."""
    import ray
    from ray import serve

    app = serve.get_replica_context().app_name
    namespace = ray.get_runtime_context().namespace
    name = keeper_actor_name(app, path)
    return RayKeeper(gateway_actor(ResponseKeeper, name, namespace, resources, app, path))
