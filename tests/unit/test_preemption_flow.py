"""Preemption through the router without Ray: a user's arrival pauses a running background
stream, which waits (kept alive) and goes on as the same answer once the user is done."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any

from core.answers import WholeAnswer
from core.config.reload import reload_changes
from core.types import PriorityClass
from core.wire import ChatJob, Opening, Refusal, Routed
from deployments.router.request_path.faults import stream_error_event
from deployments.router.request_path.whole_by_stream import whole_through_stream
from policy.slot_leases import SlotLedger
from tests.fakes.clock import FakeClock
from tests.fakes.router_harness import (
    FakeBackend,
    chunks_of,
    collect,
    job,
    make_config,
    make_router,
    sample,
    sse,
    two,
)
from tests.unit.test_reload import changed
from tests.unit.test_slot_leases import LedgerSlots

PREEMPT = {
    "preempt": {
        "enabled": True,
        "above_running": 1,
        "may_pause": {"user": 1},
        "max_pauses": 2,
        "protect_last_tokens": 2,
        "keepalive_s": 0.02,
    }
}
TOKENS = 12
USAGE = {"prompt_tokens": 9, "completion_tokens": 99, "total_tokens": 108}


def long_answer(ident: str, start: int, role: bool = True) -> list[Any]:
    """One token an item from `start` on, then usage and the end."""
    items: list[Any] = [[sse(ident, {"role": "assistant", "content": ""})]] if role else []
    items += [[sse(ident, {"content": f" t{i}"})] for i in range(start, TOKENS)]
    return [*items, [sse(ident, usage=USAGE)], ["data: [DONE]\n\n"]]


def script(call: int) -> list[Any]:
    if call == 1:  # the background answer, paused after a few tokens
        return long_answer("bg", 0)
    if call == 2:  # the user's, short
        return [[sse("user", {"role": "assistant", "content": "hi"})], ["data: [DONE]\n\n"]]
    return long_answer("again", 0)  # the continuation: what the engine writes after the text


def lines_of(items: list[Any]) -> list[str]:
    return [line for item in items[1:] for line in item]


async def until(check: Callable[[], bool]) -> None:
    """Until `check` holds: the fake backend's streams advance on the event loop's timers."""
    while not check():  # noqa: ASYNC110 - the state is the fakes', no event to wait on
        await asyncio.sleep(0.001)


async def background_then_user(router: Any, backend: FakeBackend) -> tuple[list[Any], list[Any]]:
    background = asyncio.create_task(collect(router, job(priority=PriorityClass.BACKGROUND)))
    await until(lambda: backend.calls >= 1 and len(backend.streams[0]._items) <= TOKENS)
    user = await collect(router, job(priority=PriorityClass.USER))
    return await background, user


def test_a_user_pauses_a_background_stream_which_goes_on_as_the_same_answer() -> None:
    coding = FakeBackend(script, step_s=0.01, hold_at=3)
    router = make_router(make_config(router=PREEMPT), two(coding, FakeBackend(script)))
    labels = {"backend": "coding@local", "class": "background"}
    before = sample("gps_preemptions_total", **labels)
    reprefill = sample("gps_preempt_reprefill_tokens_total", backend="coding@local")

    background, user = asyncio.run(background_then_user(router, coding))

    assert isinstance(user[0], Routed)
    assert user[0].backend == "coding@local"
    lines = lines_of(background)
    assert lines[-1] == "data: [DONE]\n\n"
    assert not any("error" in x for x in lines)
    notes = [x.split()[1] for x in lines if x.startswith(": gps-")]
    assert notes[0] == "gps-paused"
    assert notes[-2] == "gps-resumed"
    assert lines[-2] == ": gps-pauses n=1\n\n"  # the last word before [DONE]: paused once
    assert "gps-waiting" in notes  # kept alive while the user ran
    chunks = chunks_of(lines)
    assert {c["id"] for c in chunks} == {"bg"}  # one answer: the first stream's id
    assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    sent = text.split()
    # The engine was asked to go on after exactly the text the client had.
    continued = coding.requests[2]
    partial = continued.messages[-1]["content"]
    assert continued.messages[-1]["role"] == "assistant"
    assert continued.continue_final_message
    assert text.startswith(partial)
    assert partial.split() == sent[: len(partial.split())]
    assert continued.max_tokens == 8 - len(partial.split())
    # The first stream was aborted at the engine; the user's ran beside nothing.
    assert coding.streams[0].cancelled
    assert (
        chunks[-1]["usage"]["completion_tokens"]
        == len(partial.split()) + USAGE["completion_tokens"]
    )
    assert sample("gps_preemptions_total", **labels) == before + 1
    assert sample("gps_preempt_reprefill_tokens_total", backend="coding@local") > reprefill
    assert coding.running == 0


def test_without_preemption_the_background_stream_runs_beside_the_user() -> None:
    coding = FakeBackend(script, step_s=0.01, hold_at=3)
    router = make_router(make_config(), two(coding, FakeBackend(script)))
    background, _ = asyncio.run(background_then_user(router, coding))
    lines = lines_of(background)
    assert not any(x.startswith(": gps-") for x in lines)
    assert coding.max_running == 2
    assert coding.calls == 2


def sample_whole() -> WholeAnswer:
    return WholeAnswer(
        {
            "id": "whole",
            "object": "chat.completion",
            "model": "coding",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


def body_of(first: object) -> dict[str, Any]:
    assert isinstance(first, WholeAnswer)
    return first.body


def whole(chat_job: ChatJob) -> ChatJob:
    return replace(chat_job, request=chat_job.request.changed(stream=False))


def test_a_whole_background_answer_is_paused_and_handed_back_whole() -> None:
    coding = FakeBackend(script, step_s=0.01, hold_at=3)
    router = make_router(make_config(router=PREEMPT), two(coding, FakeBackend(script)))

    async def run() -> Any:
        background = asyncio.create_task(
            router.chat_once(whole(job(priority=PriorityClass.BACKGROUND)))
        )
        await until(lambda: coding.calls >= 1 and len(coding.streams[0]._items) <= TOKENS)
        await collect(router, job(priority=PriorityClass.USER))
        return await background

    reply = asyncio.run(run())
    assert isinstance(reply, Opening)
    answer = body_of(reply.first)
    assert coding.requests[0].stream  # generated as a stream, to be paused
    assert coding.requests[0].stream_options.include_usage
    assert coding.calls == 3  # paused for the user, then continued
    assert reply.routed.pauses == 1  # X-Pauses at the ingress
    continued = coding.requests[2]
    assert continued.continue_final_message
    partial = continued.messages[-1]["content"]
    text = answer["choices"][0]["message"]["content"]
    assert text.startswith(partial)  # one answer: what came before the pause, then the rest
    assert text.split() == partial.split() + [f"t{i}" for i in range(TOKENS)]
    assert answer["id"] == "bg"
    assert answer["object"] == "chat.completion"
    assert answer["usage"]["completion_tokens"] == (
        len(partial.split()) + USAGE["completion_tokens"]
    )
    assert coding.streams[0].cancelled


def test_a_whole_user_answer_is_not_generated_as_a_stream() -> None:
    """Nothing pauses the highest class: its whole answer is one engine call, as before."""
    coding = FakeBackend(lambda call: [sample_whole()], step_s=0.0)
    router = make_router(make_config(router=PREEMPT), two(coding, FakeBackend(script)))
    reply = asyncio.run(router.chat_once(whole(job(priority=PriorityClass.USER))))
    assert isinstance(reply, Opening)
    assert not coding.requests[0].stream


def test_a_whole_background_answer_without_preemption_is_one_engine_call() -> None:
    coding = FakeBackend(lambda call: [sample_whole()], step_s=0.0)
    router = make_router(make_config(), two(coding, FakeBackend(script)))
    asyncio.run(router.chat_once(whole(job(priority=PriorityClass.BACKGROUND))))
    assert not coding.requests[0].stream


BROKEN = [
    [sse("bg", {"role": "assistant", "content": ""})],
    [sse("bg", {"content": " t0"})],
    stream_error_event("it broke"),
]


def test_a_whole_answer_whose_backend_fails_midway_goes_on_at_the_next_link() -> None:
    coding, orchestrator = FakeBackend(lambda call: BROKEN), FakeBackend(script)
    router = make_router(make_config(router=PREEMPT), two(coding, orchestrator))
    reply = asyncio.run(router.chat_once(whole(job(priority=PriorityClass.BACKGROUND))))
    assert isinstance(reply, Opening)
    answer = body_of(reply.first)
    assert answer["id"] == "bg"
    assert orchestrator.requests[0].messages[-1]["content"] == " t0"
    assert answer["choices"][0]["message"]["content"].split()[:2] == ["t0", "t0"]
    # Its headers name the link it ended on, and the move.
    assert (reply.routed.backend, reply.routed.failovers) == ("orchestrator@local", 1)


THOUGHT_THEN_BROKEN = [
    [sse("bg", {"role": "assistant", "content": ""})],
    [sse("bg", {"reasoning": "hmm"})],  # no text to go on from
    stream_error_event("it broke"),
]


def test_a_whole_answer_that_cannot_go_on_is_asked_for_again_whole() -> None:
    """As before it was generated as a stream: its backend failed where what it had cannot be
    continued (a thought), so it is asked for again from the start, and the client never sees
    half an answer."""
    coding = FakeBackend(script)
    # Fails in the middle of a stream that cannot go on; answers a whole request whole.
    coding.behaviour = lambda call: (
        THOUGHT_THEN_BROKEN if coding.requests[-1].stream else [sample_whole()]
    )
    router = make_router(
        make_config(router=PREEMPT), {"coding@local": coding, "orchestrator@local": coding}
    )
    reply = asyncio.run(router.chat_once(whole(job(priority=PriorityClass.BACKGROUND))))
    assert isinstance(reply, Opening)
    assert body_of(reply.first)["id"] == "whole"
    assert coding.requests[0].stream
    assert not coding.requests[-1].stream


def test_a_whole_answer_asked_for_again_counts_both_tries_as_the_engines_wait() -> None:
    """The streamed try's time (to its first item, then to where it broke) was the engine's, as
    is the whole try's: none of it is x-gateway-overhead-ms."""
    clock = FakeClock()
    coding = FakeBackend(script)
    coding.behaviour = lambda call: (
        THOUGHT_THEN_BROKEN if coding.requests[-1].stream else [sample_whole()]
    )
    coding.clock, coding.first_item_s = clock, 1.5
    router = make_router(
        make_config(router=PREEMPT), {"coding@local": coding, "orchestrator@local": coding},
        clock=clock,
    )  # fmt: skip
    reply = asyncio.run(router.chat_once(whole(job(priority=PriorityClass.BACKGROUND))))
    assert isinstance(reply, Opening)
    assert body_of(reply.first)["id"] == "whole"
    assert coding.calls == 2
    assert reply.routed.engine_wait_s == 3.0


