"""Recognising an engine that ran out of memory, or died of it (pure: no torch, no vLLM).

The failure reaches a replica in three forms: an exception (`torch.OutOfMemoryError` in the
replica's own process, vLLM's `EngineDeadError` when its EngineCore process died), an error
response from the engine (non-streaming), or an SSE error line inside a stream (vLLM turns
exceptions during a stream into `data: {"error": ...}`). Types are matched by name so this
module imports nothing heavy and runs where torch or vLLM is absent.
"""

from __future__ import annotations

import json
from typing import Any

from core.answers import EngineError
from core.errors import ErrorCode

__all__ = [
    "DEAD_TEXT",
    "DEAD_TYPES",
    "OOM_CODE",
    "OOM_TEXT",
    "OOM_TYPES",
    "error_kind",
    "item_kind",
]

# The error type a contained replica answers with (HTTP 503): a backend fault, never the client's.
OOM_CODE = ErrorCode.BACKEND_OOM
OOM_TYPES = frozenset({"OutOfMemoryError", "MemoryError"})
DEAD_TYPES = frozenset({"EngineDeadError"})
OOM_TEXT = ("out of memory", "outofmemoryerror", "cuda error: out of memory")
DEAD_TEXT = ("enginecore encountered an issue", "enginedeaderror", "engine core died")


def _kind_of_text(text: str) -> str | None:
    lowered = text.lower()
    if any(marker in lowered for marker in OOM_TEXT):
        return "oom"
    if any(marker in lowered for marker in DEAD_TEXT):
        return "engine_dead"
    return None


def error_kind(error: BaseException) -> str | None:
    """ "oom", "engine_dead", or None for any other error; causes are followed."""
    seen: set[int] = set()
    current: BaseException | None = error
    dead = False
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = {cls.__name__ for cls in type(current).__mro__}
        if names & OOM_TYPES or _kind_of_text(str(current)) == "oom":
            return "oom"
        dead = dead or bool(names & DEAD_TYPES) or _kind_of_text(str(current)) == "engine_dead"
        current = current.__cause__ or current.__context__
    return "engine_dead" if dead else None


def item_kind(item: Any) -> str | None:
    """The same verdict for an engine's answer (core/answers.py): an error, or SSE lines."""
    parts = item if isinstance(item, list) else [item]
    for part in parts:
        message = _error_message(part)
        if message is not None and (kind := _kind_of_text(message)) is not None:
            return kind
    return None


def _error_message(part: Any) -> str | None:
    if isinstance(part, EngineError):
        return f"{part.kind}: {part.message}"
    if isinstance(part, str) and part.startswith("data: {") and '"error"' in part:
        try:
            body = json.loads(part[len("data: ") :])
        except ValueError:
            return None
        inner = body.get("error") if isinstance(body, dict) else None
        if isinstance(inner, dict):
            return f"{inner.get('type', '')}: {inner.get('message', '')}"
    return None
