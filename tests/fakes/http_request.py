"""A Starlette request as Serve's proxy hands one to the ingress: a method, a path, a bearer
key, a query and a JSON body, for unit tests that call the ingress's routes directly; what a
route answered, as text; and what an ASGI app sent for one request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive


def keyed_request(
    key: str, method: str, path: str, body: dict[str, Any] | None = None, query: str = ""
) -> Request:
    payload = json.dumps(body or {}).encode()
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query.encode(),
        "headers": [(b"authorization", f"Bearer {key}".encode())],
    }
    chunks = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)


async def response_text(response: Any) -> str:
    """A route's answer as text: a stream's parts joined, or the body."""
    if hasattr(response, "body_iterator"):
        return "".join([part async for part in response.body_iterator])
    return bytes(response.body).decode()


def sent_for(app: ASGIApp, path: str, receive: Receive) -> list[Message]:
    """The messages `app` sent for one POST to `path` whose body `receive` hands over, the
    response's start first."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def call() -> None:
        scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
        await app(scope, receive, send)

    asyncio.run(call())
    return sent
