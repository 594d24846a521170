"""A chat completion as Anthropic's Message, and the parts a stream's events share with it.

Plain dicts in and out. The message's id is the completion's, `msg_` in place of `chatcmpl-`
(the same answer is one id in the gateway's logs and the client's); the model is the name the
client sent. Reasoning the engine's parser split off becomes a `thinking` block before the
text, tool calls `tool_use` blocks after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["message_id", "stop_reason", "to_message", "tool_input", "usage"]

Body = dict[str, Any]
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def message_id(completion_id: Any) -> str:
    text = str(completion_id or "")
    return "msg_" + (text.removeprefix("chatcmpl-") or "gateway")


def stop_reason(finish: Any, matched: Any) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for chat's finish_reason; vLLM names the stop
    string it matched in `stop_reason` (a token id when it stopped on one)."""
    if finish is None:
        return None, None
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return STOP_REASONS.get(str(finish), "end_turn"), None


def usage(counted: Any) -> Body:
    counted = counted if isinstance(counted, Mapping) else {}
    return {
        "input_tokens": int(counted.get("prompt_tokens") or 0),
        "output_tokens": int(counted.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def tool_input(arguments: Any) -> Body:
    """A tool call's arguments as the object Anthropic's `input` is; what a model wrote that is
    not a JSON object is kept whole under `raw`, never dropped."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {"raw": arguments}
    return parsed if isinstance(parsed, dict) else {"raw": arguments}


def reasoning_of(message: Mapping[str, Any]) -> str:
    """The reasoning vLLM's parser split off (`reasoning`; `reasoning_content` elsewhere)."""
    text = message.get("reasoning") or message.get("reasoning_content")
    return text if isinstance(text, str) else ""


def to_message(completion: Mapping[str, Any], model: str) -> Body:
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[Body] = []
    reasoning = reasoning_of(message)
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    finish = choice.get("finish_reason")
    if finish == "stop" and message.get("tool_calls") and choice.get("stop_reason") is None:
        finish = "tool_calls"  # a call forced by name ends as "stop" in vLLM: still a tool use
    reason, sequence = stop_reason(finish, choice.get("stop_reason"))
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason or "end_turn",
        "stop_sequence": sequence,
        "usage": usage(completion.get("usage")),
    }
