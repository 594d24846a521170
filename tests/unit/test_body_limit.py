"""A request's body read up to a limit: an odd Content-Length is no reason for a 500."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from core.errors import ApiError
from deployments.ingress.body import read_body


def request(body: bytes, length: str | None) -> Request:
    headers = [] if length is None else [(b"content-length", length.encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
             "headers": headers}  # fmt: skip
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)


@pytest.mark.parametrize("length", [None, "2", "²", "9" * 5000, "-1", " 2"])
def test_the_body_is_read_by_its_bytes_whatever_the_header_says(length: str | None) -> None:
    assert asyncio.run(read_body(request(b"{}", length), 10)) == b"{}"


@pytest.mark.parametrize("length", [None, "11"])
def test_past_the_limit_is_a_413(length: str | None) -> None:
    with pytest.raises(ApiError) as refused:
        asyncio.run(read_body(request(b"x" * 11, length), 10))
    assert refused.value.status == 413