def test_a_refusal_after_a_whole_answer_began_is_the_answer() -> None:
    """Its paused wait shed (or no link left): the refusal (429 or 503, with its Retry-After),
    as it would be before the answer began, not an error made of the half it had. The engine's
    time until then (1 s to its first item, 2 s more) is not the gateway's overhead."""
    routed = Routed("coding@local", 8, 9, False, 0, False, False, engine_wait_s=1.0)
    shed = Refusal(429, "rate_limit_exceeded", "queue full", retry_after_s=2)
    clock = FakeClock()

    async def replies(_: ChatJob) -> AsyncGenerator[Any, None]:
        yield Opening(routed, [sse("bg", {"role": "assistant", "content": ""})])
        clock.now += 2.0
        yield [sse("bg", {"content": " t0"})]
        yield shed

    background = whole(job(priority=PriorityClass.BACKGROUND))
    reply = asyncio.run(whole_through_stream(replies, background, clock))
    assert reply == replace(shed, engine_wait_s=3.0)


def test_a_reload_turns_preemption_on_in_place() -> None:
    old = make_config()
    new = make_config(router=PREEMPT)
    assert reload_changes(old, new).live == ("router.preempt",)
    coding = FakeBackend(script, step_s=0.01, hold_at=3)
    router = make_router(old, two(coding, FakeBackend(script)))
    router.apply_config(new)
    background, _ = asyncio.run(background_then_user(router, coding))
    assert any(x.startswith(": gps-paused") for x in lines_of(background))
    assert coding.calls == 3  # the background answer went on after the user's


