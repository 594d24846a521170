"""The key registry: the one writer of an app's run-time keys, and how every ingress replica
hears of a change within milliseconds.

One detached, named actor per app on the gateway's nodes, beside the key ledger, over its
SQLite file (deployments/keys/store.py: why a file; `gateway.keys_db`: where). Admin routes
(`/v1/keys`) call it to create, change and revoke keys; each ingress replica holds a long poll
on `watch` (`KeySync`), which answers the moment the version moves, so a revoked key is refused
on every replica well within a second, and a request's own path never calls the registry: it
reads the replica's copy.

The secret is made here, answered once to the admin who asked, and only its SHA-256 is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from core.config import ApiKeyConfig, KeyFields, hash_key
from core.errors import ApiError, ErrorCode, invalid_fields
from deployments.detached import gateway_actor
from deployments.keys.store import KeyNameTaken, KeyNotFound, KeyStore, StoredKey

__all__ = [
    "KeyRegistry",
    "KeySync",
    "LocalRegistry",
    "RayRegistry",
    "RegistryClient",
    "ensure_key_registry",
    "new_secret",
    "registry_actor_name",
    "replica_key_registry",
]

logger = logging.getLogger("ray.serve")

WATCH_S = 30.0  # how long a long poll waits for a change before it is asked again
RETRY_S = 1.0  # after a failed poll (the registry restarting, or not reachable), doubling
MAX_RETRY_S = 30.0  # to this: a registry that cannot start (an unwritable keys_db) is not
# started again every second by every replica
PROTOCOL = 1  # in the actor's name, as the key ledger's: a deploy that changes the calls


def new_secret() -> str:
    return f"gps-{secrets.token_urlsafe(24)}"


def registry_actor_name(app: str, path: str) -> str:
    """The app's registry over the file at `path`: a changed `gateway.keys_db` (or protocol)
    names another actor, so a deploy never talks to one over another file or calls."""
    file = hashlib.sha256(path.encode()).hexdigest()[:8]
    return f"gps-key-registry-{app}-v{PROTOCOL}-{file}"


class KeyRegistry:
    """An app's run-time keys, over a `KeyStore`; `reserved` names are the config's keys."""

    def __init__(
        self,
        app: str,
        path: str,
        clock: Callable[[], float] = time.time,
        secret: Callable[[], str] = new_secret,
    ) -> None:
        self._store = KeyStore(path, app, clock)
        self._secret = secret
        self._news = asyncio.Event()
        self._version = self._store.version()
        self._active = self._store.active()
        logger.info(
            "key registry of %s: %d run-time keys in %s", app, len(self._active), self._store.path
        )

    async def create(self, body: dict[str, Any], reserved: Sequence[str]) -> dict[str, Any]:
        fields = _fields(body)
        _not_reserved(fields.name, reserved)
        secret = self._secret()
        try:
            stored = self._store.create(f"key_{secrets.token_hex(8)}", hash_key(secret), fields)
        except KeyNameTaken as taken:
            raise ApiError(409, ErrorCode.KEY_NAME_TAKEN, str(taken), param="name") from None
        self._changed()
        return {**stored.shown(), "key": secret}

    async def update(
        self, key_id: str, patch: dict[str, Any], reserved: Sequence[str]
    ) -> dict[str, Any]:
        found = _found(self._store.find, key_id)
        fields = _fields({**found.fields.model_dump(mode="json"), **patch})
        if fields.name != found.fields.name:
            _not_reserved(fields.name, reserved)
        try:
            stored = self._store.update(key_id, fields)
        except KeyNameTaken as taken:
            raise ApiError(409, ErrorCode.KEY_NAME_TAKEN, str(taken), param="name") from None
        self._changed()
        return stored.shown()

    async def revoke(self, key_id: str) -> dict[str, Any]:
        revoked = _found(self._store.revoke, key_id)
        self._changed()
        return {"id": revoked.id, "object": "api_key", "name": revoked.fields.name, "deleted": True}

    async def listed(self) -> list[dict[str, Any]]:
        return [key.shown() for key in self._active]

    async def watch(self, seen: int, timeout_s: float) -> tuple[int, list[dict[str, Any]] | None]:
        """(version, every active key as an `ApiKeyConfig`'s fields) once the version is not
        `seen`, at once if it is not now; (seen, None) if nothing changed within `timeout_s`."""
        if self._version == seen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), timeout_s)
            if self._version == seen:
                return seen, None
        return self._version, [key.config().model_dump(mode="json") for key in self._active]

    def _changed(self) -> None:
        self._version = self._store.version()
        self._active = self._store.active()
        news, self._news = self._news, asyncio.Event()
        news.set()


def _fields(body: dict[str, Any]) -> KeyFields:
    try:
        return KeyFields.model_validate(body)
    except ValidationError as error:
        raise invalid_fields(error, "key") from None


def _found(lookup: Callable[[str], StoredKey], key_id: str) -> StoredKey:
    try:
        return lookup(key_id)
    except KeyNotFound as missing:
        raise ApiError(404, ErrorCode.NOT_FOUND, str(missing)) from None


def _not_reserved(name: str, reserved: Sequence[str]) -> None:
    if name in reserved:
        raise ApiError(
            409,
            ErrorCode.KEY_NAME_TAKEN,
            f"A key named {name!r} is in the config (api_keys); pick another name.",
            param="name",
        )


class RegistryClient(Protocol):
    """How an ingress reaches the registry: an actor (RayRegistry) or one in process."""

    async def create(self, body: dict[str, Any], reserved: Sequence[str]) -> dict[str, Any]: ...

    async def update(
        self, key_id: str, patch: dict[str, Any], reserved: Sequence[str]
    ) -> dict[str, Any]: ...

    async def revoke(self, key_id: str) -> dict[str, Any]: ...

    async def listed(self) -> list[dict[str, Any]]: ...

    async def watch(
        self, seen: int, timeout_s: float
    ) -> tuple[int, list[dict[str, Any]] | None]: ...


class RayRegistry:
    """The registry actor; an `ApiError` it raised is raised here as itself."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    # A change is never retried by Ray (the actor's default): one that committed before the
    # actor died would run twice (a second key under the name, or a 404 for a done revocation).
    # The admin gets a 503 and asks again, seeing the state.

    async def create(self, body: dict[str, Any], reserved: Sequence[str]) -> dict[str, Any]:
        call = self._actor.create.options(max_task_retries=0)
        made: dict[str, Any] = await _unwrapped(call.remote(body, list(reserved)))
        return made

    async def update(
        self, key_id: str, patch: dict[str, Any], reserved: Sequence[str]
    ) -> dict[str, Any]:
        call = self._actor.update.options(max_task_retries=0)
        changed: dict[str, Any] = await _unwrapped(call.remote(key_id, patch, list(reserved)))
        return changed

    async def revoke(self, key_id: str) -> dict[str, Any]:
        call = self._actor.revoke.options(max_task_retries=0)
        revoked: dict[str, Any] = await _unwrapped(call.remote(key_id))
        return revoked

    async def listed(self) -> list[dict[str, Any]]:
        keys: list[dict[str, Any]] = await _unwrapped(self._actor.listed.remote())
        return keys

    async def watch(self, seen: int, timeout_s: float) -> tuple[int, list[dict[str, Any]] | None]:
        news: tuple[int, list[dict[str, Any]] | None] = await _unwrapped(
            self._actor.watch.remote(seen, timeout_s)
        )
        return news


async def _unwrapped(call: Awaitable[Any]) -> Any:
    from ray.exceptions import RayTaskError

    try:
        return await call
    except RayTaskError as error:
        if isinstance(error.cause, ApiError):
            raise error.cause from None
        raise


class LocalRegistry:
    """The registry in this process (unit tests, one-process runs): same calls, no actor."""

    def __init__(self, registry: KeyRegistry) -> None:
        self._registry = registry

    async def create(self, body: dict[str, Any], reserved: Sequence[str]) -> dict[str, Any]:
        return await self._registry.create(body, reserved)

    async def update(
        self, key_id: str, patch: dict[str, Any], reserved: Sequence[str]
    ) -> dict[str, Any]:
        return await self._registry.update(key_id, patch, reserved)

    async def revoke(self, key_id: str) -> dict[str, Any]:
        return await self._registry.revoke(key_id)

    async def listed(self) -> list[dict[str, Any]]:
        return await self._registry.listed()

    async def watch(self, seen: int, timeout_s: float) -> tuple[int, list[dict[str, Any]] | None]:
        return await self._registry.watch(seen, timeout_s)


def ensure_key_registry(
    app: str, namespace: str, path: str, resources: Mapping[str, float]
) -> RayRegistry:
    """The app's registry, started on the gateway's nodes if absent (it outlives the app)."""
    return RayRegistry(
        gateway_actor(KeyRegistry, registry_actor_name(app, path), namespace, resources, app, path)
    )


def replica_key_registry(path: str, resources: Mapping[str, float]) -> RayRegistry:
    """The key registry of the app this Serve replica belongs to."""
    import ray
    from ray import serve

    app = serve.get_replica_context().app_name
    return ensure_key_registry(app, ray.get_runtime_context().namespace, path, resources)


class KeySync:
    """Keeps this replica's copy of the run-time keys the registry's: a long poll answered at
    each change; until the first answer `synced` is False (the ring refuses unknown keys with
    a 503 then, not a 401: they may be run-time keys not read yet)."""

    def __init__(
        self,
        connect: Callable[[], RegistryClient],
        apply: Callable[[list[ApiKeyConfig]], None],
        watch_s: float = WATCH_S,
        retry_s: float = RETRY_S,
    ) -> None:
        self._connect = connect
        self._apply = apply
        self._watch_s = watch_s
        self._retry_s = retry_s
        self._registry: RegistryClient | None = None
        self.version = -1  # never a registry's: the first poll answers at once
        self.synced = False
        self.task: asyncio.Task[None] | None = None  # held by its starter: a task is weakly held

    async def run(self) -> None:
        delay = 0.0  # since the last answer: 0, then retry_s doubling up to MAX_RETRY_S
        while True:
            try:
                if self._registry is None:
                    # Finding or starting the actor is a GCS call: off the replica's loop.
                    self._registry = await asyncio.to_thread(self._connect)
                version, keys = await self._registry.watch(self.version, self._watch_s)
                if keys is not None:
                    self._apply([ApiKeyConfig.model_validate(key) for key in keys])
                    self.version = version
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - the last keys stay; asked again
                if not delay:
                    logger.error(
                        "key registry not reachable, this replica keeps the keys it had "
                        "(revocations wait until it is back): %r",
                        error,
                    )
                self._registry = None
                delay = min(MAX_RETRY_S, 2 * delay or self._retry_s)
                await asyncio.sleep(delay)
                continue
            if delay:
                logger.warning("key registry reachable again: run-time keys at version %d", version)
            delay = 0.0
            self.synced = True
