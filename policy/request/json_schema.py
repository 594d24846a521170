"""A JSON schema a request carries (a tool's `parameters`, `response_format.json_schema.schema`)
checked against the JSON Schema meta-schema, as OpenAI does: a forced tool call or a JSON format
compiles it into a grammar inside the engine, where a broken one is an engine error instead of
the client's 400.

Agents send the same tools on every call: a schema is checked once (about 0.5 ms) and its
verdict cached by its text.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema import Draft202012Validator, SchemaError

from policy.request.fields import fail

__all__ = ["check_json_schema"]


def check_json_schema(schema: Any, where: str) -> None:
    """Raise ApiError 400 at `where` when `schema` (an object) is not a valid JSON schema."""
    if schema is None:
        return
    problem = _problem(json.dumps(schema, sort_keys=True))
    if problem is not None:
        fail(where, f"is not a valid JSON schema: {problem}")


@functools.lru_cache(maxsize=1024)
def _problem(text: str) -> str | None:
    try:
        Draft202012Validator.check_schema(json.loads(text))
    except SchemaError as error:
        path = "/".join(str(p) for p in error.absolute_path)
        return f"{error.message[:200]}" + (f" (at {path})" if path else "")
    return None
