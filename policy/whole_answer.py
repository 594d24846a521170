"""A whole (non-streamed) chat answer that a higher class may pause is generated as a stream.

A whole answer comes from the engine as one item, so nothing of it can be kept when it is
stopped. Generated as a stream instead, it can be paused and go on as the same answer
(`policy/preemption.py`, `policy/stream_migration.py`), and a backend that dies in the middle of
it hands the text so far to the next link instead of starting over; the router then hands the
client the stream's lines put together as one `chat.completion`, as the engine would have.

Pure: no Ray, no Serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policy.stream_migration import continuable, pauses_said, sse_chunks

__all__ = ["WholeAnswer", "streams_as_whole", "whole_answer"]


def streams_as_whole(request: Any) -> bool:
    """Whether a whole chat can be generated as a stream and put together again exactly: plain
    text that can be continued (no tool calls, no grammar), one choice, no log probabilities
    (each would have to be put together too)."""
    return (
        not getattr(request, "stream", False)
        and continuable(request)
        and not getattr(request, "tools", None)
        and (getattr(request, "n", None) or 1) == 1
        and not getattr(request, "logprobs", False)
        and getattr(request, "top_logprobs", None) in (None, 0)
    )


@dataclass(frozen=True)
class WholeAnswer:
    """The `chat.completion` body the lines make, or the error the stream ended with."""

    body: dict[str, Any] | None
    error: str | None = None
    pauses: int = 0  # as its closing comment says (stream_migration.pauses_note)


def whole_answer(lines: list[str], prompt_tokens: int) -> WholeAnswer:
    """The lines of one streamed answer (its `data:` chunks; comments and `[DONE]` are skipped)
    as one answer: its id, text, finish_reason and usage (counted from the chunks where the
    stream sent none: one content chunk a token, as vLLM's and our streams send them)."""
    ident = created = model = finish = None
    content: list[str] = []
    reasoning: dict[str, list[str]] = {}  # by the field the stream used (vLLM's or older)
    usage: dict[str, Any] | None = None
    pauses = max((said for said in map(pauses_said, lines) if said is not None), default=0)
    for chunk in sse_chunks(lines):
        error = chunk.get("error")
        if error is not None:
            said = error.get("message") if isinstance(error, dict) else error
            return WholeAnswer(None, str(said or "the answer failed"))
        ident = ident or chunk.get("id")
        created = created or chunk.get("created")
        model = model or chunk.get("model")
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for field in ("reasoning", "reasoning_content"):
                if delta.get(field):
                    reasoning.setdefault(field, []).append(delta[field])
            finish = choice.get("finish_reason") or finish
    if usage is None:
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(content),
            "total_tokens": prompt_tokens + len(content),
        }
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    message.update({field: "".join(parts) for field, parts in reasoning.items()})
    body = {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}],
        "usage": usage,
    }
    return WholeAnswer({k: v for k, v in body.items() if v is not None}, pauses=pauses)
