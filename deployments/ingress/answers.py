"""The router's reply as the client's HTTP answer: routing headers, errors as OpenAI error JSON
with the right status (an engine's refusal of a client's mistake is a 400, never a 5xx), and a
stream's SSE lines relayed to the end, its error events counted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from ray.serve.handle import DeploymentResponseGenerator

from core.answers import EngineError
from core.errors import ApiError, ErrorCode
from core.types import PriorityClass
from core.wire import Refusal, Routed
from deployments.ingress import metrics
from deployments.keys.stream_usage import StreamUsage
from policy.depth import DepthDecision
from policy.engine_errors import Fault, readable_message, response_fault
from policy.oom import OOM_CODE

__all__ = ["engine_error", "refusal_error", "relay_sse", "routing_headers"]

# How the router's and our own SSE error events begin (deployments/router/request_path/faults.py).
_ERROR_EVENT = 'data: {"error"'

# Error types our replicas set that clients see as the error's code (the fallback's too).
PASSED_THROUGH_CODES = frozenset(
    {OOM_CODE, ErrorCode.BACKEND_UNAVAILABLE, ErrorCode.CONTEXT_LENGTH_EXCEEDED}
)


def routing_headers(
    routed: Routed, priority: PriorityClass, depth: DepthDecision | None
) -> dict[str, str]:
    headers = {
        "X-Backend": routed.backend,
        "X-Priority": priority.value,
        "X-Max-Tokens": str(routed.max_tokens),
        "X-Context-Fitted": "true" if routed.context_fitted else "false",
        "X-Context-Dropped-Messages": str(routed.dropped_messages),
        "X-Failovers": str(routed.failovers),
    }
    if routed.pauses:
        headers["X-Pauses"] = str(routed.pauses)
    if routed.tools_shortened:  # 1: first sentences, 2: no descriptions (tool_fit)
        headers["X-Context-Tools-Shortened"] = str(routed.tools_shortened)
    if routed.dropped_images:
        headers["X-Context-Dropped-Images"] = str(routed.dropped_images)
    if routed.prompt_counted:  # the count the prompt was fitted by, as the model counts it
        headers["X-Prompt-Tokens"] = str(routed.prompt_tokens)
    if depth is not None:
        headers["X-Depth"] = depth.depth.value
        headers["X-Depth-Reason"] = depth.reason
    return headers


def refusal_error(refusal: Refusal) -> ApiError:
    headers = {}
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = str(refusal.retry_after_s)
    return ApiError(refusal.status, refusal.code, refusal.message, headers=headers)


def engine_error(error: EngineError) -> ApiError:
    code: str
    if response_fault(error) is Fault.CLIENT:  # whatever an engine rejects as invalid: 400
        if "context length" in error.message.lower():
            code = ErrorCode.CONTEXT_LENGTH_EXCEEDED
        else:
            code = error.kind if error.kind in PASSED_THROUGH_CODES else ErrorCode.INVALID_REQUEST
        return ApiError(400, code, readable_message(error.message), param=error.param)
    status = error.code if error.code is not None and error.code >= 500 else 502
    code = error.kind if error.kind in PASSED_THROUGH_CODES else ErrorCode.BACKEND_ERROR
    return ApiError(status, code, error.message)


def _sse_text(part: Any, usage: StreamUsage) -> str:
    """An SSE line as is; an engine error after the stream began becomes an SSE error event."""
    if isinstance(part, EngineError):
        error = engine_error(part)
        return f"data: {json.dumps(error.body())}\n\n"
    return usage.filter(str(part))


async def relay_sse(
    first: list[str],
    stream: DeploymentResponseGenerator[Any],
    usage: StreamUsage,
    timing: metrics.StreamTiming,
    ended: Callable[[], None],
) -> AsyncIterator[str]:
    """Relay the engine's SSE lines; cancel the whole chain if the client goes away. `ended`
    books the stream once it is over, however it ended (one generator per chunk, not two)."""
    done = False
    try:
        item: Any = first
        while True:
            text = "".join(_sse_text(part, usage) for part in item)
            done = done or text.rstrip().endswith("data: [DONE]")
            if any(isinstance(part, EngineError) for part in item) or _ERROR_EVENT in text:
                timing.failed()
            timing.relayed(len(item))
            yield text
            item = await anext(stream, None)
            if item is None:
                break
        if not done:
            yield "data: [DONE]\n\n"
        timing.completed()
    finally:
        try:
            stream.cancel()
        finally:
            ended()
