"""The router's ports as Serve provides them: deployment handles, `serve.status()`, the
placement actor and the cluster manager. Built inside the router replica (`serve_ports`),
where those exist."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import ray
from ray import serve
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from autoscale.cluster_manager import ensure_cluster_manager
from autoscale.placer import ensure_placer, placement_matters
from autoscale.serve_scaling import publish_load, read_scaled
from autoscale.serve_status import serving_replicas
from core.clock import SystemClock
from core.config import ClusterConfig
from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, Request
from core.wire import PlacementView
from deployments.router.adapters.handle_replicas import routable_replicas
from deployments.router.adapters.ports import (
    BackendLoad,
    ChatStream,
    DeploymentFacts,
    DeploymentKey,
    RouterPorts,
)
from deployments.router.slot_broker import ensure_slot_broker, work_from_wire, work_to_wire
from policy.context.counters import counters_for
from policy.context.images import ImageSize
from policy.engine_counters import EngineCounters
from policy.load_scaling import LoadReport
from policy.slot_leases import Lease, SlotAnswer, SlotReport


class ServeBackend:
    def __init__(self, handle: DeploymentHandle, adapters: Iterable[str] = ()) -> None:
        self._unary = handle
        self._stream = handle.options(stream=True)  # kept: each .options() builds a router
        self._adapters = frozenset(adapters)  # LoRA adapters its engines serve, by name

    @property
    def deployment(self) -> DeploymentKey:
        return (self._unary.app_name, self._unary.deployment_name)

    def chat(self, request: ChatRequest) -> ChatStream:
        stream: ChatStream = self._streaming(request).chat.remote(request)
        return stream

    def completions(self, request: CompletionRequest) -> ChatStream:
        stream: ChatStream = self._streaming(request).completions.remote(request)
        return stream

    def embeddings(self, request: EmbeddingRequest) -> ChatStream:
        stream: ChatStream = self._streaming(request).embeddings.remote(request)
        return stream

    def _streaming(self, request: Request) -> DeploymentHandle:
        """The streaming handle, with the request's session (its `user`) for the backend's
        request router to keep the conversation on one replica (deployments/replica_router),
        and for an adapter its name as Serve's multiplexed model id: Ray Serve LLM loads it
        there, and Serve prefers the replicas that have it loaded."""
        options: dict[str, str] = {}
        if request.user:
            options["session_id"] = request.user
        if request.model in self._adapters:
            options["multiplexed_model_id"] = request.model
        return self._stream.options(**options) if options else self._stream

    def routable_replicas(self) -> int | None:
        return routable_replicas(self._unary)  # `_stream` shares its router

    async def check_health(self) -> None:
        await self._unary.check_health.remote()

    async def kv_cache_usage(self) -> float | None:
        try:
            usage: float | None = await self._unary.kv_cache_usage.remote()
        except (AttributeError, RayServeException) as error:
            if _method_missing(error):  # a plain LLMServer: it has no reading to give
                return None
            raise
        return usage

    async def engine_counters(self) -> tuple[str, EngineCounters] | None:
        try:
            reading: dict[str, Any] | None = await self._unary.engine_counters.remote()
        except (AttributeError, RayServeException) as error:
            if _method_missing(error):  # a plain LLMServer
                return None
            raise
        if reading is None:
            return None
        counters = EngineCounters(
            int(reading["preemptions"]), int(reading["prefix_queries"]), int(reading["prefix_hits"])
        )
        return str(reading["replica"]), counters

    async def image_tokens(self, sizes: Sequence[ImageSize]) -> list[int] | None:
        try:
            counts: list[int] | None = await self._unary.image_tokens.remote(list(sizes))
        except (AttributeError, RayServeException) as error:
            if _method_missing(error):  # a plain LLMServer, or the CPU fallback
                return None
            raise
        return counts


def _method_missing(error: BaseException) -> bool:
    """The backend has no such method: Serve says so in a RayServeException's text."""
    return isinstance(error, AttributeError) or "that does not exist" in str(error)


class ServeDeploymentStatuses:
    async def read(self) -> dict[DeploymentKey, DeploymentFacts]:
        # serve.status() blocks on the controller: keep it off the routing event loop.
        overview = await asyncio.to_thread(serve.status)
        return {
            (app_name, name): DeploymentFacts(
                status=str(info.status.value),
                running_replicas=serving_replicas(info.replica_states),
            )
            for app_name, app in overview.applications.items()
            for name, info in app.deployments.items()
        }