def test_a_paused_answer_whose_client_leaves_as_its_slot_comes_back_gives_the_slot_back() -> None:
    async def scenario() -> tuple[int, dict[PriorityClass, int]]:
        coding = FakeBackend(script, step_s=0.01, hold_at=3)
        router = make_router(make_config(router=PREEMPT), two(coding, FakeBackend(script)))
        queue = router._links["coding@local"].gate.queue
        chat = router.chat(job(priority=PriorityClass.BACKGROUND))
        user = None
        async for item in chat:
            if user is None and coding.calls >= 1 and len(coding.streams[0]._items) <= TOKENS:
                user = asyncio.create_task(collect(router, job(priority=PriorityClass.USER)))
            if isinstance(item, list) and any("gps-waiting" in x for x in item):
                assert user is not None
                await user  # the slot comes back while the stream sits at its keep-alive
                await asyncio.sleep(0.01)
                break  # and the client leaves: the ingress closes the stream
        await chat.aclose()
        await asyncio.sleep(0.05)
        return queue.in_flight, queue.running_by_class()

    in_flight, running = asyncio.run(scenario())
    assert in_flight == 0
    assert set(running.values()) == {0}


def test_a_pause_asked_for_a_user_already_gone_does_not_happen() -> None:
    """The user's answer ends before the background stream's next item: nothing to make room
    for by then, so the stream goes on where it is."""
    coding = FakeBackend(script, step_s=0.05)  # the background's items come slowly
    router = make_router(
        make_config(router=PREEMPT), {"coding@local": coding, "orchestrator@local": coding}
    )

    async def scenario() -> list[Any]:
        background = asyncio.create_task(collect(router, job(priority=PriorityClass.BACKGROUND)))
        await until(lambda: coding.calls >= 1 and len(coding.streams[0]._items) <= TOKENS)
        coding.step_s = 0.0  # the user's answer is instant
        await collect(router, job(priority=PriorityClass.USER))
        coding.step_s = 0.05
        return await background

    lines = lines_of(asyncio.run(scenario()))
    assert not any(x.startswith(": gps-") for x in lines)
    assert coding.calls == 2


