"""`x-gateway-overhead-ms` on every answer, unless the endpoint measured it itself; the wait for
the request's body is not the gateway's."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from starlette.types import Message

from deployments.ingress.overhead_header import (
    OVERHEAD_HEADER,
    OverheadHeader,
    engine_waited,
)
from tests.fakes.clock import FakeClock
from tests.fakes.http_request import sent_for


async def plain(_: Request) -> Response:
    return JSONResponse({"ok": True})


async def measured(_: Request) -> Response:
    return JSONResponse({"ok": True}, headers={OVERHEAD_HEADER: "1.5"})


async def streamed(_: Request) -> Response:
    async def body() -> AsyncIterator[str]:
        yield "data: 1\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def client() -> TestClient:
    routes = [Route("/plain", plain), Route("/measured", measured), Route("/streamed", streamed)]
    return TestClient(OverheadHeader(Starlette(routes=routes)))


def test_every_answer_carries_it_errors_and_streams_included() -> None:
    with client() as http:
        for path, status in (("/plain", 200), ("/streamed", 200), ("/missing", 404)):
            answer = http.get(path)
            assert answer.status_code == status
            assert float(answer.headers[OVERHEAD_HEADER]) >= 0


def test_an_endpoint_that_measured_it_keeps_its_own() -> None:
    with client() as http:
        answer = http.get("/measured")
    assert answer.headers.get_list(OVERHEAD_HEADER) == ["1.5"]


def answer_to_a_slow_upload(waits_for_an_engine: bool) -> dict[bytes, bytes]:
    """A POST whose body takes 5 s to arrive in two parts (a slow client; in Serve's default
    mode, the calls back to the proxy for it), 3 ms of the gateway's own work and, where the
    endpoint says so as the chat endpoint does, 2 s of an engine's."""
    clock = FakeClock()

    async def endpoint(request: Request) -> Response:
        await request.body()
        clock.now += 0.001
        if waits_for_an_engine:
            clock.now += 2.0
            engine_waited(2.0)
        clock.now += 0.002
        return JSONResponse({})

    app = OverheadHeader(Starlette(routes=[Route("/", endpoint, methods=["POST"])]), clock=clock)
    chunks = [b'{"model":', b' "m"}']

    async def receive() -> Message:
        clock.now += 2.5
        body = chunks.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(chunks)}

    sent = sent_for(app, "/", receive)
    assert sent[0]["status"] == 200
    return dict(sent[0]["headers"])


@pytest.mark.parametrize("waits_for_an_engine", [False, True])
def test_neither_the_body_nor_the_engine_is_counted(waits_for_an_engine: bool) -> None:
    headers = answer_to_a_slow_upload(waits_for_an_engine)
    assert headers[OVERHEAD_HEADER.encode()] == b"3.0"


def test_an_engine_wait_reported_outside_a_request_reaches_no_request() -> None:
    """A batch line answered through a handle: no HTTP request, nothing to take it from."""
    engine_waited(10.0)
    headers = answer_to_a_slow_upload(waits_for_an_engine=False)
    assert headers[OVERHEAD_HEADER.encode()] == b"3.0"
