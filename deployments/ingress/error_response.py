"""An ApiError as the HTTP answer the client sees: OpenAI's error JSON with its status and the
request's id (Anthropic's shape on its Messages routes); and the app's handlers that make every
failure such an answer, never a stack trace.

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
from deployments.ingress.anthropic.errors import anthropic_body, anthropic_status

__all__ = [
    "ANTHROPIC_PATH",
    "HTTP_ERROR_CODES",
    "REQUEST_ID_HEADER",
    "anthropic_error_response",
    "error_response",
    "install_error_handlers",
]

logger = logging.getLogger("ray.serve")

# What Starlette itself refuses (routing), as OpenAI error codes.
HTTP_ERROR_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}
# Serve's request id header (ray.serve's SERVE_HTTP_REQUEST_ID_HEADER).
REQUEST_ID_HEADER = "x-request-id"
# Anthropic's Messages API: its routes answer errors in its shape (deployments/ingress/anthropic).
ANTHROPIC_PATH = "/v1/messages"


def error_response(error: ApiError, request_id: str | None = None) -> JSONResponse:
    body = error.body()
    if request_id:
        body["error"]["request_id"] = request_id
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def anthropic_error_response(error: ApiError, request_id: str | None = None) -> JSONResponse:
    """The error in Anthropic's shape and status (its Messages routes)."""
    status = anthropic_status(error.status, error.code)
    return JSONResponse(
        anthropic_body(error, request_id), status_code=status, headers=error.headers
    )


def _request_id(request: Request) -> str | None:
    return request.headers.get(REQUEST_ID_HEADER)


def _shaped(request: Request, error: ApiError) -> Response:
    """OpenAI's error JSON, or Anthropic's on Anthropic's routes."""
    if request.url.path.startswith(ANTHROPIC_PATH):
        return anthropic_error_response(error, _request_id(request))
    return error_response(error, _request_id(request))


def install_error_handlers(app: FastAPI) -> None:
    """Our errors as they are, Starlette's (404, 405) in OpenAI's shape, anything else a 500
    that says nothing of the gateway's insides (the trace goes to the log)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, ApiError)
        return _shaped(request, error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        code = HTTP_ERROR_CODES.get(error.status_code, ErrorCode.INVALID_REQUEST)
        failed = ApiError(error.status_code, code, str(error.detail))
        return _shaped(request, failed)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        logger.exception("unexpected error in the ingress")
        failed = ApiError(500, ErrorCode.INTERNAL_ERROR, "The gateway hit an internal error.")
        return _shaped(request, failed)
