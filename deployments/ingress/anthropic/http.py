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
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping

import anyio
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from core.errors import ApiError
from deployments.ingress.anthropic.answer import to_message
from deployments.ingress.anthropic.errors import anthropic_body
from deployments.ingress.anthropic.events import MessageEvents, event
from deployments.ingress.translated import kept_headers, translated_events, translated_stream

__all__ = ["API_KEY_HEADER", "anthropic_answer", "anthropic_stream", "authorization"]

API_KEY_HEADER = "x-api-key"
INTERNAL = "The gateway failed to answer; the request may be retried."
logger = logging.getLogger(__name__)


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
    waiting = _Waiting(answer)
    try:
        done, _ = await asyncio.wait({answer}, timeout=ping_s)
    except asyncio.CancelledError:
        await waiting.release()
        raise
    if done:
        return anthropic_answer(answer.result(), model)
    return _WaitingResponse(waiting, _waited(waiting, model, ping_s))


class _Waiting:
    """The answer a begun stream waits for, released once however the stream ends: a job
    still queued is cancelled, an answer no one will read is closed (its slot and usage are
    settled where its stream closes)."""

    def __init__(self, answer: asyncio.Future[Response]) -> None:
        self.answer = answer
        self.taken = False  # its stream is being read (translated_events closes it)
        self._released = False

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        # Shielded: it runs where the client's leaving cancelled the response's scope.
        with anyio.CancelScope(shield=True):
            await self._release()

    async def _release(self) -> None:
        answer = self.answer
        if not answer.done():
            answer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await answer
            return
        if self.taken or answer.cancelled() or answer.exception() is not None:
            return
        chunks = getattr(answer.result(), "body_iterator", None)
        if isinstance(chunks, AsyncGenerator):
            # A generator closed before it began runs no `finally`: begin it (its first
            # item is in hand already), then close it.
            with contextlib.suppress(StopAsyncIteration, Exception):
                await anext(chunks)
            await chunks.aclose()


class _WaitingResponse(StreamingResponse):
    """A begun stream whose waiting answer is released however it ends, even where the
    client left before its first event was sent (its generator never began)."""

    def __init__(self, waiting: _Waiting, events: AsyncIterator[str]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._waiting = waiting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._waiting.release()


async def _waited(waiting: _Waiting, model: str, ping_s: float) -> AsyncIterator[str]:
    answer = waiting.answer
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
        except Exception:  # the gateway's own failure: said, never a cut stream
            logger.exception("a begun Messages stream's answer failed")
            yield event("error", {"error": {"type": "api_error", "message": INTERNAL}})
            return
        if not isinstance(response, StreamingResponse):  # a stream was asked for
            yield event("error", {"error": {"type": "api_error", "message": INTERNAL}})
            return
        waiting.taken = True
        async for out in translated_events(response.body_iterator, translator):
            yield out
    finally:
        await waiting.release()
