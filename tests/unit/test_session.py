"""A conversation's session: `X-Session-Id`, else OpenAI's `user`, rides to the backend's
request router as Serve's handle session (deployments/ingress/jobs.py,
deployments/router/adapters/replica_choice.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve.llm import request_router

from core.errors import ApiError
from core.requests import ChatRequest, EmbeddingRequest
from core.types import PriorityClass, Role
from core.wire import ChatJob
from deployments.ingress.jobs import with_session
from deployments.router.adapters.replica_choice import (
    MAX_PREFIX_CHARS,
    ROUTER_PATH,
    SessionPrefixRouter,
)
from deployments.router.adapters.serve_ports import ServeBackend
from policy.replica_affinity import session_ranking


def job(user: str | None = None) -> ChatJob:
    request = ChatRequest(model="coding", messages=[{"role": "user", "content": "hi"}], user=user)
    return ChatJob(request, Role.CODING, PriorityClass.USER, "tester")


def test_the_header_is_the_session_and_without_it_the_body_user_is() -> None:
    assert with_session(job("alice"), "conversation-7").request.user == "conversation-7"
    assert with_session(job("alice"), None).request.user == "alice"
    assert with_session(job(), None).request.user is None


@pytest.mark.parametrize("header", ["", "x" * 257, "bad\nline"])
def test_a_bad_session_header_is_a_400_naming_it(header: str) -> None:
    with pytest.raises(ApiError) as refused:
        with_session(job(), header)
    assert refused.value.status == 400
    assert refused.value.param == "X-Session-Id"


def test_the_configured_router_is_ray_serve_llms_prefix_router() -> None:
    module, _, name = ROUTER_PATH.rpartition(".")
    assert (module, name) == (SessionPrefixRouter.__module__, SessionPrefixRouter.__name__)
    assert issubclass(SessionPrefixRouter, PrefixCacheAffinityRouter)
    # the very class Ray Serve LLM publishes, less its public name (whose package imports vLLM)
    assert request_router.PrefixCacheAffinityRouter.__bases__ == (PrefixCacheAffinityRouter,)


class RecordingHandle:
    """A Serve handle's shape that records the session each call is sent with."""

    app_name, deployment_name = "gateway", "coding@local"

    def __init__(self) -> None:
        self.sessions: list[str | None] = []
        self._session: str | None = None

    def options(self, **options: object) -> RecordingHandle:
        copy = RecordingHandle()
        copy.sessions = self.sessions
        copy._session = options.get("session_id", self._session)  # type: ignore[assignment]
        return copy

    @property
    def chat(self) -> RecordingHandle:
        return self

    def remote(self, request: object) -> str:
        self.sessions.append(self._session)
        return "stream"


def test_the_backend_call_carries_the_requests_session_to_serves_router() -> None:
    handle = RecordingHandle()
    backend = ServeBackend(handle)
    for request in (with_session(job(), "conversation-7").request, job().request):
        assert isinstance(request, ChatRequest)
        backend.chat(request)
    assert handle.sessions == ["conversation-7", None]


class _Replica:
    def __init__(self, name: str, max_ongoing: int = 4) -> None:
        self.name = name
        self.max_ongoing_requests = max_ongoing
        self.replica_id = self

    def to_full_id_str(self) -> str:
        return self.name


class _Lengths:
    def __init__(self, lengths: dict[str, int | None]) -> None:
        self._lengths = lengths

    def get(self, replica_id: _Replica) -> int | None:
        return self._lengths.get(replica_id.name)


class _Pending:
    def __init__(self, session: str | None, args: list[object] | None = None) -> None:
        self.metadata = SimpleNamespace(session_id=session)
        self.routing_context = SimpleNamespace(should_backoff=False)
        self.args = args or []


def _router(lengths: dict[str, int | None]) -> SessionPrefixRouter:
    router = object.__new__(SessionPrefixRouter)
    router._session_slack = 2
    router._replica_queue_len_cache = _Lengths(lengths)
    return router


