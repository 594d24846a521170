"""What the Ingress and the Router send each other (plain, picklable values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.types import PriorityClass, Role

__all__ = ["ChatJob", "Refusal", "Routed"]


@dataclass(frozen=True)
class ChatJob:
    """A validated chat request, already authenticated and resolved to a role."""

    request: Any  # ray.serve.llm ChatCompletionRequest (vLLM's schema)
    role: Role
    priority: PriorityClass
    caller: str
    # The depth router's budget for `model: auto`: the share of the window this job may use.
    context_share: float = 1.0


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


@dataclass(frozen=True)
class Refusal:
    """The router could not serve the job; the ingress turns this into an error response."""

    status: int
    code: str
    message: str
    retry_after_s: int | None = None
