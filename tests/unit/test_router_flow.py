"""The router's request path without Ray: failover, breakers, slots, shedding, mid-stream faults,
health and KV watching, placement and the status report.

Every port is a fake (`deployments.router.adapters.ports`): backends answer from a script, Serve's
status is a dict, the clock is turned by hand. The real Serve adapters are exercised by tests/e2e.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, RayError

from core.answers import EngineError
from core.config import ClusterConfig, parse_config
from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest
from core.types import PriorityClass, Role
from core.wire import ChatJob, Opening, PlacementView, Refusal, Routed
from deployments.router.adapters.in_process import InProcessRouter
from deployments.router.loops import watch
from deployments.router.request_path.image_costs import ASK_AGAIN_AFTER_S
from deployments.router.router import Router
from policy.context.images import IMAGE_MARKER
from policy.context.tokens import KNOWN_FIM_MARKERS, CharEstimateCounter, FimMarkers
from policy.engine_counters import EngineCounters
from tests.fakes.clock import FakeClock
from tests.fakes.router_harness import (
    Behaviour,
    FakeBackend,
    FakeDeployments,
    FakePlacement,
    FakeStream,
    Rounds,
    breaker_opened,
    chunks_of,
    collect,
    dead,
    engine_error,
    job,
    make_config,
    make_router,
    ok,
    sample,
    served_by,
    sse,
    two,
)
from tests.unit.test_image_fit import png_url


def raised_by_the_replica(_: int) -> list[Any]:
    # In Serve's throughput mode a replica's own exception comes over gRPC as itself, not
    # wrapped in Ray's RayTaskError: still the backend's fault, not a bug of the router's (the
    # main suite run in that mode answered 500 here).
    return [RuntimeError("injected fault")]


@pytest.mark.parametrize("fault", [dead, raised_by_the_replica])
def test_a_fault_before_the_first_token_moves_the_job_down_the_chain(
    fault: Behaviour,
) -> None:
    coding, orchestrator = FakeBackend(fault), FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))
    routed, *rest = asyncio.run(collect(router, job()))
    assert isinstance(routed, Routed)
    assert (routed.backend, routed.failovers) == ("orchestrator@local", 1)
    assert rest == [['data: {"x": 1}\n\n'], ["data: [DONE]\n\n"]]


def test_the_breaker_opens_after_exactly_three_faults_and_then_skips_the_backend() -> None:
    coding, orchestrator = FakeBackend(engine_error(500)), FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))

    async def five() -> list[str]:
        return [await served_by(router) for _ in range(5)]

    assert asyncio.run(five()) == ["orchestrator@local"] * 5
    assert coding.calls == 3
    asyncio.run(router.metrics_text())  # the states are read at scrape time
    assert sample("gps_breaker_state", backend="coding@local", state="open") == 1
    assert sample("gps_breaker_state", backend="coding@local", state="closed") == 0
    assert sample("gps_breaker_state", backend="orchestrator@local", state="closed") == 1


def test_client_errors_pass_through_and_never_trip_the_breaker() -> None:
    coding = FakeBackend(engine_error(400))
    router = make_router(make_config(), two(coding, FakeBackend(ok)))

    async def five() -> list[Any]:
        return [await collect(router, job()) for _ in range(5)]

    for routed, error in asyncio.run(five()):
        assert routed.backend == "coding@local"
        assert isinstance(error, EngineError)
    assert coding.calls == 5


def test_the_engines_wait_counts_every_link_tried_the_failed_ones_too() -> None:
    """x-gateway-overhead-ms leaves out what the engines took: a link that failed after 3 s
    (its timeout, a dead replica's error) took them from the engine, not from the gateway."""
    clock = FakeClock()
    coding, orchestrator = FakeBackend(dead), FakeBackend(ok)
    for backend, wait_s in ((coding, 3.0), (orchestrator, 2.0)):
        backend.clock, backend.first_item_s = clock, wait_s
    router = make_router(make_config(), two(coding, orchestrator), clock=clock)
    routed = asyncio.run(collect(router, job()))[0]
    assert (routed.backend, routed.failovers) == ("orchestrator@local", 1)
    assert routed.engine_wait_s == 5.0


def test_a_refusal_after_every_link_failed_carries_their_engines_wait() -> None:
    """Two links that failed after 3 s and 2 s, then nowhere left: the 503's header leaves their
    5 s out of the gateway's overhead too."""
    clock = FakeClock()
    coding, orchestrator = FakeBackend(dead), FakeBackend(dead)
    for backend, wait_s in ((coding, 3.0), (orchestrator, 2.0)):
        backend.clock, backend.first_item_s = clock, wait_s
    router = make_router(make_config(), two(coding, orchestrator), clock=clock)
    [refusal] = asyncio.run(collect(router, job()))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.engine_wait_s) == (503, 5.0)


def test_a_stream_whose_backend_dies_goes_on_on_the_next_link_as_one_answer() -> None:
    coding = FakeBackend(
        lambda _: [
            [sse("first", {"role": "assistant", "content": ""}), sse("first", {"content": "One"})],
            [sse("first", {"content": " two"})],
            RayError("died mid-way"),
        ]
    )
    usage = {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33}
    orchestrator = FakeBackend(
        lambda _: [
            [
                sse("other", {"role": "assistant", "content": ""}),
                sse("other", {"content": " three"}),
            ],
            [sse("other", {"content": "."}), sse("other", usage=usage)],
            ["data: [DONE]\n\n"],
        ]
    )
    router = make_router(make_config(), two(coding, orchestrator))
    migrations = {"from": "coding@local", "to": "orchestrator@local"}
    before = sample("gps_stream_migrations_total", **migrations)
    routed, *items = asyncio.run(collect(router, job()))
    lines = [line for item in items for line in item]

    assert routed.backend == "coding@local"
    assert lines[-1] == "data: [DONE]\n\n"
    assert not any("error" in x for x in lines)
    assert any(
        x.startswith(": gps-migrated from=coding@local to=orchestrator@local") for x in lines
    )
    chunks = chunks_of(lines)
    # One answer: one id, one role chunk, the text in order, usage for all it received.
    assert {c["id"] for c in chunks} == {"first"}
    assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "One two three."
    assert chunks[-1]["usage"]["completion_tokens"] == 3 + 2
    # The next link was asked to continue the text the client had, within the same budget.
    continued = orchestrator.requests[0]
    assert continued.messages[-1] == {"role": "assistant", "content": "One two"}
    assert continued.continue_final_message
    assert not continued.add_generation_prompt
    assert continued.max_tokens == 8 - 2
    assert sample("gps_stream_migrations_total", **migrations) == before + 1


def test_a_long_stream_goes_on_on_a_smaller_window_with_its_newest_text() -> None:
    """The answer so far is longer than the fallback's whole window; the link between them has
    no replica (Serve is replacing it): the fallback continues, fitted, to [DONE]."""
    words = [f" w{i}" for i in range(1200)]  # ~1,200 tokens by the estimate; the window: 512
    coding = FakeBackend(
        lambda _: [
            [sse("first", {"role": "assistant", "content": ""})],
            [sse("first", {"content": w}) for w in words],
            RayError("died mid-way"),
        ]
    )
    orchestrator = FakeBackend(ok)
    orchestrator.routable = 0
    usage = {"prompt_tokens": 300, "completion_tokens": 2, "total_tokens": 302}
    fallback = FakeBackend(
        lambda _: [
            [sse("fb", {"role": "assistant", "content": ""}), sse("fb", {"content": " more"})],
            [sse("fb", {"content": "."}), sse("fb", usage=usage)],
            ["data: [DONE]\n\n"],
        ]
    )
    config = make_config(fallback_window=512)
    handles = {"coding@local": coding, "orchestrator@local": orchestrator, "cpu-fallback": fallback}
    router = make_router(config, handles)
    request = job().request.model_copy(update={"max_tokens": 1500})
    routed, *items = asyncio.run(collect(router, replace(job(), request=request)))
    lines = [line for item in items for line in item]

    assert routed.backend == "coding@local"
    assert lines[-1] == "data: [DONE]\n\n"
    assert not any('"error"' in x for x in lines)
    assert any(x.startswith(": gps-migrated from=coding@local to=cpu-fallback") for x in lines)
    assert orchestrator.calls == 0
    chunks = chunks_of(lines)
    assert chunks[-1]["usage"]["completion_tokens"] == len(words) + 2
    [continued] = fallback.requests
    *prompt, answer = continued.messages
    assert prompt == [{"role": "user", "content": "hi"}]
    assert answer["role"] == "assistant"
    assert answer["content"].startswith("[The start of this answer was omitted")
    assert answer["content"].endswith("".join(words[-50:]))
    assert continued.continue_final_message
    assert continued.max_tokens <= int(512 * 0.6)


