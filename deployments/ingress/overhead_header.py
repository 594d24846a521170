"""`x-gateway-overhead-ms` on every answer: the time spent in the gateway, not in an engine.

A plain ASGI middleware (Starlette's BaseHTTPMiddleware costs a task and a queue per request):
it adds the header when the response starts, unless the endpoint set it itself. The chat
endpoint does, subtracting the engine's time (core.wire.Routed.engine_wait_s); every other
answer is the gateway's own work from first to last.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["OVERHEAD_HEADER", "OverheadHeader", "milliseconds"]

OVERHEAD_HEADER = "x-gateway-overhead-ms"
_RAW_NAME = OVERHEAD_HEADER.encode()


def milliseconds(seconds: float) -> str:
    return f"{max(0.0, seconds) * 1000:.1f}"


class OverheadHeader:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == _RAW_NAME for name, _ in headers):
                    spent = milliseconds(time.perf_counter() - started).encode()
                    message = {**message, "headers": [*headers, (_RAW_NAME, spent)]}
            await send(message)

        await self._app(scope, receive, timed_send)
