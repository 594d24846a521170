"""Which failures are a backend's fault, and what the router does with each: engine errors in
the answer, Ray's and Serve's exceptions, and the two ways a job leaves its link."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from grpc.aio import AioRpcError
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayError
from ray.serve.exceptions import RayServeException, RequestCancelledError

from core.answers import EngineError
from core.errors import ErrorCode
from policy.engine_errors import sse_error
from policy.stream_migration import Partial, StreamTape


class ReplicaRaised(Exception):
    """An exception the backend's replica raised itself. Where that replica runs Serve's
    throughput mode (RAY_SERVE_THROUGHPUT_OPTIMIZED), Serve sends it over gRPC as itself (a
    RuntimeError, say), without the RayTaskError it otherwise comes in; `from_backend` names it
    so, and our own code's errors stay ours (a 500, no breaker)."""


# Faults: the backend's, never the client's (a client's mistake is an EngineError answer, never
# an exception). Our own cancellation is neither. Handles on Serve's gRPC data plane
# (deployments.ingress.front_options) raise AioRpcError for what Ray calls fail with.
BACKEND_FAULTS = (RayError, RayServeException, TimeoutError, AioRpcError, ReplicaRaised)
# A replica gone: ActorDiedError over Ray actor calls, ActorUnavailableError over gRPC.
REPLICA_GONE = (ActorDiedError, ActorUnavailableError)


class LinkGone(TimeoutError):
    """While a job waited on its first answer, the cluster manager declared the backend's
    pool down, or Serve's handle was left with no replica: the answer will not come (a backend
    fault like a timeout)."""


class BackendFault(Exception):
    """The backend failed before answering; the job may move down its chain."""


class MidStreamFault(Exception):
    """The backend failed after its first token: the answer may go on on the next link."""

    def __init__(self, tape: StreamTape, max_tokens: int, detail: str) -> None:
        super().__init__(detail)
        self.tape = tape
        self.max_tokens = max_tokens


class Paused(MidStreamFault):
    """A stream paused for a higher class's request: it goes on as the same answer once it
    gets a slot again (not a fault: no breaker hears of it)."""


@dataclass(frozen=True)
class Continuing:
    """An answer being continued: what the client has of it, who began it, its token budget,
    how often it was paused, and whether it goes on after a pause (not a failure)."""

    partial: Partial
    source: str
    budget: int
    pauses: int = 0
    paused: bool = False


def stream_error_event(message: str) -> list[str]:
    """An SSE error event and the terminator, for failures after the first token was sent."""
    error = {
        "error": {"message": message, "type": "server_error", "code": ErrorCode.BACKEND_FAILED}
    }
    return [f"data: {json.dumps(error)}\n\n", "data: [DONE]\n\n"]


def engine_error(item: Any) -> EngineError | None:
    """The engine's error in a response item (a whole response or a batch of SSE lines)."""
    leading = item[0] if isinstance(item, list) and item else item
    return leading if isinstance(leading, EngineError) else None


def is_server_error(error: EngineError) -> bool:
    return error.code is None or error.code >= 500


def split_at_server_error(item: Any) -> tuple[list[Any], EngineError | None]:
    """A batch of SSE lines cut at its first server error (an EngineError, or vLLM's
    `data: {"error": ...}` line with a 5xx or no code): the parts before it, and the error."""
    parts = item if isinstance(item, list) else [item]
    for index, part in enumerate(parts):
        if isinstance(part, EngineError) and is_server_error(part):
            return parts[:index], part
        error = sse_error(part) if isinstance(part, str) else None
        if error is not None and (error.code is None or error.code >= 500):
            return parts[:index], error
    return parts, None


def error_text(error: EngineError) -> str:
    return f"engine error {error.code}: {error.message}"


T = TypeVar("T")


async def from_backend(item: Awaitable[T]) -> T:
    """The backend's next item: what its replica raised itself becomes ReplicaRaised (a fault),
    whatever its type; the end of a stream, a cancellation and Ray's own errors pass as they
    are."""
    try:
        return await item
    except (StopAsyncIteration, RequestCancelledError, *BACKEND_FAULTS):
        raise
    except Exception as raised:
        raise ReplicaRaised(describe(raised)) from raised


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
