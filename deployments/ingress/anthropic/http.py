"""The chat answer the ingress made for an Anthropic request, as Anthropic's HTTP answer: a
Message for a whole one, its events for a stream; and the key as Anthropic's clients send it."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.ingress.anthropic.answer import to_message
from deployments.ingress.anthropic.events import MessageEvents
from deployments.ingress.translated import kept_headers, translated_stream

__all__ = ["API_KEY_HEADER", "anthropic_answer", "authorization"]

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
