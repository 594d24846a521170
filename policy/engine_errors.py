"""Whose fault an engine's error is: the client's or the backend's (pure: no Ray, no vLLM).

The router charges a breaker and moves the job down its chain for every engine answer with a
code of 500 or more and for every exception a replica raises; a client's mistake must do
neither, and must reach the client as 400. vLLM has the table: `create_error_response` in
vllm/entrypoints/serve/exception_handling/error_response.py maps its VLLMClientError family,
jinja2's TemplateError and the raw ValueError, TypeError and OverflowError to 4xx, the rest to
5xx. But ray.serve.llm's VLLMEngine.chat (ray/llm/_internal/serve/engines/vllm/vllm_engine.py)
applies it only to ValueError and VLLMClientError raised before an answer starts; everything
else leaves the replica as an exception, and inside a stream vLLM sends the error as an SSE
event after an HTTP 200. The same table is applied here, by type name, so nothing heavy is
imported; running out of memory or an engine's death (policy.oom) is always the backend's.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from core.answers import EngineError
from policy.oom import OOM_CODE, error_kind

__all__ = [
    "BACKEND_4XX",
    "STATUS_BY_TYPE",
    "EngineError",
    "Fault",
    "error_code",
    "exception_fault",
    "exception_status",
    "leading_error",
    "readable_message",
    "response_fault",
    "sse_error",
]


class Fault(Enum):
    CLIENT = "client"
    BACKEND = "backend"


# vLLM's table, most specific first; GracefulHTTPError and GenerationError carry their own.
STATUS_BY_TYPE = (
    ("VLLMValidationError", 400),
    ("VLLMUnprocessableEntityError", 422),
    ("VLLMNotFoundError", 404),
    ("VLLMClientError", 400),
    ("VLLMServerError", 500),
    ("ValueError", 400),
    ("TypeError", 400),
    ("OverflowError", 400),
    ("NotImplementedError", 501),
    ("TemplateError", 400),
)
# 4xx answers that are not about the request: the router, not the client, names the model an
# engine serves (404); a timeout, a conflict or a rate limit is the backend's state.
BACKEND_4XX = frozenset({404, 408, 409, 429})


def exception_status(error: BaseException) -> int:
    """The HTTP status vLLM's own server would answer an exception with."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if "GracefulHTTPError" in names:
        return error_code(getattr(error, "http_status", None)) or 503
    if "GenerationError" in names:
        return error_code(getattr(error, "status_code", None)) or 500
    return next((status for name, status in STATUS_BY_TYPE if name in names), 500)


def exception_fault(error: BaseException) -> Fault:
    if error_kind(error) is not None:  # out of memory, or the engine died
        return Fault.BACKEND
    return response_fault(EngineError(exception_status(error), type(error).__name__, str(error)))


def response_fault(error: EngineError) -> Fault:
    code = error.code
    if error.kind == OOM_CODE or code is None or not 400 <= code < 500 or code in BACKEND_4XX:
        return Fault.BACKEND
    return Fault.CLIENT


def leading_error(item: Any) -> EngineError | None:
    """The error an engine's first item is, if it is one: an EngineError (alone, or first of a
    batch), or a batch of SSE lines that opens with an error event."""
    first = item[0] if isinstance(item, list) and item else item
    if isinstance(first, EngineError):
        return first
    return sse_error(first) if isinstance(first, str) else None


def sse_error(line: str) -> EngineError | None:
    """`data: {"error": {...}}`, as vLLM streams an error, read back."""
    if not line.startswith("data: {") or '"error"' not in line:
        return None
    try:
        body = json.loads(line[len("data: ") :])
    except ValueError:
        return None
    info = body.get("error") if isinstance(body, dict) else None
    if not isinstance(info, dict):
        return None
    param = info.get("param")
    return EngineError(
        error_code(info.get("code")),
        str(info.get("type", "")),
        str(info.get("message", "")),
        param if isinstance(param, str) else None,
    )


_NOT_MULTIMODAL = " is not a multimodal model"


def readable_message(message: str) -> str:
    """vLLM's words for a client's mistake, where they name its internals, in a client's."""
    if _NOT_MULTIMODAL in message:
        model = message.split(_NOT_MULTIMODAL)[0].strip().strip("'\"") or "this model"
        return (
            f"The model {model!r} cannot take images: it is not a multimodal model. Send text "
            f"only, or serve a multimodal model as {model!r} (models[].source in the config)."
        )
    if "--enable-auto-tool-choice" in message or "--tool-call-parser" in message:
        return (
            "The model serving this request is not configured for tool calling: set `tools` "
            "on its entry under models[] in the gateway config (e.g. `tools: {parser: hermes}`)."
        )
    return message


def error_code(value: Any) -> int | None:
    """An HTTP status from an error's `code`, which vLLM sends as an int (or a numeric string)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)  # HTTPStatus too
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
