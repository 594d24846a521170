"""The gateway's one error taxonomy: every code a client can see, and who is at fault.

Clients get OpenAI's error JSON `{"error": {"message", "type", "code", "param"}}`; `type`
follows the status (`error_type_for`), `code` is one of `ErrorCode`. The tree, by fault:

    the client's (never charged to a backend, never failed over)
    ├── 400 invalid_json, json_too_deep, too_many_messages, missing_model,
    │       invalid_request (a field, or what an engine rejects: policy.engine_errors),
    │       context_length_exceeded (the latest user message alone cannot fit),
    │       invalid_priority, tools_not_supported (the model's config has no `tools`),
    │       fim_not_supported (`suffix` to a model whose tokenizer has no FIM markers),
    │       previous_response_not_found (no stored response of that id for this key)
    ├── 401 missing_api_key, invalid_api_key          403 admin_only
    ├── 404 model_not_found, not_found          405 method_not_allowed
    ├── 409 key_name_taken (POST/PATCH /v1/keys: another key has that name)
    ├── 413 request_too_large
    └── 429 rate_limited, budget_exceeded (over the key's own limits: policy.key_limits)
    the gateway's capacity (the client may retry: Retry-After)
    ├── 429 overloaded (shed by admission, or waited past router.queue_timeout_s)
    ├── 503 keys_unavailable (a replica that has not read the run-time keys yet)
    └── 503 store_unavailable (the stored responses' keeper is not reachable now)
    a backend's (charged to its breaker; the job moves down its chain)
    ├── backend_oom          out of memory or a dead engine (policy.oom): the replica is replaced
    ├── backend_error        any other engine failure (5xx, or 502 when the engine said 4xx)
    ├── backend_unavailable  503: every link of the chain failed or is down
    └── backend_failed       an SSE error event: the stream broke after its first token and
                             no link could continue it (policy.stream_migration)
    ours
    └── 500 internal_error   a bug in the gateway: logged with its trace, never shown

In-process, a failure travels as an exception until an adapter turns it into one of these:
`ApiError` (ingress: raised by the request checks, rendered by
deployments/ingress/error_response.py),
`Refusal` (router -> ingress, core/wire.py), vLLM's `ErrorResponse` (engine -> router), which
`policy.engine_errors` reads as an `EngineError` and judges `Fault.CLIENT` or `Fault.BACKEND`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["ApiError", "ErrorCode", "error_type_for", "invalid_fields"]


class ErrorCode(StrEnum):
    INVALID_JSON = "invalid_json"
    JSON_TOO_DEEP = "json_too_deep"
    TOO_MANY_MESSAGES = "too_many_messages"
    MISSING_MODEL = "missing_model"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    INVALID_PRIORITY = "invalid_priority"
    TOOLS_NOT_SUPPORTED = "tools_not_supported"
    FIM_NOT_SUPPORTED = "fim_not_supported"
    MISSING_API_KEY = "missing_api_key"
    INVALID_API_KEY = "invalid_api_key"
    ADMIN_ONLY = "admin_only"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    KEY_NAME_TAKEN = "key_name_taken"
    REQUEST_TOO_LARGE = "request_too_large"
    RATE_LIMITED = "rate_limited"
    BUDGET_EXCEEDED = "budget_exceeded"
    OVERLOADED = "overloaded"
    KEYS_UNAVAILABLE = "keys_unavailable"
    PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"
    STORE_UNAVAILABLE = "store_unavailable"
    BACKEND_OOM = "backend_oom"
    BACKEND_ERROR = "backend_error"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    BACKEND_FAILED = "backend_failed"
    INTERNAL_ERROR = "internal_error"


_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
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


def invalid_fields(error: ValidationError, what: str = "request") -> ApiError:
    """A pydantic model's refusal of a client's body as a 400: its first problem, with `param`
    naming the field."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or None
    message = f"Invalid {what}: {where}: {first['msg']}" if where else str(first["msg"])
    return ApiError(400, ErrorCode.INVALID_REQUEST, message, param=where)
