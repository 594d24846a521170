"""A request body read as JSON safely: in time linear in its size, never recursing without bound.

Python's `json` recurses once per nesting level (RecursionError near 1000 levels, and what it
returns below that may still be too deep for pydantic, pickle or a chat template), reads `NaN`,
`Infinity` and `1e999` as floats no field accepts, turns `\\ud800` into a string no tokenizer can
encode, and raises a plain ValueError for an integer of more than 4300 digits. Each is a 400
here. The nesting is measured on the bytes, before any parsing.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Any

import numpy as np

from core.errors import ApiError, ErrorCode

__all__ = ["nesting_exceeds", "parse_object"]

# A JSON string from its opening quote to its closing one, or to the end of a truncated body.
# It cannot fail once started (a lone backslash at the end still matches), so `sub` never
# backtracks and rescans: linear even on adversarial input.
_STRING = re.compile(rb'"[^"\\]*(?:\\.?[^"\\]*)*(?:"|\Z)', re.DOTALL)
_OPENERS = b"[{"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# An opener is a step of +1 and a closer of -1 (0xFF read as int8): the depth is a running sum.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
# An escaped UTF-16 surrogate; only then can the parsed text hold a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def nesting_exceeds(body: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays and objects more than `limit` deep.

    Exact for valid JSON; for broken JSON either answer is fine (parsing rejects it anyway).
    Strings are cut out first, so brackets inside them do not count; the rest is C loops.
    """
    if sum(body.count(opener) for opener in _OPENERS) <= limit:
        return False  # most bodies: fewer containers than the limit, nothing to measure
    steps = np.frombuffer(_STRING.sub(b"", body).translate(_STEPS, _NOT_BRACKETS), np.int8)
    return steps.size > 0 and int(np.cumsum(steps, dtype=np.int32).max()) > limit


def parse_object(body: bytes, max_depth: int) -> dict[str, Any]:
    """The body as a JSON object, or ApiError 400 naming what is wrong with it."""
    if nesting_exceeds(body, max_depth):
        raise _too_deep(max_depth)
    try:
        text = body.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as error:
        raise _invalid(f"it is not UTF-8 ({error.reason} at byte {error.start})") from None
    try:
        payload = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:  # not reached below the limit; a safety net above it
        raise _too_deep(max_depth) from None
    except ValueError as error:  # JSONDecodeError, a non-finite number, an endless integer
        raise _invalid(str(error)) from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(payload):
        raise _invalid("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff unpaired)")
    if not isinstance(payload, dict):
        raise ApiError(400, ErrorCode.INVALID_REQUEST, "The request body must be a JSON object.")
    return payload


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _has_lone_surrogate(payload: Any) -> bool:
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _too_deep(limit: int) -> ApiError:
    return ApiError(
        400,
        ErrorCode.JSON_TOO_DEEP,
        f"The request body nests arrays and objects more than {limit} deep.",
    )


def _invalid(reason: str) -> ApiError:
    return ApiError(400, ErrorCode.INVALID_JSON, f"The request body is not valid JSON: {reason}.")
