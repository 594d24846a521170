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

from core.requests import ChatRequest, Request
from policy.stream_migration import (
    MIGRATED,
    RESUMED,
    continuable,
    pauses_said,
    sse_chunks,
)

__all__ = ["WholeAnswer", "streams_as_whole", "whole_answer"]


# What a whole answer may carry besides its text: an answer that asks for any of it is one
# engine call, as the engine would put it (a stream's pieces of it are not put together here).
WHOLE_ONLY_FIELDS = (
    "tools",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "logprob_token_ids",
    "echo",
    "return_token_ids",
    "return_tokens_as_token_ids",
    "return_token_offsets",
    "return_prompt_text",
)


def streams_as_whole(request: Request) -> bool:
    """Whether a whole chat can be generated as a stream and put together again exactly: plain
    text that can be continued (no tool calls, no grammar), one choice, nothing but its text,
    finish_reason and usage asked for."""
    if not isinstance(request, ChatRequest) or not continuable(request):
        return False
    return (
        not request.stream
        and (request.n or 1) == 1
        and not any(getattr(request, name, None) for name in WHOLE_ONLY_FIELDS)
    )


@dataclass(frozen=True)
class WholeAnswer:
    """The `chat.completion` body the lines make, or the error the stream ended with."""

    body: dict[str, Any] | None
    error: str | None = None
    pauses: int = 0  # as its closing comment says (stream_migration.pauses_note)
    served_by: str | None = None  # the link it ended on, where it moved after its first
    moves: int = 0  # links it moved to after one failed in its middle


def _moves(lines: list[str]) -> tuple[str | None, int]:
    """The link the answer ended on as its comments name it (after a move: `to=`; after a
    pause: `on=`), and how many moves there were."""
    last, moves = None, 0
    for line in lines:
        words = line.split()
        if line.startswith(MIGRATED):
            moves += 1
        if line.startswith((MIGRATED, RESUMED)):
            last = next((w.split("=", 1)[1] for w in words if w.startswith(("to=", "on="))), last)
    return last, moves


def whole_answer(lines: list[str], prompt_tokens: int, fallback_model: str) -> WholeAnswer:
    """The lines of one streamed answer (its `data:` chunks; comments and `[DONE]` are skipped)
    as one answer: its id, text, finish_reason, stop_reason, the last link's system_fingerprint
    and usage (counted from the chunks where the stream sent none: one content chunk a token,
    as vLLM's and our streams send them); `fallback_model`: its model's name where no chunk
    gave one."""
    ident = created = model = finish = stop_reason = fingerprint = None
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
        # The link it ended on: after a move, the last link's (as `served_by`).
        fingerprint = chunk.get("system_fingerprint") or fingerprint
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
            if choice.get("stop_reason") is not None:  # a stop string, or a token id (0 too)
                stop_reason = choice["stop_reason"]
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
        "model": model or fallback_model,
        # As the engine's whole answer has them: no logprobs (one that asks is not generated
        # as a stream), the stop string or token that ended it (vLLM's field, where it sent it).
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish or "stop",
                "stop_reason": stop_reason,
            }
        ],
        "usage": usage,
        "system_fingerprint": fingerprint,
    }
    served_by, moves = _moves(lines)
    kept = {k: v for k, v in body.items() if v is not None}
    return WholeAnswer(kept, pauses=pauses, served_by=served_by, moves=moves)