def test_a_link_that_refuses_to_continue_is_passed_over_without_blame() -> None:
    coding = FakeBackend(lambda _: [[sse("first", {"content": "One"})], RayError("died")])
    refusing = FakeBackend(engine_error(400))
    router = make_router(make_config(), two(coding, refusing))
    before = sample("gps_backend_faults_total", backend="orchestrator@local")
    _routed, _first, last = asyncio.run(collect(router, job()))
    # Nothing left to continue on (the fallback has no handle here): an SSE error, not a 400
    # object in the middle of a stream, and the refusing link's breaker is untouched.
    assert "backend_failed" in last[0]
    assert last[1] == "data: [DONE]\n\n"
    assert refusing.calls == 1
    assert sample("gps_backend_faults_total", backend="orchestrator@local") == before


def test_a_stream_no_link_can_continue_ends_with_an_error_event() -> None:
    coding = FakeBackend(lambda _: [[sse("first", {"content": "One"})], RayError("died")])
    # And the fallback has no backend here: the chain ends.
    router = make_router(make_config(), two(coding, FakeBackend(dead)))
    routed, _first, last = asyncio.run(collect(router, job()))
    assert routed.backend == "coding@local"
    assert "backend_failed" in last[0]
    assert last[1] == "data: [DONE]\n\n"


def test_an_error_event_from_the_engine_mid_stream_is_a_fault_the_stream_survives() -> None:
    error_line = 'data: {"error": {"message": "EngineCore died", "type": "x", "code": 500}}\n\n'
    coding = FakeBackend(
        lambda _: [
            [sse("first", {"content": "One"})],
            [sse("first", {"content": " two"}), error_line],
        ]
    )
    orchestrator = FakeBackend(
        lambda _: [[sse("other", {"content": " three"})], ["data: [DONE]\n\n"]]
    )
    router = make_router(make_config(), two(coding, orchestrator))
    _routed, *items = asyncio.run(collect(router, job()))
    lines = [line for item in items for line in item]
    assert not any('"error"' in line for line in lines)
    assert lines[-1] == "data: [DONE]\n\n"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks_of(lines))
    assert text == "One two three"  # the text before the error was kept, then continued
    assert orchestrator.requests[0].messages[-1]["content"] == "One two"


def test_an_exception_the_replica_raised_itself_mid_stream_is_continued_on_the_next_link() -> None:
    coding = FakeBackend(lambda _: [[sse("first", {"content": "One"})], RuntimeError("boom")])
    orchestrator = FakeBackend(
        lambda _: [[sse("other", {"content": " two"})], ["data: [DONE]\n\n"]]
    )
    router = make_router(make_config(), two(coding, orchestrator))
    before = sample("gps_backend_faults_total", backend="coding@local")
    _routed, *items = asyncio.run(collect(router, job()))
    lines = [line for item in items for line in item]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks_of(lines))
    assert text == "One two"
    assert sample("gps_backend_faults_total", backend="coding@local") == before + 1


def test_a_stream_under_a_json_format_is_not_continued() -> None:
    coding = FakeBackend(lambda _: [[sse("first", {"content": '{"a": '})], RayError("died")])
    orchestrator = FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))
    formatted = job()
    request = formatted.request.model_copy(update={"response_format": {"type": "json_object"}})
    _routed, _first, last = asyncio.run(collect(router, replace(formatted, request=request)))
    assert "backend_failed" in last[0]
    assert orchestrator.calls == 0


def test_a_stream_of_tool_calls_is_not_continued_as_text() -> None:
    call = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{"}}]}
    coding = FakeBackend(lambda _: [[sse("first", call)], RayError("died")])
    orchestrator = FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))
    _routed, _first, last = asyncio.run(collect(router, job()))
    assert "backend_failed" in last[0]
    assert orchestrator.calls == 0


def test_no_first_token_in_time_is_a_fault() -> None:
    slow = FakeBackend(ok, step_s=2.0)  # first_token_timeout_s is 1 s in make_config
    router = make_router(make_config(), two(slow, FakeBackend(ok)))
    routed, *_ = asyncio.run(collect(router, job()))
    assert (routed.backend, routed.failovers) == ("orchestrator@local", 1)
    assert slow.streams[0].cancelled


def as_whole(chat_job: ChatJob) -> ChatJob:
    """The same job asking for a whole answer (no stream)."""
    return replace(chat_job, request=chat_job.request.model_copy(update={"stream": False}))


def test_a_whole_answer_leaves_the_engines_stream_to_end_by_itself() -> None:
    """A whole answer is the engine's last item: no cancel goes out after it (through Ray, a
    round to the engine's replica for nothing). One that never came in time is cancelled."""
    whole_job = as_whole(job())
    answer = [{"choices": [{"message": {"content": "hi"}}]}]
    coding = FakeBackend(lambda _: [answer])
    router = make_router(make_config(), two(coding, FakeBackend(ok)))
    reply = asyncio.run(router.chat_once(whole_job))
    assert isinstance(reply, Opening)
    assert reply.first == answer
    assert not coding.streams[0].cancelled
    assert coding.running == 0

    slow = FakeBackend(lambda _: [answer], step_s=2.0)  # first_token_timeout_s is 1 s
    router = make_router(make_config(), two(slow, FakeBackend(lambda _: [answer])))
    reply = asyncio.run(router.chat_once(whole_job))
    assert isinstance(reply, Opening)
    assert reply.routed.backend == "orchestrator@local"
    assert slow.streams[0].cancelled


def test_a_whole_answer_served_is_its_breakers_success() -> None:
    """Faults between served whole answers are not in a row: a whole answer, handed back at its
    one item (chat_once reads no further), resets the breaker's count as a stream's end does."""
    whole_job = as_whole(job())
    answer = [{"choices": [{"message": {"content": "hi"}}]}]
    fault = engine_error(500)
    coding = FakeBackend(lambda call: [answer] if call == 3 else fault(call))
    router = make_router(make_config(), two(coding, FakeBackend(lambda _: [answer])))

    async def five() -> list[str]:
        replies = [await router.chat_once(whole_job) for _ in range(5)]
        return [r.routed.backend for r in replies if isinstance(r, Opening)]

    # Faults on calls 1, 2, 4 and 5 with an answer on 3: never three in a row (breaker_failures).
    assert asyncio.run(five()) == [
        *("orchestrator@local", "orchestrator@local", "coding@local"),
        *("orchestrator@local", "orchestrator@local"),
    ]
    assert coding.calls == 5
    assert not asyncio.run(breaker_opened(router, "coding@local"))


class CancelRaisingStream(FakeStream):
    """As Ray's handle reads: a read cancelled mid-way raises an error of its own."""

    async def __anext__(self) -> Any:
        try:
            return await super().__anext__()
        except asyncio.CancelledError:
            raise RuntimeError("the request was cancelled") from None


class CancelRaisingBackend(FakeBackend):
    stream_type = CancelRaisingStream


def test_a_first_item_given_up_on_leaves_no_error_for_asyncio_to_log() -> None:
    slow = CancelRaisingBackend(ok, step_s=2.0)  # past first_token_timeout_s (1 s)
    router = make_router(make_config(), two(slow, FakeBackend(ok)))
    logged: list[str] = []

    async def run() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: logged.append(c["message"]))
        return await collect(router, job())

    # Quiet: a captured log record of the failover would hold the error, and through its
    # traceback the abandoned read, past the collection below.
    serve_logger = logging.getLogger("ray.serve")
    level = serve_logger.level
    serve_logger.setLevel(logging.ERROR)
    try:
        routed, *_ = asyncio.run(run())
    finally:
        serve_logger.setLevel(level)
    gc.collect()  # an unread error is logged (to its loop's handler) when its task is collected
    assert (routed.backend, routed.failovers) == ("orchestrator@local", 1)
    assert slow.streams[0].cancelled
    assert logged == []


