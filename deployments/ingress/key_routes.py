"""Run-time keys (`/v1/keys`) on the ingress's FastAPI app, for admin keys only.

`POST /v1/keys` creates one (name, limits, models: `api_keys[]`'s fields but `sha256` and
`admin`) and answers its secret once; `GET /v1/keys` lists the config's keys and the run-time
ones (never a secret or a digest); `PATCH /v1/keys/{id}` changes a run-time key's fields;
`DELETE /v1/keys/{id}` revokes it, on every replica well within a second (KeySync). The
registry actor (deployments/keys/registry.py) keeps them; the config's keys change in the
config. The routes are `KeyRoutes`' methods, which the Ingress class inherits: Serve calls them
on the replica's own ingress (its class-based view), whose `_key_admin` answers them.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from core.config import ApiKeyConfig, ClusterConfig
from core.errors import ApiError, ErrorCode
from deployments.ingress.auth import KeyRing
from deployments.ingress.body import read_body
from deployments.keys.metering import KeyMetering
from deployments.keys.registry import KeySync, RegistryClient, replica_key_registry
from policy.request import parse_object

__all__ = ["KeyAdmin", "KeyRoutes", "key_routes", "replica_registry", "serve_run_time_keys"]

key_routes = APIRouter()
BODY_BYTES = 64 * 1024  # a key's fields: a name, limits, a list of model names
CONFIG_ID_PREFIX = "config:"

T = TypeVar("T")


class KeyAdmin:
    def __init__(
        self,
        keys: KeyRing,
        metering: KeyMetering,
        config_keys: tuple[ApiKeyConfig, ...],
        registry: Callable[[], RegistryClient],
        max_json_depth: int,
    ) -> None:
        self._keys = keys
        self._metering = metering
        self._config_keys = config_keys
        self._registry = registry
        self._max_depth = max_json_depth

    def use_config(self, config: ClusterConfig) -> None:
        """A reload's config keys (listed here, and never changed here)."""
        self._config_keys = config.api_keys

    async def usage(self, request: Request) -> Response:
        self._admin(request, "read the keys' usage")
        return JSONResponse({"object": "key_usage", **await self._metering.usage()})

    async def create(self, request: Request) -> Response:
        self._admin(request)
        body = await self._body(request)
        made = await self._call(lambda r: r.create(body, self._keys.config_names))
        return JSONResponse(made, status_code=201)

    async def listed(self, request: Request) -> Response:
        self._admin(request)
        run_time = await self._call(lambda r: r.listed())
        return JSONResponse({"object": "list", "data": [*self._configured(), *run_time]})

    async def update(self, request: Request, key_id: str) -> Response:
        self._admin(request)
        self._run_time_only(key_id)
        body = await self._body(request)
        return JSONResponse(
            await self._call(lambda r: r.update(key_id, body, self._keys.config_names))
        )

    async def revoke(self, request: Request, key_id: str) -> Response:
        self._admin(request)
        self._run_time_only(key_id)
        return JSONResponse(await self._call(lambda r: r.revoke(key_id)))

    def _admin(self, request: Request, to: str = "manage keys") -> None:
        if not self._keys.authenticate(request.headers.get("authorization")).admin:
            raise ApiError(
                403, ErrorCode.ADMIN_ONLY, f"Only an admin key (api_keys[].admin: true) may {to}."
            )

    async def _body(self, request: Request) -> dict[str, Any]:
        return parse_object(await read_body(request, BODY_BYTES), self._max_depth)

    async def _call(self, call: Callable[[RegistryClient], Awaitable[T]]) -> T:
        try:
            # Finding the actor is a GCS call: off the replica's loop.
            return await call(await asyncio.to_thread(self._registry))
        except ApiError:
            raise
        except Exception as error:  # noqa: BLE001 - the registry down is a 503, never a 500
            raise ApiError(
                503,
                ErrorCode.KEYS_UNAVAILABLE,
                f"The key registry is not reachable: {type(error).__name__}.",
                headers={"Retry-After": "1"},
            ) from None

    def _configured(self) -> list[dict[str, Any]]:
        return [
            {
                "id": f"{CONFIG_ID_PREFIX}{key.name}",
                "object": "api_key",
                "source": "config",
                **key.model_dump(mode="json", exclude={"sha256"}),
            }
            for key in self._config_keys
        ]

    @staticmethod
    def _run_time_only(key_id: str) -> None:
        if key_id.startswith(CONFIG_ID_PREFIX):
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                f"{key_id!r} is a config key (api_keys): change it in the config.",
            )


def serve_run_time_keys(
    config: ClusterConfig,
    keys: KeyRing,
    metering: KeyMetering,
    registry: Callable[[], RegistryClient] | None,
) -> tuple[KeyAdmin, KeySync | None]:
    """What answers this replica's /v1/keys routes and, where keys are configured and a registry
    is given, the sync that keeps its copy of the run-time keys: started now where an event loop
    runs (Serve constructs a replica's class on it); until its first answer, `keys` says
    pending."""
    depth = config.gateway.max_json_depth
    admin = KeyAdmin(keys, metering, config.api_keys, registry or _no_registry, depth)
    if registry is None or not keys.enabled:
        return admin, None

    def use(run_time: list[ApiKeyConfig]) -> None:
        keys.use_run_time(run_time)
        metering.use_run_time(run_time)

    sync = KeySync(registry, use)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # built outside an event loop (a test): no run-time keys
        return admin, None
    keys.run_time_pending = True
    # A fresh context: a task copies the current one, and Serve would tie the registry calls
    # made in it to whatever request was running.
    sync.task = loop.create_task(sync.run(), context=contextvars.Context())
    return admin, sync


def replica_registry(config: ClusterConfig) -> Callable[[], RegistryClient]:
    """How a Serve replica of the app reaches its registry (the composition root binds it)."""
    return functools.partial(replica_key_registry, str(config.keys_db), config.gateway_resources)


def _no_registry() -> RegistryClient:
    raise ApiError(503, ErrorCode.KEYS_UNAVAILABLE, "Run-time keys are not served here.")


class KeyRoutes:
    """The /v1/keys routes, as methods the Ingress inherits (its `_key_admin` answers them)."""

    _key_admin: KeyAdmin

    @key_routes.get("/v1/keys/usage")
    async def keys_usage(self, request: Request) -> Response:
        return await self._key_admin.usage(request)

    @key_routes.post("/v1/keys")
    async def create_key(self, request: Request) -> Response:
        return await self._key_admin.create(request)

    @key_routes.get("/v1/keys")
    async def list_keys(self, request: Request) -> Response:
        return await self._key_admin.listed(request)

    @key_routes.patch("/v1/keys/{key_id}")
    async def update_key(self, request: Request, key_id: str) -> Response:
        return await self._key_admin.update(request, key_id)

    @key_routes.delete("/v1/keys/{key_id}")
    async def revoke_key(self, request: Request, key_id: str) -> Response:
        return await self._key_admin.revoke(request, key_id)
