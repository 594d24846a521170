"""`x-gateway-overhead-ms` on every answer: the time spent in the gateway's app, not in an engine
and not waiting for the client's body.

A plain ASGI middleware (Starlette's BaseHTTPMiddleware costs a task and a queue per request)
around the app's routing and endpoints: it adds the header when the response starts, from its own
start, less what its `receive` waited for the body's messages and what the endpoint reported
waiting for engines (`engine_waited`: core.wire.Routed.engine_wait_s or Refusal.engine_wait_s,
to the first item of every link tried, a failed one's too, or all of a whole answer generated as
a stream). An endpoint that set the header keeps its own.

The body's wait is the client's upload and, in Ray Serve's default mode, the replica's call back
to Serve's proxy for the body's messages (ray.serve's ASGIReceiveProxy): neither is work of
ours, and a minimal Serve app pays the second too (about 2 ms at one client on two cores:
docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["OVERHEAD_HEADER", "OverheadHeader", "engine_waited", "milliseconds"]

OVERHEAD_HEADER = "x-gateway-overhead-ms"
_RAW_NAME = OVERHEAD_HEADER.encode()


@dataclass
class _Timing:
    started: float
    body_wait_s: float = 0.0
    engine_wait_s: float = 0.0


# The request's own: set around each request, seen by its endpoint and the tasks it starts.
_TIMING: ContextVar[_Timing | None] = ContextVar("gps_request_timing", default=None)


def engine_waited(seconds: float) -> None:
    """The request being handled waited `seconds` for an engine: not the gateway's time. Outside
    a request (a batch line, through a handle) there is no header to take it from."""
    timing = _TIMING.get()
    if timing is not None:
        timing.engine_wait_s += seconds


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
        timing = _Timing(clock())

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
                    spent = clock() - timing.started - timing.body_wait_s - timing.engine_wait_s
                    spent_ms = milliseconds(spent).encode()
                    message = {**message, "headers": [*headers, (_RAW_NAME, spent_ms)]}
            await send(message)

        token = _TIMING.set(timing)
        try:
            await self._app(scope, timed_receive, timed_send)
        finally:
            _TIMING.reset(token)