def test_a_stream_that_stalls_mid_way_past_the_idle_timeout_goes_on_on_the_next_link() -> None:
    # Each item comes 0.4 s after the last: the first well within first_token_timeout_s (1 s),
    # the second past stream_idle_timeout_s (0.15 s here); a slow machine only widens the gap.
    stalling = FakeBackend(
        lambda _: [
            [sse("first", {"role": "assistant", "content": ""}), sse("first", {"content": "One"})],
            [sse("first", {"content": " never"})],
        ],
        step_s=0.4,
    )
    config = make_config()
    idle = config.router.model_copy(update={"stream_idle_timeout_s": 0.15})
    router = make_router(config.model_copy(update={"router": idle}), two(stalling, FakeBackend(ok)))
    routed, *items = asyncio.run(collect(router, job()))
    lines = [line for item in items for line in item]
    assert routed.backend == "coding@local"
    assert any(
        x.startswith(": gps-migrated from=coding@local to=orchestrator@local") for x in lines
    )
    assert not any("never" in x for x in lines)
    assert stalling.streams[0].cancelled


def test_every_link_down_is_a_503_with_retry_after() -> None:
    router = make_router(make_config(), two(FakeBackend(dead), FakeBackend(dead)))
    [refusal] = asyncio.run(collect(router, job()))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code) == (503, "backend_unavailable")
    assert "coding@local, orchestrator@local" in refusal.message
    assert refusal.retry_after_s is not None


def test_the_cap_holds_under_concurrency_and_every_job_is_served() -> None:
    coding = FakeBackend(ok, step_s=0.01)
    router = make_router(make_config(cap=2, max_queue=32), two(coding, FakeBackend(ok)))

    async def twenty() -> list[list[Any]]:
        return await asyncio.gather(*(collect(router, job()) for _ in range(20)))

    results = asyncio.run(twenty())
    assert all(r[0].backend == "coding@local" and len(r) == 3 for r in results)
    assert coding.max_running == 2


def test_a_backend_holds_its_queued_jobs_too_until_they_are_served() -> None:
    """What a placement move drains by: a job waiting for a slot still belongs to the backend."""
    coding = FakeBackend(ok, step_s=0.1)
    router = make_router(make_config(cap=1), two(coding, FakeBackend(ok)))

    async def three() -> tuple[int, int]:
        jobs = [asyncio.create_task(collect(router, job())) for _ in range(3)]
        await asyncio.sleep(0.05)
        held_while_running = router.held()["coding@local"]
        await asyncio.gather(*jobs)
        return held_while_running, router.held()["coding@local"]

    assert asyncio.run(three()) == (3, 0)
    assert coding.max_running == 1


def test_a_full_queue_sheds_background_with_429_and_retry_after() -> None:
    coding = FakeBackend(ok, step_s=0.05)
    router = make_router(make_config(cap=1, max_queue=1), two(coding, FakeBackend(ok)))

    async def burst() -> list[list[Any]]:
        jobs = [job(priority=PriorityClass.BACKGROUND) for _ in range(3)]
        return await asyncio.gather(*(collect(router, j) for j in jobs))

    outcomes = [r[0] for r in asyncio.run(burst())]
    refusals = [o for o in outcomes if isinstance(o, Refusal)]
    assert len(refusals) == 1
    assert (refusals[0].status, refusals[0].code) == (429, "overloaded")
    assert refusals[0].retry_after_s == 2


def fail_over_into_a_full_orchestrator(router: Router) -> tuple[list[Any], str]:
    """A coding job sent while orchestrator's one slot and one queue place hold its own work:
    the job's answer, and orchestrator's breaker state right after it."""

    async def scenario() -> tuple[list[Any], str]:
        own = [asyncio.create_task(collect(router, job(Role.ORCHESTRATOR))) for _ in range(2)]
        await asyncio.sleep(0.05)  # one running, one queued: orchestrator is full
        failing_over = await collect(router, job())
        breaker = (await router.status())["backends"]["orchestrator@local"]["breaker"]
        assert all(r[0].backend == "orchestrator@local" for r in await asyncio.gather(*own))
        return failing_over, breaker

    return asyncio.run(scenario())


def test_a_job_failing_over_that_the_next_link_sheds_goes_on_to_the_link_after_it() -> None:
    """Coding died; orchestrator is full with its own work: a client of coding's gets the CPU
    fallback's answer, not a 429, and no breaker hears of the shed."""
    coding, busy, fallback = FakeBackend(dead), FakeBackend(ok, step_s=0.2), FakeBackend(ok)
    handles = {"coding@local": coding, "orchestrator@local": busy, "cpu-fallback": fallback}
    router = make_router(make_config(cap=1, max_queue=1), handles)
    failing_over, breaker = fail_over_into_a_full_orchestrator(router)
    routed = failing_over[0]
    assert isinstance(routed, Routed), routed
    assert routed.backend == "cpu-fallback"
    assert breaker == "closed"


def test_a_job_shed_by_every_link_after_a_failover_gets_the_429() -> None:
    busy = FakeBackend(ok, step_s=0.2)
    clock = FakeClock()
    coding = FakeBackend(dead)
    coding.clock, coding.first_item_s = clock, 3.0  # failed after 3 s: the engine's, not ours
    router = make_router(make_config(cap=1, max_queue=1), two(coding, busy), clock=clock)
    [refusal], _ = fail_over_into_a_full_orchestrator(router)
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code, refusal.retry_after_s) == (429, "overloaded", 2)
    assert refusal.engine_wait_s == 3.0


def test_a_client_that_goes_away_frees_the_slot_and_aborts_the_engine_request() -> None:
    coding = FakeBackend(lambda _: [["a"], ["b"], ["c"]], step_s=0.01)
    router = make_router(make_config(cap=1), two(coding, FakeBackend(ok)))

    async def leave_early() -> Any:
        stream = router.chat(job())
        await anext(stream)  # Routed
        await anext(stream)  # first chunk
        await stream.aclose()
        return await collect(router, job())  # the slot is free again

    again = asyncio.run(leave_early())
    assert again[0].backend == "coding@local"
    assert coding.streams[0].cancelled
    assert coding.running == 0


def test_a_chain_whose_first_links_are_down_ends_on_the_fallback_fitted_to_its_window() -> None:
    coding, orchestrator, fallback = FakeBackend(dead), FakeBackend(dead), FakeBackend(ok)
    config = make_config(fallback_window=512)
    handles = {"coding@local": coding, "orchestrator@local": orchestrator, "cpu-fallback": fallback}
    router = make_router(config, handles)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 100}
        for i in range(30)
    ]
    request = ChatRequest(model="coding", messages=turns, max_tokens=1000, stream=True)
    routed, *_ = asyncio.run(
        collect(router, ChatJob(request, Role.CODING, PriorityClass.USER, "t"))
    )
    assert (routed.backend, routed.failovers) == ("cpu-fallback", 2)
    [sent] = fallback.requests
    assert sent.model == "cpu-fallback"
    assert routed.context_fitted
    assert routed.dropped_messages > 0
    assert routed.max_tokens <= int(512 * 0.6)
    assert routed.prompt_tokens + routed.max_tokens <= 512
    assert sent.messages[-1] == turns[-1]
    assert sent.max_tokens == routed.max_tokens


WEATHER = {"type": "function", "function": {"name": "weather", "description": "x " * 200}}


def test_a_job_that_may_call_tools_skips_links_without_them_and_is_fitted_with_them() -> None:
    coding, orchestrator, fallback = FakeBackend(dead), FakeBackend(ok), FakeBackend(ok)
    config = make_config(tools_on=("coding", "cpu-fallback"))
    handles = {"coding@local": coding, "orchestrator@local": orchestrator, "cpu-fallback": fallback}
    router = make_router(config, handles)

    def routed_for(**fields: Any) -> Routed:
        request = ChatRequest(
            model="coding", messages=[{"role": "user", "content": "hi"}], stream=True, **fields
        )
        routed = asyncio.run(
            collect(router, ChatJob(request, Role.CODING, PriorityClass.USER, "t"))
        )
        assert isinstance(routed[0], Routed)
        return routed[0]

    plain = routed_for()
    called = routed_for(tools=[WEATHER])
    # orchestrator@local has no `tools`: the job with tools passes it for the fallback.
    assert (plain.backend, plain.failovers) == ("orchestrator@local", 1)
    assert (called.backend, called.failovers) == ("cpu-fallback", 1)
    # Tools listed but not to be called: any link will do.
    listed = routed_for(tools=[WEATHER], tool_choice="none")
    assert listed.backend == "orchestrator@local"
    # The listing takes room in the prompt, counted before the output is clamped.
    listing = CharEstimateCounter().count_tools([WEATHER])
    assert called.prompt_tokens >= plain.prompt_tokens + listing > plain.prompt_tokens + 100


