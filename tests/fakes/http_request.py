"""A Starlette request as Serve's proxy hands one to the ingress: a method, a path, a bearer
key and a JSON body, for unit tests that call the ingress's routes directly."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request


def keyed_request(key: str, method: str, path: str, body: dict[str, Any] | None = None) -> Request:
    payload = json.dumps(body or {}).encode()
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {key}".encode())],
    }
    chunks = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)
