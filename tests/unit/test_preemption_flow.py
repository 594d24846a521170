"""Preemption through the router without Ray: a user's arrival pauses a running background
stream, which waits (kept alive) and goes on as the same answer once the user is done."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from core.config.reload import reload_changes
from core.types import PriorityClass
from core.wire import Routed
from tests.unit.test_router_flow import (
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
    coding = FakeBackend(script, step_s=0.01)
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
    assert notes[-1] == "gps-resumed"
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
    coding = FakeBackend(script, step_s=0.01)
    router = make_router(make_config(), two(coding, FakeBackend(script)))
    background, _ = asyncio.run(background_then_user(router, coding))
    lines = lines_of(background)
    assert not any(x.startswith(": gps-") for x in lines)
    assert coding.max_running == 2
    assert coding.calls == 2


def test_a_whole_background_answer_is_never_paused() -> None:
    coding = FakeBackend(script, step_s=0.01)
    router = make_router(make_config(router=PREEMPT), two(coding, FakeBackend(script)))

    async def run() -> list[Any]:
        streamed = job(priority=PriorityClass.BACKGROUND)
        whole = replace(streamed, request=streamed.request.model_copy(update={"stream": False}))
        background = asyncio.create_task(collect(router, whole))
        await until(lambda: coding.calls >= 1)
        await collect(router, job())
        return await background

    lines = lines_of(asyncio.run(run()))
    assert coding.calls == 2  # no continuation asked for
    assert not any(isinstance(x, str) and x.startswith(": gps-") for x in lines)


def test_a_reload_turns_preemption_on_in_place() -> None:
    old = make_config()
    new = make_config(router=PREEMPT)
    assert reload_changes(old, new).live == ("router.preempt",)
    coding = FakeBackend(script, step_s=0.01)
    router = make_router(old, two(coding, FakeBackend(script)))
    router.apply_config(new)
    background, _ = asyncio.run(background_then_user(router, coding))
    assert any(x.startswith(": gps-paused") for x in lines_of(background))
    assert coding.calls == 3  # the background answer went on after the user's


def test_a_paused_answer_whose_client_leaves_as_its_slot_comes_back_gives_the_slot_back() -> None:
    async def scenario() -> tuple[int, dict[PriorityClass, int]]:
        coding = FakeBackend(script, step_s=0.01)
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