def picture_job(*urls: str, text: str = "what is this", max_tokens: int = 8) -> ChatJob:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    parts.append({"type": "text", "text": text})
    request = ChatRequest(
        model="coding", messages=[{"role": "user", "content": parts}], max_tokens=max_tokens
    )
    return ChatJob(request, Role.CODING, PriorityClass.USER, "t")


class ExactChars(CharEstimateCounter):
    """The estimate's counts, taken as a tokenizer's (exact) ones."""

    exact = True


def test_a_job_with_images_is_counted_with_what_its_engine_says_an_image_costs() -> None:
    coding = FakeBackend(ok)
    coding.image_costs = lambda size: size[0] + size[1]  # tokens by width and height
    config = make_config(images_on=("coding",))
    counters = {t.counter_key: ExactChars() for t in config.targets.values()}
    router = make_router(config, two(coding, FakeBackend(ok)), counters=counters)
    text = asyncio.run(collect(router, picture_job()))[0]
    small, large = png_url(8, 8), png_url(300, 200)
    [routed, *_] = asyncio.run(collect(router, picture_job(small, large, small)))
    assert isinstance(routed, Routed)
    assert isinstance(text, Routed)
    # Counted, not bounded: the text as before and each image at its engine's cost.
    assert routed.prompt_counted
    assert routed.prompt_tokens == text.prompt_tokens + 16 + 500 + 16
    assert coding.image_asks == [[(8, 8), (300, 200)]]  # each size asked once
    asyncio.run(collect(router, picture_job(large)))
    assert coding.image_asks == [[(8, 8), (300, 200)]]  # and then known


def test_images_an_engine_cannot_count_are_never_dropped_on_a_guess() -> None:
    coding, clock = FakeBackend(ok), FakeClock()
    config = make_config(images_on=("coding",))
    router = make_router(config, two(coding, FakeBackend(ok)), clock=clock)
    # The engine cannot say: 1024 x 1024 is estimated at 74 x 74 patches, 5,476 tokens, more
    # than the window of 4,096 holds. The newest message's images go on no estimate: a 503.
    first, second = png_url(64, 64, "red"), png_url(1024, 1024, "blue")
    [refusal] = asyncio.run(collect(router, picture_job(first, second, max_tokens=64)))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code) == (503, "backend_unavailable")
    assert refusal.retry_after_s
    assert "could not count" in refusal.message
    # Not asked again at once (each ask waits out its timeout on a broken engine) ...
    coding.image_costs = lambda size: 300
    asyncio.run(collect(router, picture_job(first, second, max_tokens=64)))
    assert len(coding.image_asks) == 1
    # ... and counted once asked again.
    clock.now += ASK_AGAIN_AFTER_S
    [routed, *_] = asyncio.run(collect(router, picture_job(first, second, max_tokens=64)))
    assert isinstance(routed, Routed)
    assert routed.dropped_images == 0


def test_the_oldest_images_go_behind_markers_where_the_newest_do_not_fit_beside_them() -> None:
    coding = FakeBackend(ok)
    coding.image_costs = lambda size: 1900  # two of them do not fit the window of 4,096
    router = make_router(make_config(images_on=("coding",)), two(coding, FakeBackend(ok)))
    old, new = png_url(64, 64, "red"), png_url(32, 32, "blue")
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": old}},
                                     {"type": "text", "text": "this?"}]},
        {"role": "assistant", "content": "a red square"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": new}},
                                     {"type": "text", "text": "and this?"}]},
    ]  # fmt: skip
    request = ChatRequest(model="coding", messages=messages, max_tokens=64)
    [routed, *_] = asyncio.run(
        collect(router, ChatJob(request, Role.CODING, PriorityClass.USER, "t"))
    )
    assert isinstance(routed, Routed)
    assert routed.dropped_images == 1
    assert routed.context_fitted
    sent = coding.requests[-1].messages
    assert sent[0]["content"] == f"{IMAGE_MARKER}\nthis?"
    assert sent[2]["content"][0]["image_url"]["url"] == new


def test_a_job_with_images_goes_only_to_links_that_read_them() -> None:
    coding = FakeBackend(ok)
    handles = {"coding@local": coding, "orchestrator@local": FakeBackend(ok)}
    handles["cpu-fallback"] = FakeBackend(ok)
    router = make_router(make_config(images_on=("coding",)), handles)
    image_job = picture_job(png_url(8, 8))
    [routed, *_] = asyncio.run(collect(router, image_job))
    assert isinstance(routed, Routed)
    assert routed.backend == "coding@local"
    # Its only reader down: a 503 to retry, never a text link that would drop the image or
    # refuse it as the client's fault.
    coding.behaviour = dead
    [refusal] = asyncio.run(collect(router, image_job))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code) == (503, "backend_unavailable")
    assert refusal.retry_after_s is not None
    # A text job takes the rest of the chain as ever.
    [routed, *_] = asyncio.run(collect(router, job()))
    assert isinstance(routed, Routed)
    assert routed.backend == "orchestrator@local"


def test_an_out_of_memory_answer_opens_the_breaker_at_once_and_the_job_fails_over() -> None:
    coding = FakeBackend(engine_error(503, kind="backend_oom"))
    router = make_router(make_config(), two(coding, FakeBackend(ok)))

    async def twice() -> list[str]:
        return [await served_by(router) for _ in range(2)]

    assert asyncio.run(twice()) == ["orchestrator@local"] * 2
    assert coding.calls == 1  # the second job skipped it: one OOM is enough
    metrics = asyncio.run(router.metrics_text()).decode()
    assert 'gps_backend_oom_total{backend="coding@local"} 1.0' in metrics


def placed_config() -> ClusterConfig:
    raw = {
        "pools": [{"name": "local", "kind": "local"}, {"name": "cloud", "kind": "cloud"}],
        "models": [
            {
                "role": "reasoning",
                "source": "example/reasoning",
                "context_window": 4096,
                "pools": ["local", "cloud"],
                "placement_priority": "P3",
            }
        ],
        "fallback": {"source": "fallback.gguf"},
    }
    return parse_config(raw, base_dir=Path("."), environ={})


def test_placement_moves_a_roles_work_and_parked_links_take_none() -> None:
    local, cloud, fallback = FakeBackend(ok), FakeBackend(ok), FakeBackend(ok)
    handles = {"reasoning@local": local, "reasoning@cloud": cloud, "cpu-fallback": fallback}
    router = make_router(placed_config(), handles)
    reasoning = job(role=Role.REASONING)

    async def scenario() -> list[str]:
        seen = [await served_by(router, reasoning)]  # home pool; cloud starts parked
        homes = {"reasoning": "reasoning@local"}
        # The first view carries a move made before this replica: shown, not counted.
        earlier = {"seq": 1, "model": "reasoning", "kind": "restore", "outcome": "done"}
        router.apply_placement(PlacementView(1, homes, frozenset({"reasoning@cloud"}), (earlier,)))
        moved = {"reasoning": "reasoning@cloud"}
        record = {"seq": 2, "model": "reasoning", "kind": "offload", "outcome": "done"}
        view = PlacementView(2, moved, frozenset({"reasoning@local"}), (earlier, record))
        router.apply_placement(view)
        router.apply_placement(view)  # the next sync: the same move is not counted again
        seen.append(await served_by(router, reasoning))
        local.behaviour = dead  # the parked source is never a failover target while it drains
        cloud.behaviour = dead
        seen.append(await served_by(router, reasoning))
        return seen

    assert asyncio.run(scenario()) == ["reasoning@local", "reasoning@cloud", "cpu-fallback"]
    assert local.calls == 1
    metrics = asyncio.run(router.metrics_text()).decode()
    moves = 'gps_placement_moves_total{kind="offload",model="reasoning",outcome="done"}'
    assert f"{moves} 1.0" in metrics
    assert 'kind="restore"' not in metrics
    assert 'gps_model_pool{model="reasoning",pool="cloud"} 1.0' in metrics
    assert 'gps_model_pool{model="reasoning",pool="local"} 0.0' in metrics


