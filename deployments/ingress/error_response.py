"""An ApiError as the HTTP answer the client sees: OpenAI's error JSON with its status; and the
app's handlers that make every failure such an answer, never a stack trace."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from core.errors import ApiError, ErrorCode

__all__ = ["HTTP_ERROR_CODES", "error_response", "install_error_handlers"]

logger = logging.getLogger("ray.serve")

# What Starlette itself refuses (routing), as OpenAI error codes.
HTTP_ERROR_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Our errors as they are, Starlette's (404, 405) in OpenAI's shape, anything else a 500
    that says nothing of the gateway's insides (the trace goes to the log)."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, ApiError)
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        code = HTTP_ERROR_CODES.get(error.status_code, ErrorCode.INVALID_REQUEST)
        return error_response(ApiError(error.status_code, code, str(error.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, error: Exception) -> Response:
        logger.exception("unexpected error in the ingress")
        return error_response(
            ApiError(500, ErrorCode.INTERNAL_ERROR, "The gateway hit an internal error.")
        )
