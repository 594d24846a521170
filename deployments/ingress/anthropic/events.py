"""A chat-completions stream as the events of Anthropic's Messages stream.

Fed the chat stream's SSE text as it comes (any cut between events), it gives what Anthropic's
SDK expects, in its order: `message_start`; for each content block `content_block_start`, its
deltas (`thinking_delta`, `text_delta`, `input_json_delta` for a tool's input) and
`content_block_stop`, with a new index whenever the kind of block changes (never text into a
thinking or tool block); then `message_delta` with the stop reason and usage, and
`message_stop`. An error the chat stream carries after it began (no link could finish it) is an
`event: error` in Anthropic's shape, and the stream ends there, as Anthropic's does. One answer
a failover continued on another link stays one message: its chunks are followed, not restarted.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from core.errors import ErrorCode
from deployments.ingress.anthropic.answer import message_id, reasoning_of, stop_reason
from deployments.ingress.anthropic.errors import anthropic_type
from deployments.ingress.translated import ChatStreamTranslator, json_text

__all__ = ["MessageEvents", "event"]

Body = dict[str, Any]


def event(kind: str, data: Mapping[str, Any]) -> str:
    return f"event: {kind}\ndata: {json_text({'type': kind, **data})}\n\n"


class MessageEvents(ChatStreamTranslator):
    """One message's events from one chat stream's text (`feed`, then `end`)."""

    def __init__(self, model: str, input_tokens: int, message: str | None = None) -> None:
        self._model = model
        self._message = message  # the message's id where it began before its first chunk
        self._input_tokens = input_tokens
        super().__init__()
        self._started = False
        self._index = -1
        self._block: tuple[str, int] | None = None  # (kind, the chat stream's tool index)
        self._finish: Any = None
        self._matched: Any = None
        self._output_tokens = 0
        self._called = False  # a tool_use block was sent

    def _closing(self) -> str:
        out = self._start({})
        finish = self._finish or "stop"
        if finish == "stop" and self._called and self._matched is None:
            finish = "tool_calls"  # a call forced by name ends as "stop" in vLLM: a tool use
        reason, sequence = stop_reason(finish, self._matched)
        out += self._close()
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        usage = {"input_tokens": self._input_tokens, "output_tokens": self._output_tokens}
        return (
            out
            + event("message_delta", {"delta": delta, "usage": usage})
            + event("message_stop", {})
        )

    def _keep_alive(self, comment: str) -> str:
        return event("ping", {}) if self._started else ""

    def start(self) -> str:
        """`message_start` now, before the chat stream's first chunk (a request waiting in a
        queue: its pings follow); nothing where it was sent."""
        if self._message is None:
            self._message = f"msg_{secrets.token_hex(12)}"
        return self._start({})

    def _start(self, chunk: Mapping[str, Any]) -> str:
        if self._started:
            return ""
        self._started = True
        message: Body = {
            "id": self._message or message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }
        return event("message_start", {"message": message})

    def _chunk(self, chunk: Mapping[str, Any]) -> str:
        out = self._start(chunk)
        counted = chunk.get("usage")
        if isinstance(counted, dict):
            self._input_tokens = int(counted.get("prompt_tokens") or self._input_tokens)
            self._output_tokens = int(counted.get("completion_tokens") or 0)
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = reasoning_of(delta)
            if reasoning:
                out += self._open(
                    "thinking", 0, {"type": "thinking", "thinking": "", "signature": ""}
                )
                out += self._delta({"type": "thinking_delta", "thinking": reasoning})
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._open("text", 0, {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": text})
            for call in delta.get("tool_calls") or []:
                out += self._tool(call)
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
        return out

    def _tool(self, call: Mapping[str, Any]) -> str:
        index = int(call.get("index") or 0)
        function = call.get("function") or {}
        out = ""
        if self._block != ("tool", index):
            self._called = True
            block = {
                "type": "tool_use",
                "id": str(call.get("id") or f"toolu_{index}"),
                "name": str(function.get("name") or ""),
                "input": {},
            }
            out += self._open("tool", index, block)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def _open(self, kind: str, index: int, block: Body) -> str:
        if self._block == (kind, index):
            return ""
        out = self._close()
        self._index += 1
        self._block = (kind, index)
        return out + event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: Body) -> str:
        return event("content_block_delta", {"index": self._index, "delta": delta})

    def _close(self) -> str:
        if self._block is None:
            return ""
        self._block = None
        return event("content_block_stop", {"index": self._index})

    def _failed(self, error: Any) -> str:
        info = error if isinstance(error, dict) else {}
        code, message = info.get("code"), info.get("message")
        # vLLM's events carry the status as `code`, ours an ErrorCode.
        status = code if isinstance(code, int) else 429 if code == ErrorCode.OVERLOADED else 500
        kind = anthropic_type(status, code)
        body = {"type": kind, "message": str(message or "The answer failed.")}
        return event("error", {"error": body})
