"""Per-backend answer metrics from the ingress: request seconds by backend, priority and
status, TTFT and inter-token gaps of streams, and the engines' token counts. Driven through an
`Ingress` whose router answers like an engine (tests/fakes/serve_handle.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from core.answers import EngineError
from core.config import load_config
from core.errors import ApiError
from core.wire import Opening
from deployments.ingress import metrics
from deployments.ingress.app import Ingress
from tests.fakes import serve_handle

TESTS = Path(__file__).parents[1]
BACKEND = "orchestrator@local"  # the fake router's


def request(**body: Any) -> Request:
    payload = json.dumps(
        {"model": "orchestrator", "messages": [{"role": "user", "content": "hi"}], **body}
    ).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [],
    }
    chunks = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def keyless(router: Any) -> Ingress:
    """An ingress with auth and limits off over `router`."""
    config = load_config(TESTS / "e2e" / "gateway.yaml", environ={})
    return Ingress(config.model_copy(update={"api_keys": ()}), router)


@pytest.fixture
def ingress() -> Ingress:
    return keyless(serve_handle.EngineLikeRouter())


async def answer(ingress: Ingress, **body: Any) -> Any:
    response = await ingress.chat(request(**body))
    if isinstance(response, StreamingResponse):
        async for _ in response.body_iterator:
            pass
    return response


def test_a_whole_answer_counts_its_seconds_and_tokens(ingress: Ingress) -> None:
    seconds = {"backend": BACKEND, "priority": "user", "status": "200"}
    before = sample("gps_request_seconds_count", **seconds)
    prompt = sample("gps_tokens_total", backend=BACKEND, kind="prompt")
    ttft = sample("gps_ttft_seconds_count", backend=BACKEND, priority="user")
    asyncio.run(answer(ingress, max_tokens=4))
    assert sample("gps_request_seconds_count", **seconds) == before + 1
    assert sample("gps_tokens_total", backend=BACKEND, kind="prompt") == prompt + 30
    assert sample("gps_ttft_seconds_count", backend=BACKEND, priority="user") == ttft  # no stream


def test_a_stream_counts_its_first_chunk_and_the_gaps_after_it(ingress: Ingress) -> None:
    ttft = sample("gps_ttft_seconds_count", backend=BACKEND, priority="user")
    gaps = sample("gps_inter_token_seconds_count", backend=BACKEND)
    completion = sample("gps_tokens_total", backend=BACKEND, kind="completion")
    asyncio.run(answer(ingress, stream=True))
    assert sample("gps_ttft_seconds_count", backend=BACKEND, priority="user") == ttft + 1
    # The fake relays one batch: a first chunk and no gap after it.
    assert sample("gps_inter_token_seconds_count", backend=BACKEND) == gaps
    assert sample("gps_tokens_total", backend=BACKEND, kind="completion") == completion + 25


def test_stream_timing_spreads_a_batch_gap_over_its_chunks() -> None:
    timing = metrics.StreamTiming("timed@pool", "agent", started=10.0)
    timing.relayed(2, now=10.5)  # the first chunk: TTFT 0.5 s
    timing.relayed(4, now=10.7)  # 4 chunks in 0.2 s: 4 gaps of 0.05 s
    timing.completed()
    timing.ended(now=11.0)
    assert sample("gps_ttft_seconds_sum", backend="timed@pool", priority="agent") == 0.5
    assert sample("gps_inter_token_seconds_count", backend="timed@pool") == 4
    assert sample("gps_inter_token_seconds_sum", backend="timed@pool") == pytest.approx(0.2)
    labels = {"backend": "timed@pool", "priority": "agent", "status": "200"}
    assert sample("gps_request_seconds_sum", **labels) == 1.0


def test_an_answer_refused_by_the_engine_counts_under_its_backend(ingress: Ingress) -> None:
    class Refusing(serve_handle.EngineLikeRouter):
        async def _once(self, job: Any) -> Opening:
            error = EngineError(400, "invalid_request_error", "bad")
            return Opening(serve_handle._routed(), error)

    refusing = keyless(Refusing())
    labels = {"backend": BACKEND, "priority": "user", "status": "400"}
    before = sample("gps_request_seconds_count", **labels)
    with pytest.raises(ApiError):
        asyncio.run(answer(refusing))
    assert sample("gps_request_seconds_count", **labels) == before + 1


def test_a_stream_that_ends_in_an_error_event_or_is_left_says_so() -> None:
    labels = {"backend": "told@pool", "priority": "user"}
    broken = metrics.StreamTiming("told@pool", "user", started=0.0)
    broken.relayed(1, now=0.1)
    broken.failed()  # an SSE error event went out
    broken.completed()
    broken.ended(now=0.2)
    left = metrics.StreamTiming("told@pool", "user", started=0.0)
    left.relayed(1, now=0.1)
    left.ended(now=0.3)  # never completed: the client went away
    assert sample("gps_request_seconds_count", **labels, status="502") == 1
    assert sample("gps_request_seconds_count", **labels, status="499") == 1
    assert sample("gps_request_seconds_count", **labels, status="200") == 0


def test_a_streamed_error_event_from_the_router_counts_as_502(ingress: Ingress) -> None:
    class Breaking(serve_handle.EngineLikeRouter):
        def _stream(self, job: Any) -> Any:
            error = 'data: {"error": {"message": "gone", "type": "server_error"}}\n\n'
            opening = Opening(serve_handle._routed(), ['data: {"id": "x"}\n\n'])
            return serve_handle.ItemStream([opening, [error, "data: [DONE]\n\n"]])

    labels = {"backend": BACKEND, "priority": "user", "status": "502"}
    before = sample("gps_request_seconds_count", **labels)
    asyncio.run(answer(keyless(Breaking()), stream=True))
    assert sample("gps_request_seconds_count", **labels) == before + 1


def test_a_batch_line_is_answered_at_background_priority_as_its_endpoint_would_be(
    ingress: Ingress,
) -> None:
    router = serve_handle.EngineLikeRouter()
    ingress = keyless(router)
    seconds = {"backend": BACKEND, "priority": "background", "status": "200"}
    before = sample("gps_request_seconds_count", **seconds)
    body = {"model": "orchestrator", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "stream": True}  # fmt: skip
    answer = asyncio.run(ingress.batch_answer("/v1/chat/completions", body, "anonymous"))
    assert answer["status"] == 200
    assert answer["body"]["choices"][0]["message"]["content"] == "Hi."  # whole, not streamed
    assert answer["usage"] == (30, answer["body"]["usage"]["completion_tokens"])
    assert answer["request_id"] == answer["body"]["id"]
    assert [job.priority.value for job in router.jobs] == ["background"]
    assert sample("gps_request_seconds_count", **seconds) == before + 1


def test_a_batch_line_with_a_bad_body_is_its_own_400_and_reaches_no_router() -> None:
    router = serve_handle.EngineLikeRouter()
    ingress = keyless(router)
    bad = {"model": "orchestrator", "messages": [{"role": "user", "content": "hi"}],
           "max_tokens": -3}  # fmt: skip
    answer = asyncio.run(ingress.batch_answer("/v1/chat/completions", bad, "anonymous"))
    assert answer["status"] == 400
    assert answer["body"]["error"]["param"] == "max_tokens"
    unknown = {**bad, "model": "nope", "max_tokens": 4}
    answer = asyncio.run(ingress.batch_answer("/v1/chat/completions", unknown, "anonymous"))
    assert answer["status"] == 404
    assert router.jobs == []