def test_an_answer_whose_end_was_sent_is_not_paused() -> None:
    finish = {"id": "bg", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    ended = [
        [sse("bg", {"role": "assistant", "content": ""})],
        [sse("bg", {"content": " t0"})],
        [f"data: {json.dumps(finish)}\n\n"],  # ended by the model: nothing left to go on
        [sse("bg", usage=USAGE)],
        ["data: [DONE]\n\n"],
    ]
    coding = FakeBackend(lambda call: ended if call == 1 else script(2), step_s=0.02)
    router = make_router(make_config(router=PREEMPT), two(coding, FakeBackend(script)))

    async def scenario() -> list[Any]:
        background = asyncio.create_task(collect(router, job(priority=PriorityClass.BACKGROUND)))
        await until(lambda: coding.calls >= 1 and len(coding.streams[0]._items) <= 2)
        await collect(router, job(priority=PriorityClass.USER))
        return await background

    lines = lines_of(asyncio.run(scenario()))
    assert not any(x.startswith(": gps-") for x in lines)
    assert coding.calls == 2  # no continuation after its finish_reason


def test_a_whole_answer_every_link_failed_in_the_middle_of_is_refused_with_retry_after() -> None:
    coding, orchestrator = FakeBackend(lambda call: BROKEN), FakeBackend(lambda call: BROKEN)
    router = make_router(make_config(router=PREEMPT), two(coding, orchestrator))
    reply = asyncio.run(router.chat_once(whole(job(priority=PriorityClass.BACKGROUND))))
    assert isinstance(reply, Refusal)
    assert reply.status == 503
    assert reply.retry_after_s


def two_routers(shared: bool) -> tuple[Any, Any, FakeBackend]:
    """Routers `a` and `b` (two ingress replicas) in front of one coding backend, preemption
    on; `shared`: they post their work to one slot broker's books."""
    config = make_config(router=PREEMPT)
    config = changed(config, gateway={**config.gateway.model_dump(mode="json"),
                                      "ingress_replicas": 2})  # fmt: skip
    coding, ledger = FakeBackend(script, step_s=0.01, hold_at=3), SlotLedger(routers=2)

    def router(name: str) -> Any:
        slots = LedgerSlots(ledger, name) if shared else None
        return make_router(config, two(coding, FakeBackend(script)), slots=slots)

    return router("a"), router("b"), coding


async def background_at_b_then_user_at_a(
    a: Any, b: Any, coding: FakeBackend, shared: bool
) -> list[Any]:
    background = asyncio.create_task(collect(b, job(priority=PriorityClass.BACKGROUND)))
    await until(lambda: coding.calls >= 1 and len(coding.streams[0]._items) <= TOKENS)
    user = asyncio.create_task(collect(a, job(priority=PriorityClass.USER)))
    await until(lambda: coding.calls >= 2)  # the user's answer runs at a

    async def posting() -> None:  # each router's post, as their slot syncs make them
        while shared:
            await a.post_slots_once()
            await b.post_slots_once()
            await asyncio.sleep(0.005)

    posts = asyncio.create_task(posting())
    try:
        await user
        return await background
    finally:
        posts.cancel()


def test_a_user_at_one_router_pauses_background_work_another_router_runs() -> None:
    # Each router ran under its own count: a user at one never paused what another ran there.
    a, b, coding = two_routers(shared=True)
    background = asyncio.run(background_at_b_then_user_at_a(a, b, coding, shared=True))
    lines = lines_of(background)
    assert lines[-1] == "data: [DONE]\n\n"
    assert not any("error" in x for x in lines)
    notes = [x.split()[1] for x in lines if x.startswith(": gps-")]
    assert notes[0] == "gps-paused"
    assert lines[-2] == ": gps-pauses n=1\n\n"
    assert {c["id"] for c in chunks_of(lines)} == {"bg"}
    assert coding.streams[0].cancelled  # aborted at the engine while the user's ran
    continued = coding.requests[2]
    assert continued.continue_final_message
    assert continued.messages[-1]["role"] == "assistant"
    assert coding.running == 0


def test_routers_that_share_no_books_let_background_work_run_beside_another_routers_user() -> None:
    a, b, coding = two_routers(shared=False)
    background = asyncio.run(background_at_b_then_user_at_a(a, b, coding, shared=False))
    assert not any(x.startswith(": gps-") for x in lines_of(background))
    assert coding.max_running == 2
    assert coding.calls == 2


def test_a_running_jobs_start_is_read_on_the_routers_clock() -> None:
    """Preemption orders running jobs by their start: read on the clock the router was given,
    as every age it compares is (a test's clock here, far from the process's)."""
    clock = FakeClock(now=5.0)
    coding = FakeBackend(script, step_s=0.01, hold_at=3)
    router = make_router(make_config(router=PREEMPT), two(coding, FakeBackend(script)), clock=clock)

    async def scenario() -> list[float]:
        background = asyncio.create_task(collect(router, job(priority=PriorityClass.BACKGROUND)))
        await until(lambda: coding.calls >= 1 and len(coding.streams[0]._items) <= TOKENS)
        running = router._links["coding@local"].running.values()
        started = [attempt.view().started for attempt in running]
        await collect(router, job(priority=PriorityClass.USER))  # releases the held stream
        await background
        return started

    assert asyncio.run(scenario()) == [5.0]