def test_the_placement_actors_failed_rounds_are_counted_by_the_router() -> None:
    handles = {n: FakeBackend(ok) for n in ("reasoning@local", "reasoning@cloud", "cpu-fallback")}
    router = make_router(placed_config(), handles)
    homes = {"reasoning": "reasoning@local"}
    before = sample("gps_loop_errors_total", loop="placement")
    for version, errors in ((1, 2), (2, 2), (3, 5), (4, 1)):  # the actor restarted before 4
        view = PlacementView(version, homes, frozenset({"reasoning@cloud"}), loop_errors=errors)
        router.apply_placement(view)
    assert sample("gps_loop_errors_total", loop="placement") == before + 5 + 1


# -- watching: health, KV, placement sync ------------------------------------------------------


def test_a_backend_without_a_running_replica_takes_no_work_until_a_probe_passes() -> None:
    coding, orchestrator = FakeBackend(ok), FakeBackend(ok)
    deployments = FakeDeployments()
    router = make_router(make_config(), two(coding, orchestrator), deployments=deployments)

    async def scenario() -> list[str]:
        deployments.set(coding, running=0)
        await router.check_health_once()
        seen = [await served_by(router)]
        deployments.set(coding, running=1)
        await router.check_health_once()  # its breaker tripped: back only once probed healthy
        seen.append(await served_by(router))
        return seen

    assert asyncio.run(scenario()) == ["orchestrator@local", "coding@local"]
    assert coding.probes == 1


