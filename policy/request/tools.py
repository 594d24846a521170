"""Whether the model a request reaches can take its tools: a clear 400 naming the config key
instead of vLLM's flag names ("auto" tool choice requires --enable-auto-tool-choice ...).

Runs after the schema checks (tools and tool_choice are well-formed by then).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.config import ToolsConfig
from core.errors import ApiError, ErrorCode

__all__ = ["calls_tools", "check_tool_support"]


def calls_tools(request: Any) -> bool:
    """Whether a request (a payload or a parsed request) may be answered with tool calls: it
    lists tools and does not say `tool_choice: none`."""
    if isinstance(request, Mapping):
        tools, choice = request.get("tools"), request.get("tool_choice")
    else:
        tools, choice = getattr(request, "tools", None), getattr(request, "tool_choice", None)
    return bool(tools) and choice != "none"


def check_tool_support(payload: Mapping[str, Any], model: str, tools: ToolsConfig | None) -> None:
    """Raise ApiError 400 when `payload` asks `model` for tool calls it is not configured for."""
    if not calls_tools(payload):  # no tools, or listed but not to be called: any model can
        return
    choice = payload.get("tool_choice")
    if tools is None:
        raise ApiError(
            400,
            ErrorCode.TOOLS_NOT_SUPPORTED,
            f"The model {model!r} is not configured for tool calling. Set `tools` on its entry "
            f"under models[] in the gateway config (e.g. `tools: {{parser: hermes}}`), or send "
            "the request without `tools`.",
            param="tools",
        )
    if choice in (None, "auto") and not tools.auto_choice:
        raise ApiError(
            400,
            ErrorCode.TOOLS_NOT_SUPPORTED,
            f"The model {model!r} does not choose tools by itself (models[].tools.auto_choice "
            "is false): send tool_choice 'required', 'none' or a named function.",
            param="tool_choice",
        )
