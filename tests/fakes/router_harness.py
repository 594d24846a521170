"""The router's fakes for tests without Ray: every port of `deployments.router.adapters.ports`
scripted (backends answer from a script, Serve's status is a dict, the clock is turned by hand),
a small config, a job, and helpers that read what the router answered. Shared by the router's unit
tests (tests/unit/test_router_flow.py and the flow tests beside it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ray.exceptions import RayError

from core.answers import EngineError
from core.config import ClusterConfig, parse_config
from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, Request
from core.types import PriorityClass, Role
from core.wire import ChatJob, Opening, PlacementView, Routed, ScalingNews
from deployments.router.adapters.ports import DeploymentFacts, DeploymentKey, RouterPorts
from deployments.router.metrics import REGISTRY
from deployments.router.router import Router
from policy.context.tokens import CharEstimateCounter
from policy.engine_counters import EngineCounters
from tests.fakes.clock import FakeClock

Behaviour = Callable[[int], list[Any]]  # call number -> items (an Exception item is raised)
APP = "gateway"


class FakeStream:
    def __init__(self, owner: FakeBackend, items: list[Any]) -> None:
        self._owner = owner
        self._items = list(items)
        self._given = 0
        self._first = not owner.streams
        self._done = False
        self.cancelled = False
        owner.running += 1
        owner.max_running = max(owner.max_running, owner.running)

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(self._owner.step_s)
        clock = self._owner.clock
        if clock is not None and self._given == 0:  # its first item's wait, on the router's clock
            clock.now += self._owner.first_item_s
        while self._held():  # noqa: ASYNC110 - the fakes' state, no event to wait on
            await asyncio.sleep(0.001)
        if self.cancelled or not self._items:
            self._finish()
            raise StopAsyncIteration
        item = self._items.pop(0)
        self._given += 1
        if isinstance(item, Exception):
            self._finish()
            raise item
        if not self._items:  # the engine's last item: its request is over, read on or not
            self._finish()
        return item

    def _held(self) -> bool:
        """The backend's first stream waits after `hold_at` items until a second call comes."""
        hold_at = self._owner.hold_at
        return (
            self._first
            and hold_at is not None
            and self._given >= hold_at
            and self._owner.calls < 2
            and not self.cancelled
        )

    def cancel(self) -> None:
        self.cancelled = True
        self._finish()

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._owner.running -= 1


class FakeBackend:
    """A backend port answering from `behaviour`; healthy to probes, no KV reading by default."""

    def __init__(
        self,
        behaviour: Behaviour,
        step_s: float = 0.0,
        kv_usage: float | None = None,
        hold_at: int | None = None,
    ) -> None:
        self.behaviour = behaviour
        self.step_s = step_s
        # The first stream stops after `hold_at` items until a second call arrives: the window
        # a test's second job must come in, which a loaded machine's timers could close first.
        self.hold_at = hold_at
        self.kv_usage = kv_usage
        self.kv_calls = 0
        self.kv_hangs = False  # an engine too busy to answer: its reading waits out the timeout
        self.healthy = True
        self.probe_hangs = False  # a replica too stuck to answer: its probe waits out the timeout
        self.deployment: DeploymentKey = (APP, "unnamed")
        self.calls = 0
        self.probes = 0
        self.running = 0
        self.max_running = 0
        self.streams: list[FakeStream] = []
        self.requests: list[Any] = []
        self.completion_calls = 0
        self.embedding_calls = 0
        self.counter_readings: list[tuple[str, EngineCounters]] = []
        self.counter_calls = 0
        self.routable: int | None = None  # Serve's handle's replica count; None: it cannot tell
        # Tokens an image adds, by (width, height); None: the backend cannot say.
        self.image_costs: Callable[[tuple[int, int]], int] | None = None
        self.image_asks: list[list[tuple[int, int]]] = []
        # Each stream's first item (or its fault) takes this long on `clock`, the router's.
        self.clock: FakeClock | None = None
        self.first_item_s = 0.0

    stream_type: type[FakeStream] = FakeStream

    def chat(self, request: Request) -> FakeStream:
        self.calls += 1
        self.requests.append(request)
        stream = self.stream_type(self, self.behaviour(self.calls))
        self.streams.append(stream)
        return stream

    def completions(self, request: CompletionRequest) -> FakeStream:
        self.completion_calls += 1
        return self.chat(request)  # the same script answers every kind

    def embeddings(self, request: EmbeddingRequest) -> FakeStream:
        self.embedding_calls += 1
        return self.chat(request)

    def routable_replicas(self) -> int | None:
        return self.routable

    async def check_health(self) -> None:
        self.probes += 1
        if self.probe_hangs:
            await asyncio.Event().wait()
        if not self.healthy:
            raise RuntimeError("unhealthy")

    async def kv_cache_usage(self) -> float | None:
        self.kv_calls += 1
        if self.kv_hangs:
            await asyncio.Event().wait()
        return self.kv_usage

    async def image_tokens(self, sizes: Sequence[tuple[int, int]]) -> list[int] | None:
        self.image_asks.append(list(sizes))
        costs = self.image_costs
        return None if costs is None else [costs(size) for size in sizes]

    async def engine_counters(self) -> tuple[str, EngineCounters] | None:
        """The next of `counter_readings` (the last one again once they run out)."""
        self.counter_calls += 1
        if not self.counter_readings:
            return None
        if len(self.counter_readings) > 1:
            return self.counter_readings.pop(0)
        return self.counter_readings[0]


