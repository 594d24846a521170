"""Tool calls on the fallback: the schema that forces one, and the calls read back from text.

Both engines give back text in the Hermes format (`<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`, what the fallback's template asks for; Ollama's parsed calls are written back
into it), so one reader turns every engine's answer into OpenAI `tool_calls`, as vLLM's
`hermes` parser does: a block that is not valid JSON stays in the content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["CALL_CLOSE", "CALL_OPEN", "ReadCalls", "call_text", "forced_call_schema", "read_calls"]

CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ReadCalls:
    content: str | None  # the text outside the calls; None when there is none
    calls: list[dict[str, Any]]  # OpenAI's shape: {id, type, function: {name, arguments}}


def read_calls(text: str) -> ReadCalls:
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for block in _BLOCK.finditer(text):
        call = _call(block.group(1))
        if call is None:
            continue  # not a call: it stays in the content
        calls.append(call)
        kept.append(text[last : block.start()])
        last = block.end()
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return ReadCalls(content or None, calls)


def _call(body: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": parsed["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def call_text(name: str, arguments: Any) -> str:
    """A call in the Hermes format (an engine that parsed it itself writes it back so)."""
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CALL_CLOSE}"


def forced_call_schema(tools: list[dict[str, Any]] | None, choice: Any) -> dict[str, Any] | None:
    """The JSON schema of the call `tool_choice` forces (`required`: any tool; a named
    function: that one), or None where the model decides."""
    if not tools:
        return None
    functions = [t.get("function") or {} for t in tools]
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        functions = [f for f in functions if f.get("name") == wanted]
    elif choice != "required":
        return None
    shapes = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f.get("name")},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for f in functions
    ]
    schema: dict[str, Any] = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    # `#/$defs/...` in a tool's parameters means its own root: here, this schema's.
    defs = {
        name: definition
        for f in functions
        for name, definition in ((f.get("parameters") or {}).get("$defs") or {}).items()
    }
    return {**schema, "$defs": defs} if defs else schema
