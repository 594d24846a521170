"""A Responses API request as the chat-completions body the router already runs.

Plain dicts in and out (no vLLM or OpenAI protocol classes). `instructions` and the leading
`system`/`developer` messages become one system message (what every chat template and the
fitter's system compression read); later ones stay system messages in their place. Items map
to chat: `message` (its `input_text`, `output_text` and `input_image` parts), `function_call`
and `custom_tool_call` (assistant tool calls, one assistant turn for calls in a row),
`function_call_output` and `custom_tool_call_output` (tool messages). `reasoning` items a
stateless client sends back are not fed to the model again, nor items of tools no engine here
runs.

Tools: functions as they are; a `custom` (freeform) tool is offered as a function taking one
string, `input`, and its calls come back as `custom_tool_call` items with that string
(`custom_tools` names them for the answer); tools no engine here can run (`web_search`,
`file_search`, `code_interpreter`, `computer_use_preview`, `image_generation`, `mcp`,
`local_shell`, and types still to come) are left out of what the model sees, never a 400.
Codex's `namespace` tools are flattened: their functions are offered under their own names
(qualified `namespace__name` where another tool has the name), and a call of one comes back as
a `function_call` with its `namespace`, as Codex routes it.

`reasoning.effort` is chat's `reasoning_effort` (the depth router reads it for `model: auto`),
`max_output_tokens` chat's `max_tokens`, `text.format` chat's `response_format`,
`prompt_cache_key` the session (chat's `user`) where no `user` is sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policy.request.fields import fail, json_kind
from policy.request.messages import check_image_url

__all__ = ["CUSTOM_INPUT", "ChatOfResponse", "ToolNames", "to_chat"]

CUSTOM_INPUT = "input"  # the one string a custom tool's function takes
SYSTEM_ROLES = ("system", "developer")
ROLES = ("user", "assistant", *SYSTEM_ROLES)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SAMPLING = ("temperature", "top_p", "user")  # the same names in both APIs
CALLS = ("function_call", "custom_tool_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output")

Body = dict[str, Any]
Message = dict[str, Any]


@dataclass(frozen=True)
class ToolNames:
    """What the chat's function names stand for, to make its calls Responses items again."""

    custom: frozenset[str] = frozenset()  # functions that stand for custom tools
    # Functions of a `namespace` tool: the chat's name -> (namespace, the function's own
    # name). The chat's name is the function's own where no other tool has it.
    namespaced: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def item_name(self, chat_name: str) -> tuple[str, str | None]:
        """(name, namespace) of a call the model made by `chat_name`."""
        namespace, name = self.namespaced.get(chat_name, (None, chat_name))
        return name, namespace

    def chat_name(self, name: str, namespace: Any) -> str:
        if isinstance(namespace, str):
            for chat_name, (ns, own) in self.namespaced.items():
                if (ns, own) == (namespace, name):
                    return chat_name
        return name


@dataclass(frozen=True)
class ChatOfResponse:
    """The chat body, and what the answer needs to be made a Response again."""

    chat: Body
    names: ToolNames


def to_chat(body: Mapping[str, Any]) -> ChatOfResponse:
    """The chat body for a Responses `body` (ApiError 400 for what OpenAI's API refuses too)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        fail("model", "is required (a string)")
    tools, names = _tools(body.get("tools"))
    chat: Body = {
        "model": body["model"],
        "messages": _messages(body.get("input"), body.get("instructions"), names),
        **{name: body[name] for name in SAMPLING if body.get(name) is not None},
        **_max_tokens(body.get("max_output_tokens")),
        **_format(body.get("text")),
        **_effort(body.get("reasoning")),
    }
    if tools:
        chat["tools"] = tools
        chat.update(_tool_choice(body.get("tool_choice"), {t["function"]["name"] for t in tools}))
        if body.get("parallel_tool_calls") is False:
            chat["parallel_tool_calls"] = False
    if "user" not in chat and isinstance(body.get("prompt_cache_key"), str):
        chat["user"] = body["prompt_cache_key"][:256]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the usage of response.completed
    return ChatOfResponse(chat, names)


def _max_tokens(value: Any) -> Body:
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail("max_output_tokens", f"must be an integer of at least 1, got {json_kind(value)}")
    return {"max_tokens": value}


def _format(text: Any) -> Body:
    """`text.format` as chat's `response_format` (`text.verbosity` has no word in chat)."""
    format_ = text.get("format") if isinstance(text, dict) else None
    if not isinstance(format_, dict) or format_.get("type") in (None, "text"):
        return {}
    if format_["type"] == "json_object":
        return {"response_format": {"type": "json_object"}}
    if format_["type"] == "json_schema":
        schema = {
            k: format_[k] for k in ("name", "schema", "strict", "description") if k in format_
        }
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    fail("text.format.type", "must be one of text, json_object, json_schema")


def _effort(reasoning: Any) -> Body:
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    return {"reasoning_effort": effort} if effort in EFFORTS else {}


def _messages(items: Any, instructions: Any, names: ToolNames) -> list[Message]:
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        fail("input", f"must be a string or a non-empty list of items, got {json_kind(items)}")
    chat: list[Message] = []
    system = [instructions] if isinstance(instructions, str) and instructions else []
    leading = True  # system and developer messages before the first other item: one message
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            fail(where, f"must be an object, got {json_kind(item)}")
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in SYSTEM_ROLES:
            text = _text(item.get("content"), where)
            if leading:
                system.append(text)
            elif text:
                chat.append({"role": "system", "content": text})
            continue
        leading = False
        _add_item(chat, item, kind, where, names)
    if any(system):
        chat.insert(0, {"role": "system", "content": "\n\n".join(t for t in system if t)})
    return chat


