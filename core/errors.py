"""OpenAI-style errors: `{"error": {"message", "type", "code", "param"}}` with the right status."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "error_type_for"]

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


def error_type_for(status: int) -> str:
    return _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")


class ApiError(Exception):
    """An error the client should see as it is (never a stack trace)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        # All fields go to Exception.args too, so the error pickles across Ray processes.
        super().__init__(status, code, message, param, headers)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": error_type_for(self.status),
                "code": self.code,
                "param": self.param,
            }
        }