def test_a_probe_that_hangs_holds_up_no_other_links_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica too stuck to answer its probe waits out the probe's timeout; meanwhile the
    health loop's next rounds check the other links: another's death is seen at once."""
    monkeypatch.setattr(watch, "HEALTH_PROBE_TIMEOUT_S", 3600.0)  # longer than the test
    coding, orchestrator = FakeBackend(ok), FakeBackend(ok)
    deployments = FakeDeployments()
    clock = FakeClock(advance=True)  # each loop's sleep moves it: no breaker half-opens meanwhile
    config = make_config(router={"breaker_cooldown_s": 1e9})
    router = make_router(
        config, two(coding, orchestrator), watch=True, deployments=deployments, clock=clock
    )
    deployments.set(coding, running=0)

    async def probed() -> bool:
        return coding.probes > 0

    async def scenario() -> None:
        rounds = Rounds(clock)
        async with asyncio.timeout(30):
            await rounds.until(lambda: breaker_opened(router, "coding@local"))
            deployments.set(coding, running=1)  # back, but stuck: it needs a probe
            coding.probe_hangs = True
            await rounds.until(probed)
            deployments.set(orchestrator, running=0)
            await rounds.until(lambda: breaker_opened(router, "orchestrator@local"))
        assert coding.probes == 1  # still waiting for its one probe
        assert await breaker_opened(router, "coding@local")  # not back before a probe passed

    asyncio.run(scenario())


def test_a_round_that_finds_a_backend_without_a_replica_reads_again_soon() -> None:
    """Trouble found in a round: the next comes after `health_interval_s`, not the idle one."""
    coding, orchestrator = FakeBackend(ok), FakeBackend(ok)
    deployments = FakeDeployments()
    clock = FakeClock()  # each loop runs one round, then sleeps for good
    config = make_config(router={"health_interval_s": 7.0, "health_idle_interval_s": 70.0})
    router = make_router(
        config, two(coding, orchestrator), watch=True, deployments=deployments, clock=clock
    )
    deployments.set(coding, running=0)

    async def scenario() -> None:
        await served_by(router)  # starts the loops
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert 7.0 in clock.sleeps
    assert 70.0 not in clock.sleeps


def test_a_backend_whose_handle_holds_no_replica_is_passed_over_at_once() -> None:
    """Serve's handle says the only replica is gone (its replacement loading) before any health
    check ran and before any request failed: no job is sent there to wait for it."""
    coding, orchestrator = FakeBackend(ok), FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))

    async def scenario() -> list[Any]:
        coding.routable = 0
        seen = [await served_by(router), await served_by(router)]
        seen.append((await router.status())["backends"]["coding@local"]["routable_replicas"])
        coding.routable = 1  # the replacement is in the handle's set: work goes back at once
        seen.append(await served_by(router))
        return seen

    assert asyncio.run(scenario()) == ["orchestrator@local"] * 2 + [0, "coding@local"]
    assert coding.calls == 1


def test_a_job_queued_for_a_slot_when_the_replica_dies_fails_over_without_being_sent() -> None:
    """The job chose the link while it ran and waited for its slot; the replica died meanwhile."""
    coding = FakeBackend(lambda _: [["a"], ["b"]], step_s=0.05)
    orchestrator = FakeBackend(ok)
    router = make_router(make_config(cap=1), two(coding, orchestrator))

    async def scenario() -> tuple[str, list[Any]]:
        first = asyncio.create_task(collect(router, job()))
        await asyncio.sleep(0.01)  # the first holds coding's only slot
        second = asyncio.create_task(served_by(router))
        await asyncio.sleep(0.01)  # the second waits for it
        coding.routable = 0
        return await second, await first

    second, first = asyncio.run(scenario())
    assert (second, first[0].backend) == ("orchestrator@local", "coding@local")
    assert coding.calls == 1


def test_a_job_held_in_an_emptied_handle_stops_waiting_and_fails_over() -> None:
    """Sent to a replica that died as it was sent: Serve retries the call into a handle that
    now holds no replica, where it would wait for the replacement. It moves on instead."""
    coding = FakeBackend(ok, step_s=30.0)  # its first item never comes in this test
    orchestrator = FakeBackend(ok)
    clock = FakeClock()
    router = make_router(make_config(), two(coding, orchestrator), clock=clock)

    async def scenario() -> tuple[Any, list[bool]]:
        waiting = asyncio.create_task(collect(router, job()))
        await asyncio.sleep(0.05)  # sent; waiting for its first item
        coding.routable = 0  # the handle dropped the dead replica
        router.check_replicas_once()
        await asyncio.sleep(0.05)
        still = [waiting.done()]  # within the grace: a replacement may just be arriving
        clock.now += 1.0
        router.check_replicas_once()
        routed = (await asyncio.wait_for(waiting, 5))[0]
        return routed, still

    routed, still = asyncio.run(scenario())
    assert still == [False]
    assert (routed.backend, routed.failovers) == ("orchestrator@local", 1)
    assert coding.streams[0].cancelled  # its place in the handle's queue given up


def test_an_unknown_replica_count_never_takes_a_link_out() -> None:
    coding, orchestrator = FakeBackend(ok), FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))
    coding.routable = None
    assert asyncio.run(served_by(router)) == "coding@local"


def test_a_dead_only_replica_stays_out_past_its_cooldown_until_a_probe_passes() -> None:
    coding, orchestrator = FakeBackend(lambda _: [ActorDiedError()]), FakeBackend(ok)
    clock = FakeClock()
    router = make_router(make_config(), two(coding, orchestrator), clock=clock)

    async def scenario() -> list[str]:
        seen = [await served_by(router)]  # fails over
        coding.behaviour = ok
        coding.healthy = False  # Serve still counts the dead replica RUNNING; probes fail
        clock.now += 60  # long past the breaker's cooldown: its half-open probe would pass
        await router.check_health_once()
        seen.append(await served_by(router))
        coding.healthy = True
        await router.check_health_once()
        seen.append(await served_by(router))
        return seen

    assert asyncio.run(scenario()) == ["orchestrator@local"] * 2 + ["coding@local"]
    assert (coding.calls, coding.probes) == (2, 2)


async def every_link_read(router: Router, pause_s: float) -> None:
    """Start the router's loops, then wait until the KV loop has read every link (a fixed sleep
    lost that race on a loaded machine: the job met coding's gate paused under it, run of
    1953022)."""
    await router.status()  # starts the loops
    for _ in range(2000):
        backends = (await router.status())["backends"]
        if all(backends[name]["kv_cache_usage"] is not None for name in backends):
            return
        await asyncio.sleep(pause_s)


def test_kv_pressure_read_by_the_kv_loop_moves_work_down_the_chain() -> None:
    coding, orchestrator = FakeBackend(ok, kv_usage=0.95), FakeBackend(ok, kv_usage=0.1)
    router = make_router(make_config(), two(coding, orchestrator), watch=True)

    async def scenario() -> tuple[str, dict[str, Any]]:
        await every_link_read(router, pause_s=0.005)
        return await served_by(router), (await router.status())["backends"]

    backend, report = asyncio.run(scenario())
    assert backend == "orchestrator@local"
    assert report["coding@local"]["kv_cache_pressure"] is True
    assert report["coding@local"]["kv_cache_usage"] == 0.95
    assert report["orchestrator@local"]["kv_cache_pressure"] is False


class FrozenClock(FakeClock):
    """Time moves only when the test moves it; each loop's sleep ends at once, so the loops
    go round as often as the test lets the event loop run."""

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


def test_an_engine_too_busy_to_give_its_kv_reading_leaves_the_others_read() -> None:
    """Coding's reading waits (up to kv_stale_after_s) while time passes: coding's last one goes
    stale (pressure), orchestrator's are taken meanwhile. Read in rounds of all, orchestrator's
    waited with coding's and went stale too: with every link under pressure, work went to the
    CPU fallback (the chaos story's failure, clean-clone run of 44684cf)."""
    config = make_config()
    coding, orchestrator = FakeBackend(ok, kv_usage=0.1), FakeBackend(ok, kv_usage=0.1)
    clock = FrozenClock()
    router = make_router(config, two(coding, orchestrator), watch=True, clock=clock)

    async def scenario() -> tuple[int, str, dict[str, Any]]:
        await every_link_read(router, pause_s=0)
        coding.kv_hangs = True
        asked = coding.kv_calls
        for _ in range(2):  # past stale twice: coding's reading is still out the second time
            clock.now += config.router.kv_stale_after_s + 1
            for _ in range(50):
                await asyncio.sleep(0)
        return coding.kv_calls - asked, await served_by(router), (await router.status())["backends"]

    asked_again, backend, report = asyncio.run(scenario())
    assert report["coding@local"]["kv_cache_pressure"] is True
    assert report["orchestrator@local"]["kv_cache_pressure"] is False
    assert backend == "orchestrator@local"
    assert asked_again == 1  # the reading still out is not asked for again beside it


class RoundsClock(FakeClock):
    """Lets the background loops run `rounds` rounds in all, then holds them."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) > self.rounds:
            await asyncio.Event().wait()
        await asyncio.sleep(0)


def test_engine_counts_are_summed_over_replicas_read_one_at_a_time() -> None:
    coding, without_counts = FakeBackend(ok), FakeBackend(ok)
    coding.counter_readings = [
        ("a", EngineCounters(preemptions=1, prefix_queries=100, prefix_hits=50)),
        ("b", EngineCounters(preemptions=2, prefix_queries=100, prefix_hits=0)),
        ("a", EngineCounters(preemptions=3, prefix_queries=300, prefix_hits=150)),
        ("b", EngineCounters(preemptions=0, prefix_queries=20, prefix_hits=20)),  # restarted
    ]
    router = make_router(
        make_config(), two(coding, without_counts), watch=True, clock=RoundsClock(60)
    )
    before = sample("gps_engine_preemptions_total", backend="coding@local")
    hits_before = sample("gps_prefix_cache_hit_tokens_total", backend="coding@local")

    async def scenario() -> dict[str, Any]:
        await router.status()  # starts the loops
        for _ in range(200):
            await asyncio.sleep(0)
        backends: dict[str, Any] = (await router.status())["backends"]
        return backends

    report = asyncio.run(scenario())
    coding_report = report["coding@local"]
    assert coding_report["engine_preemptions"] == 5  # a: 1, then 2 more; b: 2; b again: 0
    assert coding_report["prefix_cache_queried_tokens"] == 420
    assert coding_report["prefix_cache_hit_rate"] == 170 / 420
    assert sample("gps_engine_preemptions_total", backend="coding@local") - before == 5
    assert sample("gps_prefix_cache_hit_tokens_total", backend="coding@local") - hits_before == 170
    assert sample("gps_prefix_cache_hit_rate", backend="coding@local") == 170 / 420
    # A replica without counts to give (a plain LLMServer) adds nothing, and is asked again.
    assert report["orchestrator@local"]["engine_preemptions"] == 0
    assert report["orchestrator@local"]["prefix_cache_hit_rate"] is None
    assert without_counts.counter_calls > 1


def test_a_failing_status_source_counts_a_health_loop_error_and_routing_goes_on() -> None:
    deployments = FakeDeployments()
    deployments.error = RuntimeError("controller unreachable")
    clock = FakeClock()
    coding = FakeBackend(ok)
    router = make_router(
        make_config(),
        two(coding, FakeBackend(ok)),
        watch=True,
        deployments=deployments,
        clock=clock,
    )
    before = sample("gps_loop_errors_total", loop="health")

    async def scenario() -> str:
        backend = await served_by(router)  # starts the loops
        await asyncio.sleep(0.05)
        return backend

    assert asyncio.run(scenario()) == "coding@local"
    assert sample("gps_loop_errors_total", loop="health") == before + 1
    # The loop slept and would go on: all links looked well, so at the idle interval.
    assert make_config().router.health_idle_interval_s in clock.sleeps
    metrics = asyncio.run(router.metrics_text()).decode()
    assert 'gps_loop_errors_total{loop="health"}' in metrics


def test_a_failing_placement_actor_counts_a_placement_sync_error() -> None:
    local, cloud = FakeBackend(ok), FakeBackend(ok)
    handles = {"reasoning@local": local, "reasoning@cloud": cloud, "cpu-fallback": FakeBackend(ok)}
    placement = FakePlacement(RayError("the placement actor is restarting"))
    router = make_router(placed_config(), handles, watch=True, placement=placement)
    before = sample("gps_loop_errors_total", loop="placement_sync")

    async def scenario() -> dict[str, Any]:
        await router.status()  # starts the loops
        await asyncio.sleep(0.05)
        return await router.status()

    report = asyncio.run(scenario())
    assert sample("gps_loop_errors_total", loop="placement_sync") == before + 1
    assert report["placements"] == {"reasoning@local": "local"}  # the last view holds


# -- the status report -------------------------------------------------------------------------


def test_the_status_reports_tripped_parked_and_draining_backends() -> None:
    local, cloud, fallback = FakeBackend(engine_error(500)), FakeBackend(ok), FakeBackend(ok)
    handles = {"reasoning@local": local, "reasoning@cloud": cloud, "cpu-fallback": fallback}
    deployments = FakeDeployments()
    router = make_router(placed_config(), handles, deployments=deployments)
    deployments.set(cloud, running=0)

    async def scenario() -> list[dict[str, Any]]:
        for _ in range(3):  # three faults open local's breaker
            await collect(router, job(role=Role.REASONING))
        tripped = await router.status()
        deployments.set(cloud, running=1)  # raised for a move, not yet switched to
        raised = await router.status()
        return [tripped, raised]

    tripped, raised = asyncio.run(scenario())
    states = {name: b["state"] for name, b in tripped["backends"].items()}
    assert states == {
        "reasoning@local": "degraded",
        "reasoning@cloud": "parked",
        "cpu-fallback": "up",
    }
    assert tripped["backends"]["reasoning@local"]["breaker"] == "open"
    assert tripped["status"] == "degraded"  # parked backends do not count
    assert raised["backends"]["reasoning@cloud"]["state"] == "draining"


def pool_report(local: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    pools = {"local": {"state": local, "nodes": []}, "cloud": {"state": "healthy", "nodes": []}}
    return {"pools": pools, "events": events}


def test_a_pool_the_cluster_manager_declared_down_takes_no_new_work() -> None:
    local, cloud, fallback = FakeBackend(ok), FakeBackend(ok), FakeBackend(ok)
    handles = {"reasoning@local": local, "reasoning@cloud": cloud, "cpu-fallback": fallback}
    router = make_router(placed_config(), handles)
    reasoning = job(role=Role.REASONING)
    unhealthy = {"seq": 1, "type": "POOL_UNHEALTHY", "pool": "local", "at": 1.0, "detail": "x"}
    draining = {**unhealthy, "seq": 2, "type": "POOL_DRAINING"}
    recovered = {**unhealthy, "seq": 3, "type": "GPU_RECOVERED", "seconds": 42.0}
    before = sample("gps_recoveries_total", pool="local", outcome="recovered")

    async def scenario() -> tuple[list[str], dict[str, Any]]:
        seen = [await served_by(router, reasoning)]
        router.apply_pool_report(pool_report("healthy", [unhealthy]))  # first: not counted
        router.apply_pool_report(pool_report("draining", [unhealthy, draining]))
        seen.append(await served_by(router, reasoning))
        status = await router.status()
        router.apply_pool_report(pool_report("healthy", [unhealthy, draining, recovered]))
        router.apply_pool_report(pool_report("healthy", [unhealthy, draining, recovered]))
        seen.append(await served_by(router, reasoning))
        return seen, status

    seen, status = asyncio.run(scenario())
    assert seen == ["reasoning@local", "cpu-fallback", "reasoning@local"]
    assert status["backends"]["reasoning@local"]["state"] == "pool_down"
    assert status["status"] == "degraded"
    assert status["pools"]["local"]["state"] == "draining"
    assert [e["type"] for e in status["events"]] == ["POOL_UNHEALTHY", "POOL_DRAINING"]
    after = sample("gps_recoveries_total", pool="local", outcome="recovered")
    assert after - before == 1
    assert sample("gps_pool_state", pool="local", state="healthy") == 1
    assert sample("gps_pool_state", pool="local", state="draining") == 0


def test_a_router_serves_jobs_from_a_second_event_loop_as_from_the_first() -> None:
    # A link's pool-lost event belonged to the loop that first waited on it: in a second
    # loop its wait failed at once and read as "pool declared down" (tests run loops in turn).
    coding, orchestrator = FakeBackend(ok, step_s=0.05), FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))
    for _ in range(2):
        routed = asyncio.run(collect(router, job()))[0]
        assert isinstance(routed, Routed)
        assert (routed.backend, routed.failovers) == ("coding@local", 0)


def test_a_job_waiting_on_a_pool_declared_down_fails_over_at_once() -> None:
    hung, cloud, fallback = FakeBackend(ok, step_s=600), FakeBackend(ok), FakeBackend(ok)
    handles = {"reasoning@local": hung, "reasoning@cloud": cloud, "cpu-fallback": fallback}
    router = make_router(placed_config(), handles)  # first_token_timeout_s: 120

    async def scenario() -> str:
        waiting = asyncio.create_task(served_by(router, job(role=Role.REASONING)))
        for _ in range(1000):  # until the job waits on the hung machine
            if hung.calls:
                break
            await asyncio.sleep(0)
        router.apply_pool_report(pool_report("draining", []))
        # Without the pool's signal the job would sit out the 120 s first-token timeout.
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(scenario()) == "cpu-fallback"
    assert hung.streams[0].cancelled  # the engine request on the dead machine is aborted


def completion_job(**fields: Any) -> ChatJob:
    request = CompletionRequest(model="coding", **fields)
    return ChatJob(request, Role.CODING, PriorityClass.USER, "t")


def test_a_completion_fails_over_like_a_chat_and_keeps_the_end_of_a_long_prompt() -> None:
    coding, orchestrator, fallback = FakeBackend(dead), FakeBackend(ok), FakeBackend(ok)
    handles = {"coding@local": coding, "orchestrator@local": orchestrator, "cpu-fallback": fallback}
    router = make_router(make_config(), handles)
    prompt = "".join(f"line {i}\n" for i in range(3000)) + "def last():"  # ~ 5k estimated tokens
    routed, *rest = asyncio.run(collect(router, completion_job(prompt=prompt, max_tokens=64)))
    assert isinstance(routed, Routed)
    assert (routed.backend, routed.failovers) == ("orchestrator@local", 1)
    assert rest == [['data: {"x": 1}\n\n'], ["data: [DONE]\n\n"]]
    assert (coding.completion_calls, orchestrator.completion_calls) == (1, 1)
    [sent] = orchestrator.requests
    assert sent.model == "orchestrator"
    assert sent.prompt.endswith("line 2999\ndef last():")  # the end, nearest the cursor, stays
    assert len(sent.prompt) < len(prompt)
    assert routed.context_fitted
    assert routed.max_tokens == 64
    assert routed.prompt_tokens + routed.max_tokens <= 4096


def test_a_suffix_to_a_model_without_fim_markers_is_a_400_and_no_fault() -> None:
    coding, orchestrator = FakeBackend(ok), FakeBackend(ok)
    router = make_router(make_config(), two(coding, orchestrator))
    faults = sample("gps_backend_faults_total", backend="coding@local")
    [refusal] = asyncio.run(collect(router, completion_job(prompt="def f(", suffix="):")))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code) == (400, "fim_not_supported")
    assert coding.calls == orchestrator.calls == 0
    assert sample("gps_backend_faults_total", backend="coding@local") == faults


def test_vectors_come_from_embedding_backends_only_never_the_text_fallback() -> None:
    raw = {
        "pools": [{"name": "local", "kind": "local"}],
        "models": [
            {"role": "coding", "source": "example/c", "context_window": 4096, "pools": ["local"]},
            {"role": "embedding", "source": "example/e", "context_window": 512, "pools": ["local"]},
        ],
        "fallback": {"source": "fallback.gguf"},
    }
    config = parse_config(raw, base_dir=Path("."), environ={})
    embedding, fallback = FakeBackend(dead), FakeBackend(ok)
    router = make_router(config, {"embedding@local": embedding, "cpu-fallback": fallback})
    request = EmbeddingRequest(model="embedding", input=["a", "b"])
    job = ChatJob(request, Role.EMBEDDING, PriorityClass.USER, "t")
    [refusal] = asyncio.run(collect(router, job))
    assert isinstance(refusal, Refusal)
    assert refusal.status == 503
    assert embedding.embedding_calls == 1
    assert fallback.calls == 0
    # A working one answers, and is sent the inputs as they came.
    healthy = FakeBackend(ok)
    router = make_router(config, {"embedding@local": healthy, "cpu-fallback": fallback})
    routed, *_ = asyncio.run(collect(router, job))
    assert isinstance(routed, Routed)
    assert routed.backend == "embedding@local"
    assert healthy.requests[0].input == ["a", "b"]
    assert healthy.requests[0].model == "embedding"


class FimCounter(CharEstimateCounter):
    """An estimate whose tokenizer has StarCoder's fill-in-the-middle markers."""

    def fim_markers(self) -> FimMarkers | None:
        return KNOWN_FIM_MARKERS[0]


def test_a_suffix_goes_past_links_without_fim_to_one_with_it_without_blame() -> None:
    coding, orchestrator = FakeBackend(ok), FakeBackend(ok)
    config = make_config()
    fim = {config.targets["orchestrator@local"].counter_key: FimCounter()}
    router = make_router(config, two(coding, orchestrator), counters=fim)
    faults = sample("gps_backend_faults_total", backend="coding@local")
    job = completion_job(prompt="def f(", suffix="):\n    pass", max_tokens=8)
    routed, *_ = asyncio.run(collect(router, job))
    assert isinstance(routed, Routed)
    assert routed.backend == "orchestrator@local"
    [sent] = orchestrator.requests
    assert sent.prompt == "<fim_prefix>def f(<fim_suffix>):\n    pass<fim_middle>"
    assert sent.suffix is None
    assert coding.calls == 0
    assert sample("gps_backend_faults_total", backend="coding@local") == faults


def test_the_router_in_the_ingress_process_answers_the_ingress_calls() -> None:
    many = [[f"data: {i}\n\n"] for i in range(6)]
    # Its second call streams; the whole answers (the first and third) are one item, as an
    # engine's are.
    coding = FakeBackend(lambda call: many if call == 2 else many[:1], step_s=0.001)
    router = make_router(make_config(cap=1), two(coding, FakeBackend(ok)))
    in_process = InProcessRouter(router)
    whole = as_whole(job())

    async def scenario() -> tuple[Any, list[Any], Any]:
        once = await in_process.chat_once.remote(whole)
        stream = in_process.options(stream=True).chat.remote(job())
        opening = [await anext(stream), await anext(stream)]
        stream.cancel()  # the client left: the slot is free, the engine's stream closed
        await asyncio.sleep(0.01)
        again = await in_process.chat_once.remote(whole)  # cap 1: only if the slot came back
        return once, opening, again

    once, opening, again = asyncio.run(scenario())
    assert isinstance(once, Opening)
    assert once.routed.backend == "coding@local"
    assert isinstance(opening[0], Opening)
    assert opening[0].first == ["data: 0\n\n"]
    assert opening[1] == ["data: 1\n\n"]
    assert isinstance(again, Opening)
    assert again.routed.backend == "coding@local"
    assert coding.running == 0  # every engine stream ended or was closed
    assert router.held() == {"coding@local": 0, "orchestrator@local": 0}


def test_each_class_reaches_the_engine_as_its_number_and_never_as_the_clients_own() -> None:
    coding = FakeBackend(ok)
    router = make_router(make_config(), {"coding@local": coding})
    for priority in PriorityClass:
        chat_job = job(priority=priority)
        chat_job = replace(chat_job, request=chat_job.request.changed(priority=-100))
        asyncio.run(served_by(router, chat_job))
    assert [r.priority for r in coding.requests] == [0, 1, 2]


def test_with_engine_priority_off_every_request_reaches_the_engine_at_zero() -> None:
    config = make_config()
    config = config.model_copy(
        update={"router": config.router.model_copy(update={"engine_priority": False})}
    )
    coding = FakeBackend(ok)
    router = make_router(config, {"coding@local": coding})
    for priority in PriorityClass:
        asyncio.run(served_by(router, job(priority=priority)))
    assert [r.priority for r in coding.requests] == [0, 0, 0]


def two_coders_config(adapters: tuple[dict[str, str], ...] = ()) -> ClusterConfig:
    coder = {"role": "coding", "context_window": 4096, "pools": ["local"]}
    raw = {
        "pools": [{"name": "local", "kind": "local"}],
        "models": [
            {**coder, "name": "coder-big", "source": "example/big", "default": True,
             "adapters": list(adapters)},
            {**coder, "name": "coder-small", "source": "example/small"},
        ],
        "fallback": {"source": "fallback.gguf"},
    }  # fmt: skip
    return parse_config(raw, base_dir=Path("."), environ={})


def test_a_dead_default_model_fails_over_to_the_other_model_of_its_role_first() -> None:
    big, small, fallback = FakeBackend(dead), FakeBackend(ok), FakeBackend(ok)
    handles = {"coder-big@local": big, "coder-small@local": small, "cpu-fallback": fallback}
    router = make_router(two_coders_config(), handles)
    coding = replace(job(), model="coder-big")
    assert asyncio.run(served_by(router, coding)) == "coder-small@local"
    small.behaviour = dead
    assert asyncio.run(served_by(router, coding)) == "cpu-fallback"
    assert (big.calls, small.calls, fallback.calls) == (2, 2, 1)


def test_an_adapter_is_asked_for_by_name_on_its_base_and_fails_over_along_its_chain() -> None:
    """An adapter's request reaches its base model's backend with the adapter's name (vLLM
    picks the LoRA by it); the next link, another model, gets its own name."""
    config = two_coders_config(({"name": "coder-big-sql", "source": "s3://bucket/sql"},))
    big, small, fallback = FakeBackend(dead), FakeBackend(ok), FakeBackend(ok)
    handles = {"coder-big@local": big, "coder-small@local": small, "cpu-fallback": fallback}
    router = make_router(config, handles)
    assert asyncio.run(served_by(router, replace(job(), model="coder-big-sql"))) == (
        "coder-small@local"
    )
    assert [r.model for r in big.requests] == ["coder-big-sql"]
    assert [r.model for r in small.requests] == ["coder-small"]


# Tools whose listing is most of a 4096 window (the character estimate's count), as a coding
# agent's are: each with a long description.
AGENT_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{n}",
            "description": "Does one thing well. " + "Long usage notes follow here. " * 60,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for n in range(6)
]


