"""A stream's usage, read from its SSE lines: the engine's usage chunk (hidden when the client
did not ask for it), else its content chunks counted, so every keyed stream can be settled."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["StreamUsage"]


class StreamUsage:
    """Watches a stream's SSE lines for the engine's usage chunk, and hides it when the client
    did not ask for it; counts content chunks in case the stream ends without one."""

    def __init__(self, client_wants_usage: bool) -> None:
        self._show = client_wants_usage
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.chunks = 0

    def filter(self, part: str) -> str:
        if not part.startswith("data: {"):
            return part
        if '"usage"' not in part:
            self.chunks += 1
            return part
        usage, has_choices = _usage_of(part)
        if usage is None:
            self.chunks += 1
            return part
        self.prompt_tokens = usage.get("prompt_tokens", 0)
        self.completion_tokens = usage.get("completion_tokens", 0)
        if has_choices:
            self.chunks += 1
            return part
        return part if self._show else ""

    def totals(self, prompt_estimate: int) -> tuple[int, int]:
        if self.completion_tokens is None:
            return prompt_estimate, self.chunks
        return self.prompt_tokens or 0, self.completion_tokens


def _usage_of(part: str) -> tuple[dict[str, Any] | None, bool]:
    try:
        chunk = json.loads(part[len("data: ") :])
    except ValueError:
        return None, False
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(usage, dict):
        return None, False
    return usage, bool(chunk.get("choices"))
