"""The chat answer the ingress made for an Anthropic request, as Anthropic's HTTP answer: a
Message for a whole one, its events for a stream; the gateway's own headers kept."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.ingress.anthropic.answer import to_message
from deployments.ingress.anthropic.events import MessageEvents

__all__ = ["API_KEY_HEADER", "anthropic_answer", "authorization"]

API_KEY_HEADER = "x-api-key"
# Headers the translated body makes anew.
_BODY_HEADERS = frozenset({"content-length", "content-type"})


def authorization(headers: Mapping[str, str]) -> str | None:
    """The key as the key ring reads it: Anthropic's `x-api-key`, or `Authorization: Bearer`."""
    key = headers.get(API_KEY_HEADER)
    if key and key.strip():
        return f"Bearer {key.strip()}"
    return headers.get("authorization")


def anthropic_answer(response: Response, model: str) -> Response:
    headers = {k: v for k, v in response.headers.items() if k.lower() not in _BODY_HEADERS}
    if isinstance(response, StreamingResponse):
        events = _events(response.body_iterator, MessageEvents(model, 0))
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    completion = json.loads(bytes(response.body))
    return JSONResponse(to_message(completion, model), status_code=200, headers=headers)


async def _events(chunks: AsyncIterable[Any], events: MessageEvents) -> AsyncIterator[str]:
    """The chat stream's text turned into the message's events as it comes. Closing this closes
    the chat stream (the client left): its slot and usage are settled there."""
    try:
        async for chunk in chunks:
            text = chunk if isinstance(chunk, str) else bytes(chunk).decode()
            out = events.feed(text)
            if out:
                yield out
            if events.over:
                return
        tail = events.end()
        if tail:
            yield tail
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
