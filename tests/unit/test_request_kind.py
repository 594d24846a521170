"""core.wire.is_completion / is_embedding: what a job's request is, read off its fields (and
the extras a body sent, as `hasattr` would) without raising through pydantic's __getattr__."""

from __future__ import annotations

from types import SimpleNamespace

from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingCompletionRequest,
)

from core.wire import is_completion, is_embedding


def test_each_kind_of_request_is_told_apart() -> None:
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    completion = CompletionRequest(model="m", prompt="hi")
    embedding = EmbeddingCompletionRequest(model="m", input="hi")
    kinds = [(is_completion(r), is_embedding(r)) for r in (chat, completion, embedding)]
    assert kinds == [(False, False), (True, False), (False, True)]


def test_an_extra_field_counts_as_hasattr_would_see_it() -> None:
    # vLLM's request models keep unknown fields as extras, which `hasattr` sees.
    completion_with_messages = CompletionRequest.model_validate(
        {"model": "m", "prompt": "hi", "messages": []}
    )
    assert not is_completion(completion_with_messages)
    chat_with_input = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "input": "x"}
    )
    assert not is_embedding(chat_with_input)
    assert is_completion(SimpleNamespace(prompt="hi"))  # not pydantic: plain attributes
