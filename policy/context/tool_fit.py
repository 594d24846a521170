"""Tool definitions made shorter, step by step, for a window they would otherwise fill.

A coding agent's request is mostly its tools: Claude Code's 12 to 21 take 8,500 to 16,600 of
the demo model's tokens, Codex's 9 take 4,300 (tests/fixtures/agent_requests), before the user
has said a word. Their names and parameters are what a model needs to call them; their long
descriptions (usage notes, examples) are what can go. So, where the tools take more than their
share of the prompt's budget (before any turn is dropped), or the newest turn does not fit
beside them (policy.context.fit):

1. each tool's description is cut to its first sentence (at most `FIRST_SENTENCE_CHARS`), and
   each parameter's description to its first sentence too;
2. then descriptions go altogether, the parameters' too: names, types, enums and `required`
   stay, so every call the model makes is still valid against its tool.

No tool is ever dropped: a tool the model does not see is one it cannot call, and the client
asked for it. Pure: tools in (as the chat template renders them), tools out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["FIRST_SENTENCE_CHARS", "SHORTENINGS", "shortened_tools"]

FIRST_SENTENCE_CHARS = 160
SHORTENINGS = 2  # the steps above; 0 is the tools as sent
_SENTENCE_END = re.compile(r"(?<=[.!?])\s|\n")

Tool = dict[str, Any]
# JSON Schema's keywords whose values are schemas (a map of them, a list of them, or one).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMAS = frozenset(
    {"items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames"}
)


def shortened_tools(tools: Sequence[Tool], step: int) -> list[Tool]:
    """`tools` at shortening `step` (0: as sent; 1: first sentences; 2: no descriptions)."""
    if step <= 0:
        return [dict(tool) for tool in tools]
    return [_tool(tool, step) for tool in tools]


def _tool(tool: Tool, step: int) -> Tool:
    short = dict(tool)
    function = tool.get("function")
    if isinstance(function, dict):  # chat's {"type": "function", "function": {...}}
        short["function"] = _function(function, step)
    return short


def _function(function: dict[str, Any], step: int) -> dict[str, Any]:
    short = {k: v for k, v in function.items() if k != "description"}
    description = function.get("description")
    if step == 1 and isinstance(description, str) and description:
        short["description"] = first_sentence(description)
    if isinstance(function.get("parameters"), dict):
        short["parameters"] = _schema(function["parameters"], step)
    return short


def _schema(schema: Any, step: int) -> Any:
    """A JSON schema with its descriptions shortened (1) or gone (2), and nothing else
    changed: every call valid against the original is valid against this and the other way
    round. Only schema keywords are walked: a property named `description`, or a `default`
    holding one, is data and is kept."""
    if not isinstance(schema, dict):
        return schema
    short: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description" and isinstance(value, str):
            if step == 1:
                short[key] = first_sentence(value)
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            short[key] = {name: _schema(sub, step) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            short[key] = [_schema(sub, step) for sub in value]
        elif key in _SCHEMAS:
            short[key] = _schema(value, step)
        else:
            short[key] = value
    return short


def first_sentence(text: str) -> str:
    """The text's first sentence (or line), at most FIRST_SENTENCE_CHARS characters."""
    text = text.strip()
    end = _SENTENCE_END.search(text)
    first = text[: end.start()] if end else text
    if len(first) > FIRST_SENTENCE_CHARS:
        first = first[: FIRST_SENTENCE_CHARS - 3].rstrip() + "..."
    return first
