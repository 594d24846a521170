"""A whole answer that a higher class may pause, generated as a stream (policy/whole_answer.py).

The job goes through the router's streaming walk with `stream: true` and its usage asked for;
the lines it gets (a pause's, a resume's and a move's comments among them) are put together into
the `chat.completion` the client asked for, with the first part's id, the usage of all of it, and
the link it ended on. A refusal after the answer began (its paused wait shed, or no link left) is
the answer, as it would be before one began; an answer whose backend failed where it could not go
on is asked for again from the start, as one engine call (`AskAgain` here: the caller does
that, the engines' time so far carried over to the new answer's).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from typing import Any

from core.answers import EngineError, WholeAnswer
from core.clock import Now
from core.requests import ChatRequest
from core.wire import ChatJob, Opening, Refusal, Reply
from deployments.router.request_path.faults import engine_error
from policy.whole_answer import whole_answer

# The router's walk: the `Reply`, then the items, a refusal among them as it came.
Replies = Callable[[ChatJob], AsyncGenerator[Any, None]]


@dataclass(frozen=True)
class AskAgain:
    """The answer failed in its middle where it could not go on: ask for it again whole. What
    the engines took of it so far is theirs, not the gateway's (x-gateway-overhead-ms)."""

    engine_wait_s: float


def as_stream(job: ChatJob) -> ChatJob:
    """The job (a chat) asking for a stream with its usage at the end."""
    assert isinstance(job.request, ChatRequest)  # only chats are answered this way
    return replace(job, request=job.request.changed(stream=True).with_usage())


async def whole_through_stream(replies: Replies, job: ChatJob, now: Now) -> Reply | AskAgain:
    """The answer to `job` generated as a stream and handed back whole (a refusal, or an
    engine's error, as it came); AskAgain where it failed in its middle and could not go on."""
    lines: list[str] = []
    async with contextlib.aclosing(replies(as_stream(job))) as items:
        reply: Reply = await anext(items)
        if isinstance(reply, Refusal) or engine_error(reply.first) is not None:
            return reply
        item: Any = reply.first
        # The rest of the stream (and a pause's wait) is the engine's time, not the gateway's,
        # as the wait for its first item was: the overhead the ingress reports leaves it out.
        engine_since = now() - reply.routed.engine_wait_s
        while item is not None:
            if isinstance(item, Refusal):  # its paused wait shed, or no link left to go on
                return replace(item, engine_wait_s=now() - engine_since)
            for part in item if isinstance(item, list) else [item]:
                if isinstance(part, EngineError):  # an engine's error once the answer began
                    return Opening(reply.routed, part)
                if isinstance(part, str):
                    lines.append(part)
            item = await anext(items, None)
    waited = now() - engine_since
    whole = whole_answer(lines, reply.routed.prompt_tokens, job.model)
    if whole.body is None:
        return AskAgain(waited)
    routed = replace(
        reply.routed,
        backend=whole.served_by or reply.routed.backend,
        failovers=reply.routed.failovers + whole.moves,
        engine_wait_s=waited,
        pauses=whole.pauses,
    )
    return Opening(routed, WholeAnswer(whole.body))
