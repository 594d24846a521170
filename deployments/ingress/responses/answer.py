"""A chat completion as a Responses API `response` object, and the items both a whole answer
and a stream's events make.

Plain dicts in and out. The response's id is the ingress's (random: a stored response's id
must name it alone, and a completion's may be the client's X-Request-ID), else the
completion's (`resp_` in place of `chatcmpl-`), and its items' ids derive from it, so a
stream's events and its final `response.completed` name the same items. Reasoning the
engine's parser split off is a `reasoning` item before the message (its text in `content`, so
a stateless client can send it back); tool calls follow the message, a custom tool's as a
`custom_tool_call` with the raw string the model wrote for it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from deployments.ingress.responses.request import CUSTOM_INPUT, ToolNames

__all__ = [
    "ECHOED",
    "call_item",
    "custom_input",
    "envelope",
    "message_item",
    "reasoning_item",
    "response_id",
    "to_response",
    "usage",
]

Body = dict[str, Any]
# What a response object says back of its request, as sent (OpenAI's defaults where absent).
ECHOED: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "store": True,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": None,
    "truncation": "auto",  # absent, the gateway fits (as chat)
    "user": None,
}


def response_id(completion_id: Any) -> str:
    """The completion's id as a response's; one of our own where it has none (a stored
    response's id must name it alone)."""
    text = str(completion_id or "")
    return "resp_" + (text.removeprefix("chatcmpl-") or uuid.uuid4().hex)


def envelope(request: Mapping[str, Any], rid: str, created: int, status: str) -> Body:
    """The response object around its output: its request's settings as sent."""
    echoed = {k: request[k] if request.get(k) is not None else v for k, v in ECHOED.items()}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": request.get("model"),
        "output": [],
        **echoed,
        "usage": None,
    }


def usage(counted: Any) -> Body:
    counted = counted if isinstance(counted, Mapping) else {}
    prompt = int(counted.get("prompt_tokens") or 0)
    completion = int(counted.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def reasoning_item(rid: str, n: int, text: str) -> Body:
    """The reasoning item at output index `n` (ids are per item: an answer may reason again
    after it spoke)."""
    return {
        "id": f"rs_{rid}_{n}",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": None,
        "status": "completed",
    }


def message_item(rid: str, n: int, text: str, status: str = "completed") -> Body:
    return {
        "id": f"msg_{rid}_{n}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def custom_input(arguments: str) -> str:
    """The raw text a custom tool's call carries: the `input` string the model wrote, or what
    it wrote whole where that is not such an object."""
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    value = parsed.get(CUSTOM_INPUT) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def call_item(
    rid: str, n: int, call_id: str, chat_name: str, arguments: str, names: ToolNames
) -> Body:
    """The item for the model's call of the chat function `chat_name`: a custom tool's call
    with its raw input, or a function call (with its `namespace`, for a namespace's)."""
    name, namespace = names.item_name(chat_name)
    if chat_name in names.custom:
        item = {
            "id": f"ctc_{rid}_{n}",
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": custom_input(arguments),
            "status": "completed",
        }
    else:
        item = {
            "id": f"fc_{rid}_{n}",
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def to_response(
    completion: Mapping[str, Any], request: Mapping[str, Any], names: ToolNames, rid: str = ""
) -> Body:
    """`rid`: the response's id (the ingress makes one); else the completion's."""
    rid = rid or response_id(completion.get("id"))
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[Body] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(rid, len(output), reasoning))
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(message_item(rid, len(output), text))
    for n, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        call_id = str(call.get("id") or f"call_{n}")
        output.append(call_item(rid, n, call_id, name, arguments, names))
    cut = choice.get("finish_reason") == "length"
    created = int(completion.get("created") or 0)
    response = envelope(request, rid, created, "incomplete" if cut else "completed")
    response["output"] = output
    response["usage"] = usage(completion.get("usage"))
    if cut:
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    return response
