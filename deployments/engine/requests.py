"""The gateway's requests (core/requests.py) as vLLM's own, built once, in the engine's replica:
the one process that imports vLLM's classes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingCompletionRequest,
)
from ray.llm._internal.serve.core.ingress.utils import _sanitize_chat_completion_request

from core import requests

__all__ = ["vllm_request"]


def vllm_request(sent: Any) -> Any:
    """vLLM's request for one of ours (and vLLM's own, sent by a client of ray.serve.llm's kind,
    as is). Raises pydantic's ValidationError, or vLLM's validators' own errors, for a body vLLM
    refuses: the caller answers those as the client's 400."""
    if isinstance(sent, requests.ChatRequest):
        # Pydantic leaves lazy iterators in message content that Ray cannot pickle.
        chat = ChatCompletionRequest.model_validate(sent.engine_body())
        return _sanitize_chat_completion_request(chat)
    if isinstance(sent, requests.CompletionRequest):
        return CompletionRequest.model_validate(sent.engine_body())
    if isinstance(sent, requests.EmbeddingRequest):
        return EmbeddingCompletionRequest.model_validate(sent.engine_body())
    if isinstance(sent, BaseModel):
        return sent
    raise TypeError(f"not a request: {type(sent).__name__}")
