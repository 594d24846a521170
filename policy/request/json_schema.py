"""A JSON schema a request carries (a tool's `parameters`, `response_format.json_schema.schema`)
checked against the JSON Schema meta-schema, as OpenAI does: a forced tool call or a JSON format
compiles it into a grammar inside the engine, where a schema that is not one is an engine error
instead of the client's 400. (A valid schema an engine's grammar compiler still refuses, such as
one with a dangling `$ref`, is the engine's to answer; tests/e2e/test_tools.py checks that it
costs no failover.)

Agents send the same tools on every call: a schema is checked once (about 0.5 ms) and its
verdict kept by the digest of its text.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from jsonschema import Draft202012Validator, SchemaError

from policy.request.fields import fail

__all__ = ["VERDICTS_KEPT", "check_json_schema"]

VERDICTS_KEPT = 1024
_verdicts: dict[str, str | None] = {}  # digest -> the problem, or None for a valid schema


def check_json_schema(schema: Any, where: str) -> None:
    """Raise ApiError 400 at `where` when `schema` (an object) is not a valid JSON schema."""
    if schema is None:
        return
    text = json.dumps(schema, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest not in _verdicts:
        if len(_verdicts) >= VERDICTS_KEPT:
            _verdicts.pop(next(iter(_verdicts)))  # the oldest
        _verdicts[digest] = _problem(schema)
    problem = _verdicts[digest]
    if problem is not None:
        fail(where, f"is not a valid JSON schema: {problem}")


def _problem(schema: Any) -> str | None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        path = "/".join(str(p) for p in error.absolute_path)
        return f"{error.message[:200]}" + (f" (at {path})" if path else "")
    return None
