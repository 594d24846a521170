"""The gateway's errors in Anthropic's shape, on Anthropic's routes only.

`{"type": "error", "error": {"type": ..., "message": ...}}` with Anthropic's types and statuses:
400 `invalid_request_error`, 401 `authentication_error`, 403 `permission_error`, 404
`not_found_error`, 413 `request_too_large`, 429 `rate_limit_error` (a key's own limits, with
`retry-after`), 529 `overloaded_error` where the gateway's capacity refused (every link shed,
or none was up: Anthropic's SDK and Claude Code retry it), 500 `api_error` for the rest.
"""

from __future__ import annotations

from typing import Any

from core.errors import ApiError, ErrorCode

__all__ = ["OVERLOADED_STATUS", "anthropic_body", "anthropic_status", "anthropic_type"]

OVERLOADED_STATUS = 529
# The gateway's capacity, not the client's limits: Anthropic's "overloaded".
OVERLOADED_CODES = frozenset(
    {ErrorCode.OVERLOADED, ErrorCode.BACKEND_UNAVAILABLE, ErrorCode.KEYS_UNAVAILABLE}
)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED_STATUS: "overloaded_error",
}


def anthropic_status(status: int, code: Any = None) -> int:
    return OVERLOADED_STATUS if code in OVERLOADED_CODES else status


def anthropic_type(status: int, code: Any = None) -> str:
    status = anthropic_status(status, code)
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_body(error: ApiError, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": anthropic_type(error.status, error.code), "message": error.message},
    }
    if request_id:
        body["request_id"] = request_id
    return body
