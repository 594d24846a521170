"""The chat answer the ingress made for a Responses request, as the Responses API's HTTP
answer: a response object for a whole one, its events for a stream."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.ingress.responses.answer import to_response
from deployments.ingress.responses.events import ResponseEvents
from deployments.ingress.responses.request import ToolNames
from deployments.ingress.translated import kept_headers, translated_stream

__all__ = ["responses_answer"]


def responses_answer(response: Response, request: Mapping[str, Any], names: ToolNames) -> Response:
    if isinstance(response, StreamingResponse):
        return translated_stream(response, ResponseEvents(request, names))
    answer = to_response(json.loads(bytes(response.body)), request, names)
    return JSONResponse(answer, status_code=200, headers=kept_headers(response))
