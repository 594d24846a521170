"""How one field of a request is checked, and how its failure reads to the client."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

from core.errors import ApiError, ErrorCode

__all__ = [
    "check_optional",
    "fail",
    "fail_choice",
    "is_int",
    "is_number",
    "json_kind",
    "require",
    "short",
]


def fail(param: str, problem: str) -> NoReturn:
    raise ApiError(
        400, ErrorCode.INVALID_REQUEST, f"Invalid request: {param} {problem}.", param=param
    )


def fail_choice(param: str, value: Any, allowed: tuple[str, ...], context: str = "") -> NoReturn:
    """`value` is not one of `allowed` (`context` says where, e.g. " in user messages")."""
    got = short(value) if isinstance(value, str) else json_kind(value)
    fail(param, f"must be one of {', '.join(allowed)}{context}; got {got}")


def require(obj: dict[str, Any], key: str, type_: type, expected: str, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, type_):
        fail(f"{where}.{key}", f"must be {expected}, not {json_kind(value)}")
    return value


def check_optional(
    obj: Mapping[str, Any], key: str, type_: type, expected: str, where: str = ""
) -> None:
    value = obj.get(key)
    if value is not None and not isinstance(value, type_):
        param = f"{where}.{key}" if where else key
        fail(param, f"must be {expected}, not {json_kind(value)}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def json_kind(value: Any) -> str:
    """A value's JSON type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
