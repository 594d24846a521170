"""What the deployments and actors send each other (plain, picklable values).

Ingress -> router: a `ChatJob`; router -> ingress: a `Reply`, the `Opening` of the answer (where
it is served and its first item; a stream's other batches follow) or a `Refusal`.
Router -> engine: vLLM's own request, carrying the prompt count the router fitted it with
(`with_prompt_count`), so the engine's replica never tokenizes the prompt a second time.
Placement actor -> routers: a `PlacementView`, pulled every `SYNC_INTERVAL_S`
(autoscale/broadcast.py). Serve's scaling policy -> routers: `ScalingNews`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from core.types import PriorityClass

__all__ = [
    "PROMPT_COUNT_FIELD",
    "SYNC_INTERVAL_S",
    "ChatJob",
    "Opening",
    "PlacementView",
    "PromptCount",
    "Refusal",
    "Reply",
    "Routed",
    "ScalingNews",
    "is_completion",
    "is_embedding",
    "take_prompt_count",
    "with_prompt_count",
]

# An extra field on vLLM's request (its schema allows extras); taken off before vLLM sees it.
PROMPT_COUNT_FIELD = "gps_prompt_count"
Request = TypeVar("Request", bound=BaseModel)


@dataclass(frozen=True)
class PromptCount:
    """The prompt's tokens as the router fitted it: exact, or an upper bound that fit."""

    tokens: int
    exact: bool


def with_prompt_count(request: Request, count: PromptCount, **changes: Any) -> Request:
    """A copy carrying the count, with any other field `changes` made in the same copy."""
    return request.model_copy(update={**changes, PROMPT_COUNT_FIELD: count})


def take_prompt_count(request: Request) -> tuple[Request, PromptCount | None]:
    """The request without the carried count (a copy), and the count if one was carried."""
    extra = getattr(request, "__pydantic_extra__", None) or {}
    if PROMPT_COUNT_FIELD not in extra:
        return request, None
    bare = request.model_copy()
    count = (bare.__pydantic_extra__ or {}).pop(PROMPT_COUNT_FIELD)
    return bare, count if isinstance(count, PromptCount) else None


def is_completion(request: Any) -> bool:
    """Whether a job's request is a `/v1/completions` one (a prompt), not a chat."""
    return _has(request, "prompt") and not _has(request, "messages")


def is_embedding(request: Any) -> bool:
    """Whether a job's request is a `/v1/embeddings` one (inputs to turn into vectors)."""
    return _has(request, "input") and not _has(request, "messages")


def _has(request: Any, name: str) -> bool:
    """`hasattr`, without its cost on a pydantic model that lacks `name` (its `__getattr__`
    raises, and these run several times per request): a field, or an extra the body sent."""
    fields = getattr(type(request), "model_fields", None)
    if not isinstance(fields, dict):
        return hasattr(request, name)
    return name in fields or name in (getattr(request, "__pydantic_extra__", None) or {})


@dataclass(frozen=True)
class ChatJob:
    """A validated chat, completions or embeddings request, authenticated and resolved to the
    model (by name) whose chain serves it."""

    # ray.serve.llm's ChatCompletionRequest, CompletionRequest or EmbeddingCompletionRequest
    request: Any
    model: str
    priority: PriorityClass
    caller: str
    # The depth router's budget for `model: auto`: the share of the window this job may use.
    context_share: float = 1.0
    # False: a link whose window cannot hold the request as sent is passed over, never fitted
    # (the Responses API's `truncation: disabled`); its output may still be clamped.
    truncate: bool = True


@dataclass(frozen=True)
class Routed:
    """The router's first item for every job: who serves it and how the context was fitted."""

    backend: str
    max_tokens: int
    prompt_tokens: int
    context_fitted: bool
    dropped_messages: int
    system_compressed: bool
    output_clamped: bool
    failovers: int = 0  # links of the chain that failed before this one served
    # Seconds the serving link's engine took to its first item (a whole answer: all of it);
    # the rest of the time to the response is the gateway's own (x-gateway-overhead-ms).
    engine_wait_s: float = 0.0
    # Times a higher class paused the answer: known here for a whole answer only (a stream's
    # say it in its comments, as it happens).
    pauses: int = 0
    # How far the tools' descriptions were shortened to fit (policy.context.tool_fit; 0: not).
    tools_shortened: int = 0


@dataclass(frozen=True)
class Refusal:
    """The router could not serve the job; the ingress turns this into an error response."""

    status: int
    code: str
    message: str
    retry_after_s: int | None = None


@dataclass(frozen=True)
class Opening:
    """How the router's answer to a job begins: where it is served and its first item (a whole
    response, or a stream's first batch of SSE lines; an engine's error response for a
    client's mistake). The router's reply to a job is an `Opening` or a `Refusal`."""

    routed: Routed
    first: Any


Reply = Opening | Refusal


SYNC_INTERVAL_S = 0.5  # a router replica's pull; a move waits about this long for every ack


@dataclass(frozen=True)
class PlacementView:
    """Where each model's new work goes (`placements`: model -> backend) and which backends take
    none (`parked`: at zero replicas on purpose, or draining on the way there)."""

    version: int
    placements: Mapping[str, str]
    parked: frozenset[str]
    moves: tuple[dict[str, Any], ...] = ()
    # Placement rounds that ended in an error since the actor started: the routers expose it
    # as gps_loop_errors_total{loop="placement"} (the actor has no /metrics of its own).
    loop_errors: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "placements": dict(self.placements),
            "parked": sorted(self.parked),
            "moves": list(self.moves),
            "loop_errors": self.loop_errors,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlacementView:
        return cls(
            int(data["version"]),
            dict(data["placements"]),
            frozenset(data["parked"]),
            tuple(data.get("moves", ())),
            int(data.get("loop_errors", 0)),
        )


@dataclass(frozen=True)
class ScalingNews:
    """The load's last decision on a deployment, for the routers' metrics and reports."""

    seq: int
    replicas: int
    direction: str
    reason: str
