"""The chat answer the ingress made for an Anthropic request, as Anthropic's HTTP answer: a
Message for a whole one, its events for a stream; and the key as Anthropic's clients send it.

A stream whose answer has not begun within the ping interval (it waits in a queue for a slot)
is begun there, as Anthropic's own: `message_start`, then a `ping` each interval until the
answer comes, whose events follow in that message; a refusal then is an `event: error` in
Anthropic's shape (before it, a refusal keeps its HTTP status, 429 with `retry-after` or 529).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping

from starlette.responses import JSONResponse, Response, StreamingResponse

from core.errors import ApiError
from deployments.ingress.anthropic.answer import to_message
from deployments.ingress.anthropic.errors import anthropic_body
from deployments.ingress.anthropic.events import MessageEvents, event
from deployments.ingress.translated import kept_headers, translated_events, translated_stream

__all__ = ["API_KEY_HEADER", "anthropic_answer", "anthropic_stream", "authorization"]

API_KEY_HEADER = "x-api-key"


def authorization(headers: Mapping[str, str]) -> str | None:
    """The key as the key ring reads it: Anthropic's `x-api-key`, or `Authorization: Bearer`."""
    key = headers.get(API_KEY_HEADER)
    if key and key.strip():
        return f"Bearer {key.strip()}"
    return headers.get("authorization")


def anthropic_answer(response: Response, model: str) -> Response:
    if isinstance(response, StreamingResponse):
        return translated_stream(response, MessageEvents(model, 0))
    message = to_message(json.loads(bytes(response.body)), model)
    return JSONResponse(message, status_code=200, headers=kept_headers(response))


async def anthropic_stream(answer: asyncio.Future[Response], model: str, ping_s: float) -> Response:
    """The streamed answer `answer` will be: as it is where it comes within `ping_s`, else
    begun at once and pinged until it comes. Its refusal within `ping_s` is raised."""
    try:
        done, _ = await asyncio.wait({answer}, timeout=ping_s)
    except asyncio.CancelledError:
        answer.cancel()
        raise
    if done:
        return anthropic_answer(answer.result(), model)
    return StreamingResponse(_waited(answer, model, ping_s), media_type="text/event-stream")


async def _waited(
    answer: asyncio.Future[Response], model: str, ping_s: float
) -> AsyncIterator[str]:
    translator = MessageEvents(model, 0)
    try:
        yield translator.start()
        while not answer.done():
            done, _ = await asyncio.wait({answer}, timeout=ping_s)
            if not done:
                yield event("ping", {})
        try:
            response = answer.result()
        except ApiError as error:
            yield event("error", {"error": anthropic_body(error)["error"]})
            return
        if not isinstance(response, StreamingResponse):  # a stream was asked for
            yield event("error", {"error": {"type": "api_error", "message": "No stream came."}})
            return
        async for out in translated_events(response.body_iterator, translator):
            yield out
    finally:
        if not answer.done():  # the client left while it waited: its job goes
            answer.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await answer
