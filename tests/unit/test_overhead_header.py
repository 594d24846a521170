"""`x-gateway-overhead-ms` on every answer, unless the endpoint measured it itself."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from deployments.ingress.overhead_header import OVERHEAD_HEADER, OverheadHeader


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
