"""The replica's memory guard judges by the prompt count the router carried with the request.

The engine is a fake (LLMServer.chat patched); the replica has no tokenizer, and for every
request that carries an exact count, or a bound that fits, it never needs one.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest as VllmChat,
)
from ray.serve.llm import LLMServer

from core.answers import EngineError
from core.requests import ChatRequest, PromptCount
from deployments.engine.llm_server import ObservedLLMServer
from policy.oom import OOM_CODE

CAPACITY = 1000  # tokens of KV cache
MESSAGES = [{"role": "user", "content": "hello"}]


class _Stats:
    def __init__(self, usage: float, running: int) -> None:
        self.usage, self.running = usage, running


class _Replica(ObservedLLMServer):
    def __del__(self) -> None:  # type: ignore[override]  # no engine to stop
        pass


def guarded_replica(monkeypatch: pytest.MonkeyPatch, usage: float) -> tuple[Any, list[Any]]:
    """A replica whose engine is `usage` full with one request running; what reached it."""
    reached: list[Any] = []

    async def engine_chat(self: Any, request: Any, raw: Any = None) -> AsyncIterator[Any]:
        reached.append(request)

        async def stream() -> AsyncIterator[Any]:
            yield "data: {}\n\n"

        return stream()

    monkeypatch.setattr(LLMServer, "chat", engine_chat)
    server: Any = object.__new__(_Replica)
    server._failure = server._counter = None
    server._stats = _Stats(usage, running=1)
    server._capacity = CAPACITY
    return server, reached


def ask(server: Any, count: PromptCount | None, max_tokens: int = 100) -> Any:
    request = ChatRequest(model="m", messages=MESSAGES, max_tokens=max_tokens, counted=count)

    async def first() -> Any:
        items = [item async for item in server.chat(request)]
        return items[0]

    return asyncio.run(first())


def test_an_exact_count_that_fits_the_free_cache_reaches_the_engine_as_vllms_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, reached = guarded_replica(monkeypatch, usage=0.5)  # 500 tokens free
    assert ask(server, PromptCount(400, exact=True)) == "data: {}\n\n"
    assert isinstance(reached[0], VllmChat)
    assert "counted" not in (reached[0].__pydantic_extra__ or {})
    assert server._counter is None  # nothing was tokenized here


def test_an_exact_count_past_the_free_cache_is_refused_as_the_backends_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, reached = guarded_replica(monkeypatch, usage=0.5)
    answer = ask(server, PromptCount(401, exact=True))
    assert isinstance(answer, EngineError)
    assert answer.kind == OOM_CODE
    assert answer.code == 503
    assert "needs 501 tokens (401 prompt + 100 output), 500 are free" in answer.message
    assert reached == []
    assert server._counter is None


def test_a_bound_that_fits_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    server, reached = guarded_replica(monkeypatch, usage=0.5)
    assert ask(server, PromptCount(400, exact=False)) == "data: {}\n\n"
    assert len(reached) == 1
    assert server._counter is None


def test_no_carried_count_means_no_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    server, reached = guarded_replica(monkeypatch, usage=0.99)
    assert ask(server, None) == "data: {}\n\n"
    assert len(reached) == 1


def test_a_body_vllm_refuses_is_the_clients_400_and_never_reaches_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, reached = guarded_replica(monkeypatch, usage=0.0)
    request = ChatRequest.model_validate(
        {"model": "m", "messages": MESSAGES, "stream_options": {"include_usage": True}}
    )

    async def first() -> Any:
        return [item async for item in server.chat(request)]

    [answer] = asyncio.run(first())
    assert isinstance(answer, EngineError)
    assert answer.code == 400
    assert answer.param == "stream_options"
    assert reached == []


def test_the_count_survives_pickling() -> None:
    request = ChatRequest(model="m", messages=MESSAGES, counted=PromptCount(7, exact=True))
    carried = pickle.loads(pickle.dumps(request))
    assert carried.counted == PromptCount(7, exact=True)
    assert "counted" not in carried.engine_body()