def agent_job(tools: int = 6) -> ChatJob:
    listed = [
        {**AGENT_TOOLS[0], "function": {**AGENT_TOOLS[0]["function"], "name": f"tool_{n}"}}
        for n in range(tools)
    ]
    request = ChatRequest(
        model="coding",
        messages=[{"role": "user", "content": "Fix the test."}],
        tools=listed,
        max_tokens=64,
        stream=True,
    )
    return ChatJob(request, Role.CODING, PriorityClass.USER, "t")


def test_an_agents_long_tools_reach_the_engine_shortened_and_the_answer_says_so() -> None:
    coding = FakeBackend(ok)
    config = make_config(tools_on=("coding", "orchestrator", "cpu-fallback"))
    router = make_router(config, {"coding@local": coding, "orchestrator@local": FakeBackend(ok),
                                  "cpu-fallback": FakeBackend(ok)})  # fmt: skip
    routed, *_ = asyncio.run(collect(router, agent_job()))
    assert routed.backend == "coding@local"
    assert routed.tools_shortened >= 1
    assert routed.context_fitted
    [sent] = coding.requests
    assert [t["function"]["name"] for t in sent.tools] == [f"tool_{n}" for n in range(6)]
    assert all(len(t["function"]["description"] or "") <= 160 for t in sent.tools)
    assert sent.tools[0]["function"]["parameters"] == AGENT_TOOLS[0]["function"]["parameters"]


