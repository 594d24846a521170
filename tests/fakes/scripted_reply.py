"""What the test engine answers when a test scripts it: the subject is a client's protocol (a
coding agent's tool round trip), not a model, and a 135M model does not call tools on cue.

A user message with a line `CALL <tool> <JSON arguments>`, in a request that offers that tool,
is answered with that call; once a tool's result is in the conversation, the answer quotes it.
Anything else gets the engine's usual words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["QUOTE", "ScriptedCall", "ScriptedText", "scripted_reply"]

DIRECTIVE = re.compile(r"^CALL (\S+) (\{.*\})\s*$", re.MULTILINE)
QUOTE = "The tool said: "
QUOTED_CHARS = 400


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: str  # JSON, as a model emits it


@dataclass(frozen=True)
class ScriptedText:
    text: str


def scripted_reply(
    messages: Sequence[Mapping[str, Any]], tool_names: Iterable[str]
) -> ScriptedCall | ScriptedText | None:
    """The scripted answer to `messages`, or None where the script says nothing."""
    results = [m for m in messages if m.get("role") == "tool"]
    if results:
        return ScriptedText(QUOTE + _text(results[-1].get("content"))[:QUOTED_CHARS])
    offered = set(tool_names)
    users = [m for m in messages if m.get("role") == "user"]
    for match in DIRECTIVE.finditer(_text(users[-1].get("content")) if users else ""):
        name, arguments = match.groups()
        if name in offered:
            return ScriptedCall(name, json.dumps(json.loads(arguments)))
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else str(part)
            for part in content
        )
    return "" if content is None else str(content)