def _add_item(
    chat: list[Message], item: Mapping[str, Any], kind: Any, where: str, names: ToolNames
) -> None:
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            fail(f"{where}.role", f"must be one of {', '.join(ROLES)}")
        chat.append({"role": role, "content": _content(item.get("content"), where)})
    elif kind in CALLS:
        _add_call(chat, item, kind, where, names)
    elif kind in OUTPUTS:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            fail(f"{where}.call_id", "is required (a string)")
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output, f"{where}.output")
        chat.append({"role": "tool", "tool_call_id": call_id, "content": text})
    # reasoning (not fed to the model again), item_reference, and items of tools no engine
    # here runs (web_search_call, local_shell_call, ...): nothing the model reads back.


def _add_call(
    chat: list[Message], item: Mapping[str, Any], kind: str, where: str, names: ToolNames
) -> None:
    """A call joins the assistant turn it follows (calls in a row, or after the answer's text)."""
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        fail(where, f"of type {kind} needs call_id and name (strings)")
    if kind == "custom_tool_call":
        raw = item.get("input")
        arguments = json.dumps({CUSTOM_INPUT: raw if isinstance(raw, str) else ""})
    else:
        raw = item.get("arguments")
        arguments = raw if isinstance(raw, str) else json.dumps(raw or {})
    name = names.chat_name(name, item.get("namespace"))
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = chat[-1] if chat else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        chat.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _content(content: Any, where: str) -> str | list[Body]:
    """A message's content: text parts as one string, or the parts where an image is one."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        fail(f"{where}.content", f"must be a string or a list of parts, got {json_kind(content)}")
    parts: list[Body] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            fail(f"{where}.content.{j}", f"must be an object, got {json_kind(part)}")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                fail(f"{where}.content.{j}.image_url", "is required (a data URL)")
            check_image_url(url, f"{where}.content.{j}.image_url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def _text(content: Any, where: str) -> str:
    """Text only (a system message, a tool's output): images have no place there."""
    found = _content(content, where) if content is not None else ""
    if isinstance(found, str):
        return found
    return "\n\n".join(p["text"] for p in found if p["type"] == "text")


def _tools(tools: Any) -> tuple[list[Body], ToolNames]:
    if tools is None:
        return [], ToolNames()
    if not isinstance(tools, list):
        fail("tools", f"must be a list, got {json_kind(tools)}")
    functions: list[Body] = []
    custom: list[str] = []
    inner: list[tuple[str, Body, bool]] = []  # a namespace's functions: (namespace, tool, custom)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            fail(f"tools.{i}", f"must be an object, got {json_kind(tool)}")
        kind = tool.get("type")
        if kind == "namespace" and isinstance(tool.get("name"), str):
            inner += _members(tool, f"tools.{i}")
        elif kind in ("function", "custom"):
            _check_name(tool, f"tools.{i}")
            functions.append(_function(tool, tool["name"], kind == "custom"))
            if kind == "custom":
                custom.append(tool["name"])
        # Hosted tools (web_search, file_search, mcp, ...): no engine here runs them.
    namespaced = _flattened(inner, functions, custom)
    return functions, ToolNames(frozenset(custom), namespaced)


def _flattened(
    inner: list[tuple[str, Body, bool]], functions: list[Body], custom: list[str]
) -> dict[str, tuple[str, str]]:
    """A namespace's functions added to `functions` (and `custom`) under the function's own
    name where it is the only tool of that name, else `namespace__name`."""
    taken = {f["function"]["name"] for f in functions}
    own_names = [member["name"] for _, member, _ in inner]
    namespaced: dict[str, tuple[str, str]] = {}
    for namespace, member, is_custom in inner:
        name = member["name"]
        unique = name not in taken and own_names.count(name) == 1
        chat_name = name if unique else f"{namespace}__{name}"
        namespaced[chat_name] = (namespace, name)
        functions.append(_function(member, chat_name, is_custom))
        if is_custom:
            custom.append(chat_name)
    return namespaced


def _members(namespace: Mapping[str, Any], where: str) -> list[tuple[str, Body, bool]]:
    members = namespace.get("tools")
    found = []
    for j, member in enumerate(members if isinstance(members, list) else []):
        if isinstance(member, dict) and member.get("type") in ("function", "custom"):
            _check_name(member, f"{where}.tools.{j}")
            found.append((namespace["name"], member, member["type"] == "custom"))
    return found


def _check_name(tool: Mapping[str, Any], where: str) -> None:
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        fail(f"{where}.name", "is required (a string)")


def _function(tool: Mapping[str, Any], name: str, custom: bool) -> Body:
    function: Body = {"name": name}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    if custom:  # freeform text, as one string argument
        what = "The tool's whole input, as raw text."
        properties = {CUSTOM_INPUT: {"type": "string", "description": what}}
        function["parameters"] = {
            "type": "object",
            "properties": properties,
            "required": [CUSTOM_INPUT],
        }
    else:
        parameters = tool.get("parameters")
        function["parameters"] = parameters if isinstance(parameters, dict) else {"type": "object"}
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, names: set[str]) -> Body:
    if choice is None or choice in ("auto", "none", "required"):
        return {} if choice is None else {"tool_choice": choice}
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            fail("tool_choice.name", "must name one of the request's tools")
        return {"tool_choice": {"type": "function", "function": {"name": name}}}
    # allowed_tools, a hosted tool's type, and what comes next: the model chooses.
    return {"tool_choice": "auto"}