def _choose(router: SessionPrefixRouter, pending: _Pending, replicas: list[_Replica]) -> object:
    return asyncio.run(router.choose_replicas(replicas, pending))


@pytest.fixture
def prefix_choice(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The prefix router's own choice, replaced by a marker: what falls through to it."""
    calls: list[object] = []

    async def chosen(self: object, candidates: list[_Replica], pending: object) -> object:
        calls.append(pending)
        return "prefix router"

    monkeypatch.setattr(PrefixCacheAffinityRouter, "choose_replicas", chosen)
    return calls


def test_a_session_goes_to_its_replica_then_the_rest_in_its_order(
    prefix_choice: list[object],
) -> None:
    replicas = [_Replica("a"), _Replica("b"), _Replica("c")]
    pending = _Pending("conversation-7")
    ranked = session_ranking("conversation-7", ["a", "b", "c"])
    chosen = _choose(_router({"a": 1, "b": 1, "c": 1}), pending, replicas)
    assert chosen == [[replicas["abc".index(r)]] for r in ranked]
    assert pending.routing_context.should_backoff  # all refusing: Serve waits, not spins
    assert prefix_choice == []


def test_a_session_whose_replica_is_full_or_too_busy_goes_to_the_prefix_router(
    prefix_choice: list[object],
) -> None:
    home = session_ranking("s", ["a", "b"])[0]
    other = "b" if home == "a" else "a"
    replicas = [_Replica("a"), _Replica("b")]
    assert _choose(_router({home: 4, other: 3}), _Pending("s"), replicas) == "prefix router"
    assert _choose(_router({home: 3, other: 0}), _Pending("s"), replicas) == "prefix router"
    assert _choose(_router({home: 2, other: 0}), _Pending("s"), replicas) != "prefix router"
    assert _choose(_router({}), _Pending(None), replicas) == "prefix router"


def test_requests_without_prompt_text_are_left_to_power_of_two() -> None:
    router = _router({})
    embedding = EmbeddingRequest(model="embedding", input="hello")
    empty = ChatRequest(model="coding", messages=[{"role": "user", "content": ""}])
    spoken = ChatRequest(model="coding", messages=[{"role": "user", "content": "hi"}])
    assert router._extract_text_from_request(_Pending(None, [embedding])) is None
    assert router._extract_text_from_request(_Pending(None, [empty])) is None
    assert router._extract_text_from_request(_Pending(None, [spoken])) == "hi"


def test_the_tree_sees_only_a_prompts_first_characters() -> None:
    long = ChatRequest(
        model="coding", messages=[{"role": "user", "content": "x" * (MAX_PREFIX_CHARS * 3)}]
    )
    text = _router({})._extract_text_from_request(_Pending(None, [long]))
    assert text == "x" * MAX_PREFIX_CHARS


def test_a_failing_prefix_router_leaves_the_choice_to_power_of_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(self: object, candidates: list[_Replica], pending: object) -> object:
        raise RuntimeError("object store full")

    async def power_of_two(self: object, candidates: list[_Replica], pending: object) -> object:
        return [candidates[:1]]

    monkeypatch.setattr(PrefixCacheAffinityRouter, "choose_replicas", broken)
    monkeypatch.setattr(PowerOfTwoChoicesRequestRouter, "choose_replicas", power_of_two)
    replicas = [_Replica("a"), _Replica("b")]
    assert _choose(_router({}), _Pending(None), replicas) == [replicas[:1]]


def test_a_prompt_the_tree_cannot_learn_does_not_fail_its_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: object, pending: object, replica_id: object, result: object) -> None:
        raise RuntimeError("object store full")

    monkeypatch.setattr(PrefixCacheAffinityRouter, "on_request_routed", broken)
    _router({}).on_request_routed(_Pending("s"), _Replica("a"), None)  # raises nothing
