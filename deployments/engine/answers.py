"""vLLM's answers as the gateway reads them (core/answers.py), converted once, where they are made:
an object of vLLM's crossing a handle would load vLLM and torch in the process that unpickles it."""

from __future__ import annotations

from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse

from core.answers import EngineError, Item, WholeAnswer
from policy.engine_errors import error_code

__all__ = ["EngineItemUnknown", "plain", "vllm_item"]


class EngineItemUnknown(RuntimeError):
    """An engine's item this module cannot read: the backend's fault (a 5xx the router fails
    over on), never the client's (a TypeError or ValueError would read as a 400)."""


def plain(item: Any) -> Item:
    """An LLMServer's item as plain data: SSE lines as they are, an ErrorResponse as an
    EngineError, a whole response as its JSON. Read by shape, not class: Ray Serve LLM and vLLM
    move their classes between releases."""
    if isinstance(item, str | WholeAnswer | EngineError):
        return item
    if isinstance(item, list):
        return [part if isinstance(part, str) else _error_or_line(part) for part in item]
    error = _error(item)
    if error is not None:
        return error
    dump = getattr(item, "model_dump", None)
    if dump is None:
        raise EngineItemUnknown(f"an engine item of an unknown kind: {type(item).__name__}")
    return WholeAnswer(dump(mode="json"))


def _error_or_line(part: Any) -> str | EngineError:
    error = _error(part)
    if error is None:
        raise EngineItemUnknown(f"a stream item of an unknown kind: {type(part).__name__}")
    return error


def _error(item: Any) -> EngineError | None:
    """An ErrorResponse (`{"error": {message, type, code, param}}`) read, or None."""
    info = getattr(item, "error", None)
    if info is None or not hasattr(info, "message"):
        return None
    param = getattr(info, "param", None)
    return EngineError(
        error_code(getattr(info, "code", None)),
        str(getattr(info, "type", "") or ""),
        str(info.message),
        param if isinstance(param, str) else None,
    )


def vllm_item(item: Item, raw: Any) -> Any:
    """For a caller that sent vLLM's own request: the engine's own item where it passed
    unchanged (`raw`), else ours as vLLM's (an EngineError as an ErrorResponse)."""
    if raw is not None:
        return raw
    if isinstance(item, list):
        return [vllm_item(part, None) for part in item]
    if isinstance(item, EngineError):
        info = ErrorInfo(message=item.message, type=item.kind, code=item.code, param=item.param)
        return ErrorResponse(error=info)
    return item
