"""What the deployments and actors send each other (plain, picklable values).

Ingress -> router: a `ChatJob`; router -> ingress: a `Reply`, the `Opening` of the answer (where
it is served and its first item; a stream's other batches follow) or a `Refusal`.
Router -> engine: the job's request (core/requests.py) carrying the prompt count the router
fitted it with; engine -> router: its answer as plain data (core/answers.py). No vLLM class
crosses a handle: the gateway's processes never import vLLM or torch.
Placement actor -> routers: a `PlacementView`, pulled every `SYNC_INTERVAL_S`
(autoscale/broadcast.py). Serve's scaling policy -> routers: `ScalingNews`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.answers import Item
from core.requests import Request
from core.types import PriorityClass

__all__ = [
    "SYNC_INTERVAL_S",
    "ChatJob",
    "Opening",
    "PlacementView",
    "Refusal",
    "Reply",
    "Routed",
    "ScalingNews",
]


@dataclass(frozen=True)
class ChatJob:
    """A validated chat, completions or embeddings request, authenticated and resolved to the
    model (by name) whose chain serves it."""

    request: Request
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
    # Seconds the engines took to their first items, every link tried (a failed one's too; a
    # whole answer: all of it): out of x-gateway-overhead-ms, as is the wait for the body.
    engine_wait_s: float = 0.0
    # Times a higher class paused the answer: known here for a whole answer only (a stream's
    # say it in its comments, as it happens).
    pauses: int = 0
    # How far the tools' descriptions were shortened to fit (policy.context.tool_fit; 0: not).
    tools_shortened: int = 0
    # Images replaced by a marker to fit (policy.context.images).
    dropped_images: int = 0
    # Whether `prompt_tokens` is the prompt's count (else a bound that proved it fits).
    prompt_counted: bool = False


@dataclass(frozen=True)
class Refusal:
    """The router could not serve the job; the ingress turns this into an error response."""

    status: int
    code: str
    message: str
    retry_after_s: int | None = None
    # Seconds links that failed before it took from their engines: out of the gateway's overhead.
    engine_wait_s: float = 0.0


@dataclass(frozen=True)
class Opening:
    """How the router's answer to a job begins: where it is served and its first item (a whole
    response, or a stream's first batch of SSE lines; an engine's error response for a
    client's mistake). The router's reply to a job is an `Opening` or a `Refusal`."""

    routed: Routed
    first: Item | None  # None only where an engine's answer ended before its first item


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
