"""The batch service as one named Ray actor per app, and the gateway it sends lines through.

The actor is detached and restarts when its process dies (`max_restarts=-1`); its state is
the store, so a restarted actor (or one started after the whole cluster went down) takes up
every unfinished batch where its last chunk was committed. Calls are not retried by Ray: a
call that died with the actor is answered 503, and the client sends it again (a create that
had committed before the death then makes a second batch, as a retried create does at OpenAI).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from core.config import ClusterConfig
from core.errors import ApiError, ErrorCode
from deployments.batch.ports import Answer, Unreachable
from deployments.batch.service import BatchService
from deployments.batch.store import BatchStore

logger = logging.getLogger("ray.serve")

__all__ = [
    "BatchActor",
    "ServeGateway",
    "batch_actor_name",
    "ensure_batch_actor",
    "replica_batch_actor",
]

# What the ingress may call on the service (the rest of it is the actor's own business).
CALLS = frozenset(
    {"upload_begin", "upload_part", "upload_end", "upload_abort", "file", "files",
     "delete_file", "content_part", "create", "batch", "batches", "cancel"}
)  # fmt: skip
ANSWER_TIMEOUT_S = 900.0  # past the router's own waits: a line's answer that never comes


class ServeGateway:
    """The app's ingress, called through its Serve handle (the same checks, limits and router
    an HTTP request meets)."""

    def __init__(self, app: str) -> None:
        self._app = app
        self._handle: Any = None

    def _ingress(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle("ingress", self._app)
        return self._handle

    async def answer(self, endpoint: str, body: dict[str, Any], owner: str) -> Answer:
        try:
            reply = await asyncio.wait_for(
                self._ingress().batch_answer.remote(endpoint, body, owner), ANSWER_TIMEOUT_S
            )
        except TimeoutError:  # answered by no one in time: a server error, tried a few times
            message = f"No answer within {ANSWER_TIMEOUT_S:.0f} s."
            return Answer(504, ApiError(504, ErrorCode.BACKEND_ERROR, message).body())
        except Exception as error:  # noqa: BLE001 - app gone, replica replaced
            self._handle = None  # the app may be back under a new deployment: look again
            raise Unreachable(repr(error)) from None
        return Answer(**reply)

    async def background_slots(self, model: str) -> int:
        try:
            return int(await self._ingress().batch_slots.remote(model))
        except Exception as error:  # noqa: BLE001 - as above
            self._handle = None
            raise Unreachable(repr(error)) from None


class BatchActor:
    def __init__(self, config: ClusterConfig, app: str) -> None:
        self.digest = config_digest(config)
        # One service per app, one store per app: two apps of one config never share a store
        # (each would take up the other's batches and run them twice).
        store = BatchStore(config.batch_directory / app, config.batches.shared_storage)
        self._service = BatchService(
            store, ServeGateway(app), config.batches, config.gateway.max_json_depth
        )
        # An async actor's constructor runs in its event loop: the unfinished batches go on
        # at once, after a restart too, without waiting for a call.
        self._service.resume()

    async def call(self, name: str, *args: Any) -> Any:
        if name not in CALLS:
            raise ValueError(f"not a batch service call: {name}")
        return getattr(self._service, name)(*args)

    async def config_digest(self) -> str:
        return self.digest


def config_digest(config: ClusterConfig) -> str:
    """What the service was started with: a redeployed app with another config (or code that
    pickles it otherwise) replaces it."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()


def batch_actor_name(app: str) -> str:
    return f"gps_batches:{app}"


def ensure_batch_actor(
    config: ClusterConfig, app: str, namespace: str, resources: Mapping[str, float]
) -> Any:
    """The app's batch service, started if absent, on the gateway's nodes. One started with
    another config is stopped first: two services over one store would run a batch twice (its
    batches go on in the new one, from their last commits)."""
    import ray

    name = batch_actor_name(app)
    try:
        running = ray.get_actor(name, namespace)
    except ValueError:  # none yet
        running = None
    if running is not None and _digest_of(running) not in (None, config_digest(config)):
        logger.warning("batch service: started with another config; replacing it")
        ray.kill(running, no_restart=True)
        for _ in range(100):  # until its name is free, or get_if_exists would find it dying
            try:
                ray.get_actor(name, namespace)
            except ValueError:
                break
            time.sleep(0.1)
    return (
        ray.remote(num_cpus=0)(BatchActor)
        .options(
            name=name,
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            max_concurrency=1000,
            resources=dict(resources),
        )
        .remote(config, app)
    )


def _digest_of(service: Any) -> str | None:
    """The running service's config digest; None when it cannot say now (restarting): it is
    kept, and asked again at the next start."""
    import ray

    try:
        return str(ray.get(service.config_digest.remote(), timeout=30))
    except Exception as error:  # noqa: BLE001 - restarting, or busy past the timeout
        logger.warning("batch service: no config digest now: %r", error)
        return None


def replica_batch_actor(config: ClusterConfig) -> Any:
    """The batch service of the app this Serve replica belongs to, started by the first
    replica to need it."""
    import ray
    from ray import serve

    app_name = serve.get_replica_context().app_name
    namespace = ray.get_runtime_context().namespace
    return ensure_batch_actor(config, app_name, namespace, config.gateway_resources)
