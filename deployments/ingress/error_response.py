"""An ApiError as the HTTP answer the client sees: OpenAI's error JSON with its status and the
request's id; and the app's handlers that make every failure such an answer, never a stack
trace.

The id is Serve's: its proxy takes a client's `X-Request-ID` or makes one, tags every Serve log
line of the request with it down to the engine's replica (handle calls carry it; ray.serve.llm
gives it to vLLM as the request's id), and sends it back in the `X-Request-ID` header. The error
body names it too (`error.request_id`), so a client that logs only the body can still be
found in the logs."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from core.errors import ApiError, ErrorCode

__all__ = ["HTTP_ERROR_CODES", "REQUEST_ID_HEADER", "error_response", "install_error_handlers"]

logger = logging.getLogger("ray.serve")

# What Starlette itself refuses (routing), as OpenAI error codes.
HTTP_ERROR_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}
# Serve's request id header (ray.serve's SERVE_HTTP_REQUEST_ID_HEADER).
REQUEST_ID_HEADER = "x-request-id"


def error_response(error: ApiError, request_id: str | None = None) -> JSONResponse:
    body = error.body()
    if request_id:
        body["error"]["request_id"] = request_id
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def _request_id(request: Request) -> str | None:
    return request.headers.get(REQUEST_ID_HEADER)


def install_error_handlers(app: FastAPI) -> None:
    """Our errors as they are, Starlette's (404, 405) in OpenAI's shape, anything else a 500
    that says nothing of the gateway's insides (the trace goes to the log)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, ApiError)
        return error_response(error, _request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        code = HTTP_ERROR_CODES.get(error.status_code, ErrorCode.INVALID_REQUEST)
        failed = ApiError(error.status_code, code, str(error.detail))
        return error_response(failed, _request_id(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        logger.exception("unexpected error in the ingress")
        failed = ApiError(500, ErrorCode.INTERNAL_ERROR, "The gateway hit an internal error.")
        return error_response(failed, _request_id(request))
