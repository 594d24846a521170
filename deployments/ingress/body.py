"""A request's body, read up to a limit: past it, a 413 before the rest is read (chunked
bodies too)."""

from __future__ import annotations

import re

from starlette.requests import Request

from core.errors import ApiError, ErrorCode

__all__ = ["DIGITS", "read_body"]

DIGITS = re.compile(r"[0-9]{1,18}")


async def read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(
        413,
        ErrorCode.REQUEST_TOO_LARGE,
        f"The request body exceeds the limit of {limit} bytes.",
    )
    declared = request.headers.get("content-length", "")
    # Digits only, and few: "²".isdigit() is true and int() of 5,000 digits raises (a 500).
    if DIGITS.fullmatch(declared) and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)
