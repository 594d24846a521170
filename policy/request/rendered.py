"""A request's tools as vLLM hands them to the chat template (`tool.model_dump()` of its
ChatCompletionToolsParam): declared fields only, in vLLM's order; a function's name, description
and parameters always (null where not sent), `strict` and `defer_loading` only where set, and a
tool's own `defer_loading` passed down to its function where that has none. The router counts
the prompt with this rendering, so its count is the engine's; tests/unit/test_rendered_tools.py
holds it equal to vLLM's own dump."""

from __future__ import annotations

from typing import Any

__all__ = ["rendered_tools"]

_ALWAYS = ("name", "description", "parameters")
_WHERE_SET = ("strict", "defer_loading")


def rendered_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_tool(tool) for tool in tools]


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = dict(tool.get("function") or {})
    deferred = tool.get("defer_loading")
    if deferred is not None and function.get("defer_loading") is None:
        function["defer_loading"] = deferred
    rendered_function = {name: function.get(name) for name in _ALWAYS}
    rendered_function.update(
        {name: function[name] for name in _WHERE_SET if function.get(name) is not None}
    )
    rendered: dict[str, Any] = {"type": tool.get("type", "function"), "function": rendered_function}
    if deferred is not None:
        rendered["defer_loading"] = deferred
    return rendered
