"""An Anthropic Messages request as the chat-completions body the router already runs.

Plain dicts in and out (no vLLM or Anthropic protocol classes), so the job's own wire type can
change without touching this. What Anthropic's API has and chat has too is carried over:
`system` (a string or text blocks) becomes the first system message; `text`, `image`,
`tool_use` and `tool_result` blocks become text and image parts, tool calls and tool messages;
`tools` with `input_schema` become functions; `tool_choice`, `stop_sequences`, `max_tokens`,
`temperature`, `top_p`, `top_k`, `stream` and `metadata.user_id` (the session) map one to one.
Everything else is accepted and ignored as a rule, not from a list (`cache_control`, `thinking`
budgets, `context_management`, `output_config`, and fields still to come): a strict schema
is the commonest way a gateway breaks Claude Code. So are blocks and tools of types no engine
can serve (`server_tool_use`, `web_search_*` and the like): left out, never a 400.

Claude Code's first system block is a billing header whose nonce changes per request
(`x-anthropic-billing-header: ...`): it is dropped here, before fitting and prefix routing, or
no two of its requests would share a prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from policy.request.fields import fail, json_kind
from policy.request.messages import check_image_url

__all__ = ["BILLING_HEADER", "to_chat", "to_counted"]

BILLING_HEADER = "x-anthropic-billing-header"
ROLES = ("user", "assistant", "system")
SAMPLING = ("temperature", "top_p", "top_k")  # the same names in both APIs
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}

Body = dict[str, Any]
Message = dict[str, Any]


def to_chat(body: Mapping[str, Any]) -> Body:
    """The chat-completions body for an Anthropic Messages `body` (ApiError 400 for what
    Anthropic's API refuses too: no model, no max_tokens, no messages, a block without a type)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        fail("model", "is required (a string)")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        fail("max_tokens", f"is required: an integer of at least 1, got {json_kind(max_tokens)}")
    chat: Body = {
        "model": body["model"],
        "messages": _messages(body),
        "max_tokens": max_tokens,
        **{name: body[name] for name in SAMPLING if body.get(name) is not None},
        **_stop(body.get("stop_sequences")),
    }
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        chat.update(_tool_choice(body.get("tool_choice"), tools))
    if body.get("stream") is True:
        # The usage chunk is what message_delta's usage is made of.
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    session = _session(body.get("metadata"))
    if session:
        chat["user"] = session
    return chat


def _stop(stop: Any) -> Body:
    if stop is None:
        return {}
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        fail("stop_sequences", "must be a list of strings")
    return {"stop": stop} if stop else {}


def to_counted(body: Mapping[str, Any]) -> tuple[list[Message], list[Body]]:
    """The messages and tools `count_tokens` counts, as the model's template renders them: what
    the client sent, before any fitting (`model` and `messages` required, no `max_tokens`)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        fail("model", "is required (a string)")
    return _messages(body), _tools(body.get("tools"))


def _messages(body: Mapping[str, Any]) -> list[Message]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        fail("messages", f"must be a non-empty list, got {json_kind(messages)}")
    chat: list[Message] = []
    system = _system_text(body.get("system"), "system")
    if system:
        chat.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            fail(where, f"must be an object, got {json_kind(message)}")
        role = message.get("role")
        if role not in ROLES:
            fail(f"{where}.role", f"must be one of {', '.join(ROLES)}")
        if role == "system":  # Claude Code sends them between turns
            text = _system_text(message.get("content"), f"{where}.content")
            if text:
                chat.append({"role": "system", "content": text})
            continue
        chat.extend(_turn(role, message.get("content"), where))
    return chat


def _system_text(system: Any, where: str) -> str:
    """A system prompt's text (a string, or text blocks joined), the billing header left out."""
    if system is None:
        return ""
    if isinstance(system, str):
        return "" if system.startswith(BILLING_HEADER) else system
    if not isinstance(system, list):
        fail(where, f"must be a string or a list of text blocks, got {json_kind(system)}")
    texts = []
    for j, block in enumerate(system):
        _check_block(block, f"{where}.{j}")
        text = block.get("text")
        if isinstance(text, str) and text and not text.startswith(BILLING_HEADER):
            texts.append(text)
    return "\n\n".join(texts)


def _check_block(block: Any, where: str) -> None:
    if not isinstance(block, dict):
        fail(where, f"must be an object, got {json_kind(block)}")
    if not isinstance(block.get("type"), str):
        fail(f"{where}.type", "is required (a string)")


def _turn(role: str, content: Any, where: str) -> list[Message]:
    """One Anthropic message as chat messages: tool results go first, as tool messages (they
    answer the calls of the assistant turn before), then the turn's own text and images."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        fail(f"{where}.content", f"must be a string or a list of blocks, got {json_kind(content)}")
    results: list[Message] = []
    parts: list[Body] = []
    calls: list[Body] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        _check_block(block, at)
        kind = block["type"]
        if kind == "tool_use" and role == "assistant":
            calls.append(_tool_call(block, at))
        elif kind == "tool_result":
            results.extend(_tool_result(block, at))
        else:
            parts.extend(_part(block, at))
    turn: list[Message] = []
    if parts or calls:
        message: Message = {"role": role, "content": _content(parts)}
        if calls:
            message["tool_calls"] = calls
        turn.append(message)
    elif not results:  # an empty turn keeps its place (roles must alternate)
        turn.append({"role": role, "content": ""})
    return [*results, *turn]


def _part(block: Mapping[str, Any], where: str) -> list[Body]:
    """A text or image block as a chat part. Thinking, redacted thinking, server tools' blocks,
    documents and what comes next: nothing an engine here reads back (the model's reasoning is
    not fed to it again)."""
    if block["type"] == "text" and isinstance(block.get("text"), str) and block["text"]:
        return [{"type": "text", "text": block["text"]}]
    if block["type"] == "image":
        url = _image_url(block.get("source"), f"{where}.source")
        return [{"type": "image_url", "image_url": {"url": url}}]
    return []


def _content(parts: list[Body]) -> str | list[Body]:
    """One text part as a plain string (what every chat template reads); else the parts."""
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def _image_url(source: Any, where: str) -> str:
    if not isinstance(source, dict):
        fail(where, "must be an object (type base64 or url)")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            fail(where, "of type base64 needs media_type and data (strings)")
        url = f"data:{media};base64,{data}"
        check_image_url(url, f"{where}.data")
        return url
    if kind == "url" and isinstance(source.get("url"), str):
        check_image_url(source["url"], f"{where}.url")  # refused: no fetching
        return str(source["url"])
    fail(f"{where}.type", "must be base64 (with media_type and data) or url (with url)")


def _tool_call(block: Mapping[str, Any], where: str) -> Body:
    name, call_id = block.get("name"), block.get("id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        fail(where, "of type tool_use needs id and name (strings)")
    arguments = block.get("input", {})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _tool_result(block: Mapping[str, Any], where: str) -> list[Message]:
    """A tool's result as a tool message; images it returned follow as a user turn's parts."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        fail(f"{where}.tool_use_id", "is required (a string)")
    content = block.get("content")
    texts: list[str] = []
    images: list[Body] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for k, item in enumerate(content):
            _check_block(item, f"{where}.content.{k}")
            if item["type"] == "text" and isinstance(item.get("text"), str):
                texts.append(item["text"])
            elif item["type"] == "image":
                url = _image_url(item.get("source"), f"{where}.content.{k}.source")
                images.append({"type": "image_url", "image_url": {"url": url}})
    text = "\n".join(texts)
    if block.get("is_error") is True:
        text = f"Error: {text}" if text else "Error"
    messages: list[Message] = [{"role": "tool", "tool_call_id": call_id, "content": text}]
    if images:
        messages.append({"role": "user", "content": images})
    return messages


def _tools(tools: Any) -> list[Body]:
    """Custom tools as functions; server tools (a `type` of their own and no `input_schema`:
    web search, code execution, the computer) are left out, since no engine here runs them."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        fail("tools", f"must be a list, got {json_kind(tools)}")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            fail(f"tools.{i}", f"must be an object, got {json_kind(tool)}")
        if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
            continue
        name, schema = tool.get("name"), tool["input_schema"]
        if not isinstance(name, str) or not name:
            fail(f"tools.{i}.name", "is required (a string)")
        if not isinstance(schema, dict):
            fail(f"tools.{i}.input_schema", f"must be an object, got {json_kind(schema)}")
        function: Body = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any, tools: list[Body]) -> Body:
    if choice is None:
        return {}
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        fail("tool_choice", "must be an object with a type (auto, any, tool, none)")
    chosen: Body = {}
    if choice.get("disable_parallel_tool_use") is True:
        chosen["parallel_tool_calls"] = False
    kind = choice["type"]
    if kind in TOOL_CHOICES:
        chosen["tool_choice"] = TOOL_CHOICES[kind]
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            fail("tool_choice.name", "must name one of the request's tools")
        chosen["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        fail("tool_choice.type", "must be one of auto, any, tool, none")
    return chosen


def _session(metadata: Any) -> str | None:
    """`metadata.user_id`: Anthropic's end-user id, the session the backend's replicas are
    chosen by (chat's `user`)."""
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        return metadata["user_id"][:256] or None
    return None
