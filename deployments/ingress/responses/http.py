"""The chat answer the ingress made for a Responses request, as the Responses API's HTTP
answer: a response object for a whole one, its events for a stream. `keep`, where the request
stores its response, is awaited with the response object once it is whole (a stream's before
its last event goes out); a failed stream keeps nothing."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.ingress.responses.answer import to_response
from deployments.ingress.responses.events import ResponseEvents
from deployments.ingress.responses.request import ToolNames
from deployments.ingress.translated import kept_headers, translated_stream

__all__ = ["Keep", "responses_answer"]

Keep = Callable[[dict[str, Any]], Awaitable[None]]


async def responses_answer(
    response: Response,
    request: Mapping[str, Any],
    names: ToolNames,
    rid: str,
    keep: Keep | None = None,
) -> Response:
    if isinstance(response, StreamingResponse):
        events = ResponseEvents(request, names, rid)

        async def ended() -> None:
            if keep is not None and events.final is not None:
                await keep(events.final)

        return translated_stream(response, events, ended)
    answer = to_response(json.loads(bytes(response.body)), request, names, rid)
    if keep is not None:
        await keep(answer)
    return JSONResponse(answer, status_code=200, headers=kept_headers(response))
