"""A request body checked against vLLM's own JSON Schema of its kind, without vLLM: the files
here are written by `python -m deployments.engine.request_schema` from the pinned vLLM, and a
unit test holds them equal to it.

The engine's replica reads every body with vLLM's classes again; what they refuse there has been
admitted, queued and counted against a key by then. So the edge refuses first what vLLM's schema
refuses (types, ranges, enums, vLLM's extras such as `ignore_eos` and `chat_template_kwargs`);
a chat's `messages` and `tools` stay with our own rules (policy/request/schema.py), which are
stricter and 25 times cheaper than the schema for them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from core.errors import ApiError, ErrorCode

__all__ = ["LEFT_TO_OUR_RULES", "SCHEMA_DIR", "check_engine_schema"]

SCHEMA_DIR = str(Path(__file__).parent)
LEFT_TO_OUR_RULES: dict[str, tuple[str, ...]] = {"chat": ("messages", "tools")}


@cache
def _validator(kind: str) -> Draft202012Validator:
    schema = json.loads((Path(SCHEMA_DIR) / f"{kind}.json").read_text())
    return Draft202012Validator(schema)


def check_engine_schema(kind: str, payload: dict[str, Any]) -> None:
    """Raise ApiError 400 naming the field when vLLM's schema of `kind` (chat, completion,
    embedding) refuses `payload`."""
    left = LEFT_TO_OUR_RULES.get(kind, ())
    body = {k: v for k, v in payload.items() if k not in left} if left else payload
    validator = _validator(kind)
    if validator.is_valid(body):
        return
    error = best_match(validator.iter_errors(body))
    assert error is not None  # not valid: at least one error
    raise _api_error(error)


def _api_error(error: ValidationError) -> ApiError:
    where = ".".join(str(part) for part in error.absolute_path) or None
    message = error.message if len(error.message) <= 300 else error.message[:300] + "..."
    text = f"Invalid request: {where}: {message}" if where else f"Invalid request: {message}"
    return ApiError(400, ErrorCode.INVALID_REQUEST, text, param=where)
