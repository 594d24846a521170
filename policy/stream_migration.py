"""Mid-stream failover: an answer whose backend died after its first token goes on elsewhere.

The router keeps the SSE lines it relays on a `StreamTape` (references only; nothing is parsed
on the way). When the backend fails mid-answer, the tape gives the text the client has received;
the job is sent to the next link of its chain with that text as a partial assistant message to
continue (vLLM's `continue_final_message`; the CPU fallback continues it the same way), and the
new link's chunks are rewritten to the first one's `id`, `created` and `model`, without a second
role chunk, so the client sees one answer. A comment line (`: gps-migrated ...`, which SSE
clients ignore) says a switch happened; `usage` counts everything the client received.

Pure: no Ray, no Serve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from core.requests import ChatRequest, Request

__all__ = [
    "DATA",
    "DONE",
    "MIGRATED",
    "RESUMED",
    "Partial",
    "Rewriter",
    "StreamTape",
    "continuable",
    "continuation_request",
    "migration_note",
    "pause_note",
    "pauses_note",
    "pauses_said",
    "resume_note",
    "sse_chunks",
    "waiting_note",
]

DATA = "data: "
DONE = "data: [DONE]"


@dataclass(frozen=True)
class Partial:
    """What the client has received of an answer so far."""

    id: str | None
    created: int | None
    model: str | None
    text: str
    completion_tokens: int  # content chunks sent: one token each in vLLM's and our streams
    prompt_tokens: int
    continuable: bool  # False for what cannot be continued as text (tool calls, n > 1)
    finished: bool = False  # its finish_reason or its usage was sent: nothing is left to go on

    def then(self, later: Partial) -> Partial:
        """This partial followed by what a continuing link added before it failed too."""
        return replace(
            self,
            text=self.text + later.text,
            completion_tokens=self.completion_tokens + later.completion_tokens,
            continuable=self.continuable and later.continuable,
        )


@dataclass
class StreamTape:
    """The SSE lines one link has sent, kept to be read only if the link fails."""

    prompt_tokens: int
    lines: list[str] = field(default_factory=list)

    def record(self, item: Any) -> None:
        if isinstance(item, list):
            self.lines.extend(part for part in item if isinstance(part, str))
        elif isinstance(item, str):
            self.lines.append(item)

    def partial(self) -> Partial:
        ident: str | None = None
        created: int | None = None
        model: str | None = None
        text: list[str] = []
        tokens = 0
        continuable = True
        finished = False
        for chunk in sse_chunks(self.lines):
            finished = finished or bool(chunk.get("usage"))
            ident = ident or chunk.get("id")
            created = created or chunk.get("created")
            model = model or chunk.get("model")
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continuable = False
                finished = finished or choice.get("finish_reason") is not None
                delta = choice.get("delta") or {}
                if (
                    delta.get("tool_calls")
                    or delta.get("reasoning_content")
                    or delta.get("reasoning")
                ):
                    continuable = False  # not plain text the next link could go on from
                if delta.get("content"):
                    text.append(delta["content"])
                    tokens += 1
        joined = "".join(text)
        return Partial(
            ident, created, model, joined, tokens, self.prompt_tokens, continuable, finished
        )


def continuable(request: Request) -> bool:
    """Whether a cut answer to this request can be continued as plain text: a chat (not a
    completion, whose prompt has no assistant turn to continue), not under a grammar (a JSON
    format, vLLM's `structured_outputs`, a forced tool call), which would start over on the next
    link."""
    if not isinstance(request, ChatRequest):
        return False
    kind = (request.response_format or {}).get("type")
    choice = request.tool_choice
    grammar = request.structured_outputs
    return kind in (None, "text") and choice in (None, "none", "auto") and grammar is None


def continuation_request(request: ChatRequest, partial: Partial, max_tokens: int) -> ChatRequest:
    """The same request, asking the next link to continue the partial answer."""
    messages = [*request.messages, {"role": "assistant", "content": partial.text}]
    left = max(1, max_tokens - partial.completion_tokens)
    return request.changed(
        messages=messages,
        continue_final_message=True,
        add_generation_prompt=False,
        max_tokens=left,
        max_completion_tokens=left,
    )


MIGRATED = ": gps-migrated"
RESUMED = ": gps-resumed"


def migration_note(source: str, target: str) -> str:
    return f"{MIGRATED} from={source} to={target}\n\n"


def pause_note(backend: str, pauses: int) -> str:
    """Said when an answer is paused for a higher class (SSE clients ignore comments)."""
    return f": gps-paused on={backend} pauses={pauses}\n\n"


def resume_note(backend: str, pauses: int) -> str:
    return f"{RESUMED} on={backend} pauses={pauses}\n\n"


def pauses_note(pauses: int) -> str:
    """A paused answer's last comment, before its `[DONE]`: how often it was paused."""
    return f": gps-pauses n={pauses}\n\n"


def pauses_said(line: str) -> int | None:
    """The count a `pauses_note` line says; None for any other line."""
    head, _, count = line.strip().partition(" n=")
    if head != pauses_note(0).partition(" n=")[0] or not count.isdigit():
        return None
    return int(count)


def waiting_note() -> str:
    """A paused answer's keep-alive while it waits for a slot."""
    return ": gps-waiting\n\n"


class Rewriter:
    """Turns a continuing link's SSE lines into more of the first link's answer (`closing`: a
    comment put before its `[DONE]`)."""

    def __init__(self, partial: Partial, closing: str | None = None) -> None:
        self._partial = partial
        self._closing = closing

    def lines(self, item: Any) -> Any:
        if not isinstance(item, list):
            return item
        out: list[Any] = []
        for part in item:
            if self._closing is not None and isinstance(part, str) and part.startswith(DONE):
                out.append(self._closing)
            rewritten = self._line(part) if isinstance(part, str) else part
            if rewritten is not None:
                out.append(rewritten)
        return out

    def _line(self, line: str) -> str | None:
        if not line.startswith(DATA) or line.startswith(DONE):
            return line
        try:
            chunk = json.loads(line[len(DATA) :])
        except ValueError:
            return line
        if not isinstance(chunk, dict) or "error" in chunk:
            return line
        partial = self._partial
        for key, value in (
            ("id", partial.id),
            ("created", partial.created),
            ("model", partial.model),
        ):
            if value is not None:
                chunk[key] = value
        choices = [c for c in chunk.get("choices") or [] if not _opening_only(c)]
        if chunk.get("choices") and not choices:
            return None  # the new link's role chunk: the client had one already
        if chunk.get("choices"):
            chunk["choices"] = choices
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            completion = int(usage.get("completion_tokens") or 0) + partial.completion_tokens
            usage.update(
                prompt_tokens=partial.prompt_tokens,
                completion_tokens=completion,
                total_tokens=partial.prompt_tokens + completion,
            )
        return f"{DATA}{json.dumps(chunk)}\n\n"


def _opening_only(choice: dict[str, Any]) -> bool:
    """A chunk that only opens the assistant turn: a role and no text."""
    delta = choice.get("delta") or {}
    return (
        "role" in delta
        and not delta.get("content")
        and not delta.get("tool_calls")
        and not choice.get("finish_reason")
    )


def sse_chunks(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON objects of an SSE stream's `data:` lines, in order (not `[DONE]`)."""
    chunks = []
    for line in lines:
        for row in line.splitlines():
            if row.startswith(DATA) and not row.startswith(DONE):
                try:
                    chunk = json.loads(row[len(DATA) :])
                except ValueError:
                    continue
                if isinstance(chunk, dict):
                    chunks.append(chunk)
    return chunks
