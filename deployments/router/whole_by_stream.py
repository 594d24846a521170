"""A whole answer that a higher class may pause, generated as a stream (policy/whole_answer.py).

The job goes through the router's streaming walk with `stream: true` and its usage asked for;
the lines it gets (a pause's and a resume's comments among them) are put together into the
`chat.completion` the client asked for, with the first link's id and the usage of all of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionResponse,
    ErrorInfo,
    ErrorResponse,
)
from vllm.entrypoints.generate.base.protocol import StreamOptions

from core.errors import ErrorCode
from core.wire import ChatJob, Opening, Refusal, Reply
from deployments.router.faults import engine_error
from policy.whole_answer import whole_answer

Chat = Callable[[ChatJob], AsyncGenerator[Any, None]]


def as_stream(job: ChatJob) -> ChatJob:
    """The job asking for a stream with its usage at the end."""
    options = StreamOptions(include_usage=True)
    request = job.request.model_copy(update={"stream": True, "stream_options": options})
    return replace(job, request=request)


async def whole_through_stream(chat: Chat, job: ChatJob) -> Reply:
    """`chat`'s answer to `job` as a stream, handed back as one whole answer (a refusal, or an
    engine's client error, as it came)."""
    lines: list[str] = []
    async with contextlib.aclosing(chat(as_stream(job))) as items:
        reply: Reply = await anext(items)
        if isinstance(reply, Refusal) or engine_error(reply.first) is not None:
            return reply
        item, first_at = reply.first, time.perf_counter()
        while item is not None:
            for part in item if isinstance(item, list) else [item]:
                if isinstance(part, ErrorResponse):  # an engine's error once the answer began
                    return Opening(reply.routed, part)
                if isinstance(part, str):
                    lines.append(part)
            item = await anext(items, None)
    # The rest of the stream (and a pause's wait) was the engine's time, not the gateway's:
    # the overhead the ingress reports leaves it out, as it does a whole answer's wait.
    waited = reply.routed.engine_wait_s + time.perf_counter() - first_at
    whole = whole_answer(lines, reply.routed.prompt_tokens)
    routed = replace(reply.routed, engine_wait_s=waited, pauses=whole.pauses)
    if whole.body is None:
        info = ErrorInfo(message=whole.error or "", type=ErrorCode.BACKEND_FAILED, code=502)
        return Opening(routed, ErrorResponse(error=info))
    return Opening(routed, ChatCompletionResponse.model_validate(whole.body))
