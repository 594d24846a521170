"""The gateway's own request types: a chat, a completion and an embeddings request as the
ingress, the router and the CPU fallback read them.

vLLM's request classes import torch (15-20 s of CPU and ~500 MB per process that computes
nothing with it), so they live only in the engine's replica, which builds its own from
`engine_body()` (deployments/engine/requests.py). Here a request is the client's JSON body with
the few fields the gateway reads typed, every other field kept as sent (`extra="allow"`), and the
prompt count the router fitted it with beside the body (`counted`, never sent to an engine).

The edge checks each body against vLLM's own JSON Schema first (policy/request/engine_schema),
so these types are never stricter than vLLM's and a field they leave untyped is still vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "JsonObject",
    "PromptCount",
    "Request",
    "StreamOptions",
]

# A JSON object as the client sent it (a message, a tool): read by the policies that know it.
JsonObject = dict[str, Any]


@dataclass(frozen=True)
class PromptCount:
    """The prompt's tokens as the router fitted it: exact, or an upper bound that fit."""

    tokens: int
    exact: bool


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class _Body(BaseModel):
    """What every kind has: the model it names, the end user (our session), vLLM's priority."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str
    user: str | None = None
    priority: int | None = None
    # The router's count of the prompt, so the engine's replica never tokenizes it again.
    counted: PromptCount | None = Field(default=None, exclude=True)

    def engine_body(self) -> JsonObject:
        """The body as an engine gets it: what the client sent and the router changed."""
        return self.model_dump(mode="json", exclude_unset=True)

    def changed(self, **changes: Any) -> Self:
        """A copy with fields changed (a value of the field's own type: nothing is validated)."""
        return self.model_copy(update=changes)


class _Generating(_Body):
    """What a chat and a completion share: the output's bounds, sampling and streaming."""

    max_tokens: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None

    @property
    def include_usage(self) -> bool:
        """Whether the client asked for a stream's usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def with_usage(self) -> Self:
        """The request asking for a stream's usage, its other stream options kept."""
        kept = self.stream_options.model_dump(exclude_none=True) if self.stream_options else {}
        return self.changed(stream_options=StreamOptions(**{**kept, "include_usage": True}))


class ChatRequest(_Generating):
    """`/v1/chat/completions` (and what the Responses and Messages APIs translate to)."""

    messages: list[JsonObject]
    max_completion_tokens: int | None = None
    tools: list[JsonObject] | None = None
    tool_choice: str | JsonObject | None = None
    response_format: JsonObject | None = None
    structured_outputs: JsonObject | None = None
    logprobs: bool | None = False
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    @property
    def output_bound(self) -> int | None:
        """The most tokens the client allows: `max_completion_tokens`, else `max_tokens`."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else (self.max_tokens)
        )


class CompletionRequest(_Generating):
    """`/v1/completions`: a prompt (text or token ids), and for fill-in-the-middle a suffix."""

    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    suffix: str | None = None
    echo: bool | None = False
    logprobs: int | None = None


class EmbeddingRequest(_Body):
    """`/v1/embeddings`: inputs (text or token ids) to turn into vectors."""

    input: str | list[str] | list[int] | list[list[int]]
    truncate_prompt_tokens: int | None = None


Request = ChatRequest | CompletionRequest | EmbeddingRequest