def test_a_link_whose_window_cannot_hold_the_request_is_passed_over_not_blamed() -> None:
    # The chain's own models are down; the CPU fallback's window (256) cannot hold 40 tools
    # even without their descriptions: a 503 that names it, never the client's 400.
    config = make_config(fallback_window=256, tools_on=("coding", "orchestrator", "cpu-fallback"))
    fallback = FakeBackend(ok)
    handles = {"coding@local": FakeBackend(dead), "orchestrator@local": FakeBackend(dead),
               "cpu-fallback": fallback}  # fmt: skip
    [refusal] = asyncio.run(collect(make_router(config, handles), agent_job(tools=40)))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code) == (503, "backend_unavailable")
    assert "does not fit the window of cpu-fallback" in refusal.message
    assert fallback.calls == 0


def test_a_message_no_link_can_hold_is_the_first_links_400_naming_its_window() -> None:
    fallback = FakeBackend(ok)
    handles = {"coding@local": FakeBackend(ok), "orchestrator@local": FakeBackend(ok),
               "cpu-fallback": fallback}  # fmt: skip
    request = ChatRequest(
        model="coding", messages=[{"role": "user", "content": "word " * 9000}], stream=True
    )
    job = ChatJob(request, Role.CODING, PriorityClass.USER, "t")
    [refusal] = asyncio.run(collect(make_router(make_config(), handles), job))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code) == (400, "context_length_exceeded")
    assert "4096 tokens" in refusal.message
    assert fallback.calls == 0


def test_a_job_whose_model_a_reload_removed_is_served_by_the_name_it_was_asked_by() -> None:
    """The ingress resolved the name; a reload removed that model before the router took the
    job: the name the client sent (a role's) reaches the role's model now, and a name that
    reaches nothing now is a 503, never a 500."""
    handles = {name: FakeBackend(ok) for name in ("coding@local", "orchestrator@local")}
    handles["cpu-fallback"] = FakeBackend(ok)
    router = make_router(make_config(), handles)
    request = ChatRequest(
        model="coding", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
    )
    removed = ChatJob(request, "coding-before-the-reload", PriorityClass.USER, "t")
    assert asyncio.run(served_by(router, removed)) == "coding@local"
    gone = replace(removed, request=request.model_copy(update={"model": "no-such-name"}))
    [refused] = asyncio.run(collect(router, gone))
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code) == (503, "backend_unavailable")
    assert not handles["coding@local"].requests[1:]  # only the first job reached it


def test_a_job_that_must_not_be_truncated_is_refused_where_it_would_be_fitted() -> None:
    """The Responses API's `truncation: disabled`: every link too small for the request as
    sent passes it over, and the first link's window is named; untouched, it is served."""
    handles = {name: FakeBackend(ok) for name in ("coding@local", "orchestrator@local")}
    handles["cpu-fallback"] = FakeBackend(ok)
    router = make_router(make_config(fallback_window=512), handles)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 400}
        for i in range(41)
    ]
    request = ChatRequest(model="coding", messages=turns, max_tokens=8, stream=True)
    whole = ChatJob(request, Role.CODING, PriorityClass.USER, "t", truncate=False)
    [refused] = asyncio.run(collect(router, whole))
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code) == (400, "context_length_exceeded")
    assert "truncation is disabled" in refused.message
    assert not any(h.requests for h in handles.values())
    fitted = asyncio.run(collect(router, replace(whole, truncate=True)))[0]
    assert isinstance(fitted, Routed)
    assert fitted.dropped_messages > 0
    short = replace(whole, request=request.model_copy(update={"messages": turns[-1:]}))
    assert asyncio.run(served_by(router, short)) == "coding@local"
