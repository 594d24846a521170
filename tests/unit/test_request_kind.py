"""The gateway's own request types (core/requests.py): a body read as the client sent it, changed
by the router, carried over a handle with its prompt count, and read by the engine's replica as
vLLM's own request (deployments/engine/requests.py), with nothing lost on the way."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pydantic import ValidationError
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest as VllmChat,
)
from ray.llm._internal.serve.core.configs.openai_api_models import (
    CompletionRequest as VllmCompletion,
)
from ray.llm._internal.serve.core.configs.openai_api_models import (
    EmbeddingCompletionRequest as VllmEmbedding,
)

from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, PromptCount
from deployments.engine.requests import vllm_request

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
    "ignore_eos": True,  # vLLM's extra: kept as sent
    "chat_template_kwargs": {"enable_thinking": False},
    "stream": True,
    "stream_options": {"include_usage": False, "continuous_usage_stats": True},
}


def test_a_chat_reaches_vllm_as_sent() -> None:
    ours = ChatRequest.model_validate(CHAT)
    assert ours.engine_body() == CHAT
    theirs = vllm_request(ours)
    assert isinstance(theirs, VllmChat)
    assert theirs.ignore_eos is True
    assert theirs.chat_template_kwargs == {"enable_thinking": False}
    assert theirs.max_tokens == 8


def test_what_the_router_changes_reaches_vllm_and_the_count_does_not() -> None:
    ours = ChatRequest.model_validate(CHAT)
    count = PromptCount(12, exact=True)
    sent = ours.changed(counted=count, max_tokens=3, model="other", priority=5).with_usage()
    carried = pickle.loads(pickle.dumps(sent))  # as a handle carries it
    assert carried.counted == count
    body = carried.engine_body()
    assert "counted" not in body
    assert body["max_tokens"] == 3
    assert body["model"] == "other"
    assert body["priority"] == 5
    # The client's other stream options are kept beside the usage the gateway asks for.
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert ours.max_tokens == 8
    assert ours.counted is None
    assert vllm_request(carried).max_tokens == 3


def test_a_field_set_to_none_is_sent_as_null() -> None:
    ours = CompletionRequest.model_validate({"model": "m", "prompt": "x", "suffix": "y"})
    body = ours.changed(suffix=None, prompt="xy").engine_body()
    assert body == {"model": "m", "prompt": "xy", "suffix": None}
    assert vllm_request(CompletionRequest.model_validate(body)).suffix is None


@pytest.mark.parametrize(
    ("ours", "theirs", "body"),
    [
        (CompletionRequest, VllmCompletion, {"model": "m", "prompt": [1, 2, 3], "echo": True}),
        (EmbeddingRequest, VllmEmbedding, {"model": "m", "input": ["a", "b"]}),
    ],
)
def test_each_kind_becomes_vllms_own(ours: Any, theirs: Any, body: dict[str, Any]) -> None:
    assert isinstance(vllm_request(ours.model_validate(body)), theirs)


def test_vllms_own_request_passes_through() -> None:
    theirs = VllmChat.model_validate(CHAT)
    assert vllm_request(theirs) is theirs


def test_what_vllm_refuses_raises_for_the_replica_to_answer() -> None:
    # Not a type error our fields see, but a rule of vLLM's own validators.
    ours = ChatRequest.model_validate({**CHAT, "stream": False})  # stream_options need a stream
    with pytest.raises(Exception, match="stream=True") as refused:  # VLLMValidationError
        vllm_request(ours)
    assert not isinstance(refused.value, ValidationError)


def test_the_kinds_read_their_own_fields() -> None:
    chat = ChatRequest.model_validate({**CHAT, "max_completion_tokens": 5})
    assert chat.output_bound == 5
    assert chat.include_usage is False
    assert ChatRequest.model_validate({"model": "m", "messages": []}).output_bound is None
    embedding = EmbeddingRequest.model_validate({"model": "m", "input": "x"})
    assert not hasattr(embedding, "messages")
    assert not hasattr(embedding, "prompt")
