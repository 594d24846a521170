"""What the router reaches outside itself, as small typed ports.

The real adapters are in `serve_ports.py` (Serve handles, `serve.status()`, the placement actor);
unit tests pass fakes, so a Router runs without Ray or a tokenizer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.clock import Clock
from core.config import ClusterConfig
from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest
from core.wire import PlacementView, ScalingNews
from policy.context.images import ImageSize
from policy.context.tokens import TokenCounter
from policy.engine_counters import EngineCounters
from policy.slot_leases import SlotAnswer, SlotReport

DeploymentKey = tuple[str, str]  # (application, deployment)


class ChatStream(Protocol):
    """A backend's answer, item by item; `cancel` aborts the engine request (a no-op once done)."""

    def __anext__(self) -> Awaitable[Any]: ...

    def cancel(self) -> None: ...


class Backend(Protocol):
    @property
    def deployment(self) -> DeploymentKey:
        """The Serve deployment behind it: ours, or one in another app."""
        ...

    def chat(self, request: ChatRequest) -> ChatStream: ...

    def completions(self, request: CompletionRequest) -> ChatStream: ...

    def embeddings(self, request: EmbeddingRequest) -> ChatStream: ...

    def routable_replicas(self) -> int | None:
        """The replicas a request sent now would go to, as Serve's handle knows them (pushed by
        the controller the moment they change); None when it cannot tell. At 0 a request would
        wait for a replacement replica to start."""
        ...

    async def check_health(self) -> None:
        """Returns when the backend answers healthy; raises otherwise."""
        ...

    async def kv_cache_usage(self) -> float | None:
        """The engine's KV-cache usage (0..1); None when it has no such reading to give."""
        ...

    async def engine_counters(self) -> tuple[str, EngineCounters] | None:
        """One replica's engine counts since its start, and which replica it is; None when
        the backend has no such counts to give."""
        ...

    async def image_tokens(self, sizes: Sequence[ImageSize]) -> list[int] | None:
        """The tokens an image of each (width, height) adds to a chat prompt on this backend's
        engine; None when it cannot say."""
        ...


@dataclass(frozen=True)
class DeploymentFacts:
    status: str  # Serve's deployment status: HEALTHY, UNHEALTHY, UPDATING, UPSCALING, ...
    running_replicas: int


class DeploymentStatuses(Protocol):
    async def read(self) -> Mapping[DeploymentKey, DeploymentFacts]:
        """Every deployment Serve knows of, by (application, deployment)."""
        ...


class PlacementSource(Protocol):
    """The placement actor as one router replica sees it."""

    async def sync(self, version: int, held: Mapping[str, int]) -> PlacementView | None:
        """Report the view applied and the jobs held per backend; the current view, or None
        when the actor (restarted) waits for `start`."""
        ...

    async def start(self, config: ClusterConfig) -> None: ...


class PoolSource(Protocol):
    """The cluster manager as one router replica sees it."""

    async def report(self) -> Mapping[str, Any]:
        """{"pools": {name: {"state", "reason", "nodes", ...}}, "events": [...]}."""
        ...


@dataclass(frozen=True)
class BackendLoad:
    """One backend as this router replica holds it now, for load-driven autoscaling."""

    waiting: int
    running: int
    kv_usage: float | None
    asleep: bool = False  # held asleep: nothing is sent to it (the policy waits for this)


class LoadBoard(Protocol):
    """Where router replicas post their load for the autoscaling policy
    (autoscale/serve_scaling.py)."""

    async def publish(self, load: Mapping[str, BackendLoad]) -> None:
        """This replica's load, by backend deployment name."""
        ...


class SlotSource(Protocol):
    """The app's slot broker (deployments/router/slot_broker.py): this router's post of each
    backend's slots, answered with its leases."""

    async def post(self, reports: Mapping[str, SlotReport]) -> SlotAnswer: ...


@dataclass(frozen=True)
class RouterPorts:
    backends: Mapping[str, Backend]  # by backend name (`model@pool`, `cpu-fallback`)
    deployments: DeploymentStatuses
    placement: PlacementSource | None  # None: no model can move, so there is nothing to follow
    counters: Mapping[str, TokenCounter]  # by Target.counter_key
    clock: Clock
    pools: PoolSource | None = None  # None: no cluster manager, every pool counts as healthy
    load: LoadBoard | None = None  # None: no model autoscales, so nobody reads the load
    # The autoscaling policy's last decision on a deployment (blocking: called in a thread).
    scaled: Callable[[str], ScalingNews | None] = lambda _deployment: None
    # A backend a reload started, by its (app, deployment) and LoRA adapters; None: none can be.
    connect: Callable[[DeploymentKey, frozenset[str]], Backend] | None = None
    # The app's slot broker, with several routers sharing each cap; None: an equal share each.
    slots: SlotSource | None = None
