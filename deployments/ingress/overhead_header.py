"""`x-gateway-overhead-ms` on every answer: the time spent in the gateway's app, not in an engine
and not waiting for the client's body.

A plain ASGI middleware (Starlette's BaseHTTPMiddleware costs a task and a queue per request)
around the app's routing and endpoints: it adds the header when the response starts, unless the
endpoint set it itself. The chat endpoint does, with `spent_in_gateway`, taking the engine's
time out too (core.wire.Routed.engine_wait_s); every other answer is the gateway's own work
from first to last.

The body's wait is the client's upload and, in Ray Serve's default mode, the replica's call back
to Serve's proxy for the body's messages (ray.serve's ASGIReceiveProxy): neither is work of
ours, and a minimal Serve app pays the second too (about 2.4 ms at one client on two cores:
docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["OVERHEAD_HEADER", "OverheadHeader", "milliseconds", "spent_in_gateway"]

OVERHEAD_HEADER = "x-gateway-overhead-ms"
_RAW_NAME = OVERHEAD_HEADER.encode()


@dataclass
class _Timing:
    clock: Callable[[], float]
    started: float
    body_wait_s: float = 0.0

    def spent(self, engine_wait_s: float = 0.0) -> float:
        return self.clock() - self.started - self.body_wait_s - engine_wait_s


# The request's own: set around each request, seen by its endpoint and the tasks it starts.
_TIMING: ContextVar[_Timing | None] = ContextVar("gps_request_timing", default=None)


def spent_in_gateway(engine_wait_s: float, started: float) -> float:
    """Seconds the request being handled has spent in the gateway's app so far, less the
    engine's `engine_wait_s` and its wait for its body; outside a request (a batch line, through
    a handle), since `started`."""
    timing = _TIMING.get()
    if timing is None:
        return time.perf_counter() - started - engine_wait_s
    return timing.spent(engine_wait_s)


def milliseconds(seconds: float) -> str:
    return f"{max(0.0, seconds) * 1000:.1f}"


class OverheadHeader:
    def __init__(self, app: ASGIApp, clock: Callable[[], float] = time.perf_counter) -> None:
        self._app = app
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        clock = self._clock
        timing = _Timing(clock, clock())

        async def timed_receive() -> Message:
            asked = clock()
            message = await receive()
            # Only the body: a stream's listener for the client's disconnect waits all along.
            if message["type"] == "http.request":
                timing.body_wait_s += clock() - asked
            return message

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == _RAW_NAME for name, _ in headers):
                    spent = milliseconds(timing.spent()).encode()
                    message = {**message, "headers": [*headers, (_RAW_NAME, spent)]}
            await send(message)

        token = _TIMING.set(timing)
        try:
            await self._app(scope, timed_receive, timed_send)
        finally:
            _TIMING.reset(token)