class ActorPlacement:
    """The app's placement actor, pulled by this router replica."""

    def __init__(self, actor: Any, replica: str) -> None:
        self._actor = actor
        self._replica = replica

    @classmethod
    def connect(cls, config: ClusterConfig) -> ActorPlacement:
        context = serve.get_replica_context()
        namespace = ray.get_runtime_context().namespace
        return cls(ensure_placer(config, context.app_name, namespace), context.replica_id.unique_id)

    async def sync(self, version: int, held: Mapping[str, int]) -> PlacementView | None:
        reply = await self._actor.sync.remote(self._replica, version, dict(held))
        return None if reply["config"] is None else PlacementView.from_json(reply)

    async def start(self, config: ClusterConfig) -> None:
        await self._actor.start.remote(config)


class ManagerPools:
    """The app's cluster manager, started by the first router replica (like the placement
    actor) and pulled by each."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    @classmethod
    def connect(cls, config: ClusterConfig) -> ManagerPools:
        context = serve.get_replica_context()
        namespace = ray.get_runtime_context().namespace
        return cls(ensure_cluster_manager(config, context.app_name, namespace))

    async def report(self) -> Mapping[str, Any]:
        report: Mapping[str, Any] = await self._actor.report.remote()
        return report


class KvLoadBoard:
    """Load posted to Ray's internal key-value store (GCS), one key per router replica,
    stamped with wall time: the Serve controller reading it keeps its own clock."""

    def __init__(self, app: str, replica: str) -> None:
        self._app = app
        self._replica = replica

    @classmethod
    def connect(cls) -> KvLoadBoard:
        context = serve.get_replica_context()
        return cls(context.app_name, context.replica_id.unique_id)

    async def publish(self, load: Mapping[str, BackendLoad]) -> None:
        now = time.time()
        reports = {
            name: LoadReport(now, entry.waiting, entry.running, entry.kv_usage, entry.asleep)
            for name, entry in load.items()
        }
        await asyncio.to_thread(publish_load, self._app, self._replica, now, reports)


def serve_ports(config: ClusterConfig, handles: Mapping[str, DeploymentHandle]) -> RouterPorts:
    targets = config.targets
    return RouterPorts(
        backends={
            name: ServeBackend(handle, targets[name].adapters) for name, handle in handles.items()
        },
        deployments=ServeDeploymentStatuses(),
        counters=counters_for(targets[name] for name in handles),
        placement=ActorPlacement.connect(config) if placement_matters(config) else None,
        clock=SystemClock(),
        pools=ManagerPools.connect(config),
        load=KvLoadBoard.connect() if any(m.autoscaling for m in config.models) else None,
        scaled=partial(read_scaled, serve.get_replica_context().app_name),
        connect=connect_backend,
        slots=BrokerSlots.connect(config) if shares_slots(config) else None,
    )


def shares_slots(config: ClusterConfig) -> bool:
    return config.gateway.shared_slots and config.gateway.router_shares > 1


class BrokerSlots:
    """The app's slot broker, started by the first router replica, posted to by each."""

    def __init__(self, actor: Any, replica: str, routers: int) -> None:
        self._actor = actor
        self._replica = replica
        self._routers = routers

    @classmethod
    def connect(cls, config: ClusterConfig) -> BrokerSlots:
        context = serve.get_replica_context()
        namespace = ray.get_runtime_context().namespace
        routers = config.gateway.router_shares
        actor = ensure_slot_broker(context.app_name, namespace, config.gateway_resources, routers)
        return cls(actor, context.replica_id.unique_id, routers)

    async def post(self, reports: Mapping[str, SlotReport]) -> SlotAnswer:
        posted = {
            name: [r.lease, r.in_flight, {c.value: n for c, n in r.waiting.items()}, r.total,
                   None if r.work is None else work_to_wire(r.work)]
            for name, r in reports.items()
        }  # fmt: skip
        answer = await self._actor.post.remote(self._replica, self._routers, posted)
        leases = {
            name: Lease(int(slots), int(of)) for name, (slots, of) in answer["leases"].items()
        }
        work = {
            name: {router: work_from_wire(w) for router, w in by_router.items()}
            for name, by_router in answer.get("work", {}).items()
        }
        return SlotAnswer(leases, bool(answer["hurry"]), work, str(answer.get("me", "")))


def connect_backend(home: DeploymentKey, adapters: frozenset[str]) -> ServeBackend:
    """A backend in another Serve app (one a reload started, cluster/model_apps.py)."""
    app, deployment = home
    return ServeBackend(serve.get_deployment_handle(deployment, app), adapters)
