"""An ApiError as the HTTP answer the client sees: OpenAI's error JSON with its status."""

from __future__ import annotations

from starlette.responses import JSONResponse

from core.errors import ApiError

__all__ = ["error_response"]


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