class FakeDeployments:
    """Serve's status: every deployment HEALTHY with one RUNNING replica unless set otherwise."""

    def __init__(self) -> None:
        self.facts: dict[DeploymentKey, DeploymentFacts] = {}
        self.error: Exception | None = None

    def set(self, backend: FakeBackend, running: int, status: str = "HEALTHY") -> None:
        self.facts[backend.deployment] = DeploymentFacts(status, running)

    async def read(self) -> Mapping[DeploymentKey, DeploymentFacts]:
        if self.error is not None:
            raise self.error
        return dict(self.facts)


class FakePlacement:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def sync(self, version: int, held: Mapping[str, int]) -> PlacementView | None:
        raise self.error

    async def start(self, config: ClusterConfig) -> None:
        pass


def make_router(
    config: ClusterConfig,
    backends: Mapping[str, FakeBackend],
    *,
    watch: bool = False,
    deployments: FakeDeployments | None = None,
    placement: FakePlacement | None = None,
    clock: FakeClock | None = None,
    counters: Mapping[str, Any] | None = None,
    scaled: Callable[[str], ScalingNews | None] | None = None,
    connect: Callable[[DeploymentKey, frozenset[str]], FakeBackend] | None = None,
    slots: Any = None,
) -> Router:
    deployments = deployments or FakeDeployments()
    for name, backend in backends.items():
        backend.deployment = (APP, name)
        deployments.set(backend, running=1)
    ports = RouterPorts(
        backends=backends,
        deployments=deployments,
        placement=placement,
        counters={t.counter_key: CharEstimateCounter() for t in config.targets.values()}
        | dict(counters or {}),
        clock=clock or FakeClock(),
        scaled=scaled or (lambda _deployment: None),
        connect=connect,
        slots=slots,
    )
    return Router(config, ports, watch=watch)


def two(coding: FakeBackend, orchestrator: FakeBackend) -> dict[str, FakeBackend]:
    return {"coding@local": coding, "orchestrator@local": orchestrator}


def ok(_: int) -> list[Any]:
    return [['data: {"x": 1}\n\n'], ["data: [DONE]\n\n"]]


def dead(_: int) -> list[Any]:
    return [RayError("replica died")]


def engine_error(code: int, kind: str = "x") -> Behaviour:
    error = EngineError(code, kind, "boom")
    return lambda _: [error]


def make_config(
    cap: int = 4,
    max_queue: int = 8,
    queue_timeout_s: float = 5.0,
    fallback_window: int = 2048,
    tools_on: tuple[str, ...] = (),
    router: Mapping[str, Any] | None = None,
    images_on: tuple[str, ...] = (),
) -> ClusterConfig:
    tools = {"parser": "hermes"}
    raw: dict[str, Any] = {
        "pools": [{"name": "local", "kind": "local"}],
        "models": [
            {
                "role": role,
                "source": f"example/{role}",  # never loaded: the tests pass their own counters
                "context_window": 4096,
                "pools": ["local"],
                "max_concurrency": cap,
                "tools": tools if role in tools_on else None,
                "images": role in images_on,
            }
            for role in ("orchestrator", "coding")
        ],
        "fallback": {
            "source": "fallback.gguf",
            "context_window": fallback_window,
            "tools": tools if "cpu-fallback" in tools_on else None,
        },
        "chains": {"coding": ["coding@local", "orchestrator@local", "cpu-fallback"]},
        "router": {
            "breaker_failures": 3,
            "breaker_cooldown_s": 10,
            "max_queue": max_queue,
            "queue_timeout_s": queue_timeout_s,
            "first_token_timeout_s": 1.0,
            **(router or {}),
        },
    }
    return parse_config(raw, base_dir=Path("."), environ={})


def job(role: Role = Role.CODING, priority: PriorityClass = PriorityClass.USER) -> ChatJob:
    request = ChatRequest(
        model=role.value, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
    )
    return ChatJob(request, role, priority, "tester")


async def collect(router: Router, chat_job: ChatJob) -> list[Any]:
    """The router's answer as a list: [Routed, first, more...] or [Refusal]."""
    return flat([item async for item in router.chat(chat_job)])


def flat(items: list[Any]) -> list[Any]:
    """An `Opening` as the backend it names and its first item."""
    out: list[Any] = []
    for item in items:
        out += [item.routed, item.first] if isinstance(item, Opening) else [item]
    return [item for item in out if item is not None]


async def served_by(router: Router, chat_job: ChatJob | None = None) -> str:
    routed = (await collect(router, chat_job or job()))[0]
    assert isinstance(routed, Routed), routed
    return routed.backend


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def sse(ident: str, delta: dict[str, Any] | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    chunk = {"id": ident, "object": "chat.completion.chunk", "created": 7, "model": "m"}
    return f"data: {json.dumps({**chunk, 'choices': choices, **extra})}\n\n"


def chunks_of(lines: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(x[len("data: ") :]) for x in lines if x.startswith("data: {")]


class Rounds:
    """The router's loops a round at a time: each sleep on `clock` (one that advances) waits
    for the test's word, which `until` gives round after round until its check holds."""

    def __init__(self, clock: FakeClock) -> None:
        self._word = asyncio.Event()
        clock.on_tick.append(self._word.wait)

    async def until(self, check: Callable[[], Awaitable[bool]]) -> None:
        while not await check():
            self._word.set()  # wakes every loop waiting now; clear() stops the next round
            self._word.clear()
            await asyncio.sleep(0.01)


async def breaker_opened(router: Router, name: str) -> bool:
    return bool((await router.status())["backends"][name]["breaker"] == "open")
