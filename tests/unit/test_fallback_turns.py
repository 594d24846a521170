"""The CPU fallback serves the lowest engine priority first, in arrival order within one, and a
client that leaves while it waits gives its place up (deployments/fallback/turns.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

from deployments.fallback.engine import ChatParams, CompletionParams, Finish, Piece
from deployments.fallback.replica import CpuFallback, FallbackSettings
from deployments.fallback.turns import PriorityTurns


async def _served_in_order(turns: PriorityTurns, arrivals: list[tuple[str, int]]) -> list[str]:
    order: list[str] = []
    first = turns.turn(0)
    await first.__aenter__()  # the engine is busy when they arrive

    async def wait(name: str, priority: int) -> None:
        async with turns.turn(priority):
            order.append(name)
            await asyncio.sleep(0)

    tasks = []
    for name, priority in arrivals:
        tasks.append(asyncio.create_task(wait(name, priority)))
        await asyncio.sleep(0)  # arrive in this order
    await first.__aexit__(None, None, None)
    await asyncio.gather(*tasks)
    return order


def test_waiters_are_served_lowest_number_first_then_in_arrival_order() -> None:
    arrivals = [("bg-1", 2), ("bg-2", 2), ("agent", 1), ("user-1", 0), ("user-2", 0)]
    order = asyncio.run(_served_in_order(PriorityTurns(1), arrivals))
    assert order == ["user-1", "user-2", "agent", "bg-1", "bg-2"]


def test_a_waiter_that_leaves_gives_its_place_up_and_the_rest_go_on() -> None:
    async def scenario() -> tuple[list[str], int]:
        turns = PriorityTurns(1)
        order: list[str] = []

        async def wait(name: str, priority: int) -> None:
            async with turns.turn(priority):
                order.append(name)

        async with turns.turn(0):
            leaving = asyncio.create_task(wait("leaves", 0))
            staying = asyncio.create_task(wait("stays", 2))
            await asyncio.sleep(0)
            leaving.cancel()
            await asyncio.sleep(0)
        await asyncio.gather(leaving, staying, return_exceptions=True)
        async with turns.turn(0):  # nothing is held any more: no wait
            order.append("after")
        return order, turns.waiting

    assert asyncio.run(scenario()) == (["stays", "after"], 0)


def test_a_place_handed_over_just_as_its_waiter_left_passes_to_the_next() -> None:
    async def scenario() -> list[str]:
        turns = PriorityTurns(1)
        order: list[str] = []

        async def wait(name: str) -> None:
            async with turns.turn(1):
                order.append(name)

        first = turns.turn(0)
        await first.__aenter__()
        leaving = asyncio.create_task(wait("leaves"))
        staying = asyncio.create_task(wait("stays"))
        await asyncio.sleep(0)
        await first.__aexit__(None, None, None)  # hands the place to "leaves" ...
        leaving.cancel()  # ... which goes before it could use it
        await asyncio.gather(leaving, staying, return_exceptions=True)
        return order

    assert asyncio.run(scenario()) == ["stays"]


def test_as_many_run_at_once_as_the_engine_decodes() -> None:
    async def scenario() -> int:
        turns = PriorityTurns(2)
        running = most = 0

        async def one() -> None:
            nonlocal running, most
            async with turns.turn(0):
                running += 1
                most = max(most, running)
                await asyncio.sleep(0.01)
                running -= 1

        await asyncio.gather(*(one() for _ in range(6)))
        return most

    assert asyncio.run(scenario()) == 2


class _OneAtATime:
    """A fallback engine that decodes one sequence at a time and records whose turn it was."""

    name = "fake"
    parallel = 1

    def __init__(self, _: FallbackSettings) -> None:
        self.served: list[str] = []
        self.release = asyncio.Event()

    async def start(self) -> None:
        pass

    async def chat(self, params: ChatParams) -> AsyncGenerator[Piece | Finish, None]:
        text = str(params.messages[-1]["content"])
        self.served.append(text)
        if text == "first":
            await self.release.wait()
        yield Piece(text)
        yield Finish("stop", 1, 1)

    async def complete(self, params: CompletionParams) -> AsyncGenerator[Piece | Finish, None]:
        yield Finish("stop", 1, 0)

    async def check_health(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def _replica() -> tuple[CpuFallback, _OneAtATime]:
    """A fallback replica over an engine that decodes one sequence at a time."""
    settings = FallbackSettings(
        engine="llama_cpp", source="x.gguf", model_id="fallback", context_window=512,
        threads=1, ollama_model="x", keep_alive="1h",
    )  # fmt: skip
    engine = _OneAtATime(settings)
    replica = CpuFallback.__new__(CpuFallback)
    await CpuFallback.__init__(replica, settings, lambda _: engine)
    return replica, engine


def _request(text: str, priority: int) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="fallback", messages=[{"role": "user", "content": text}], priority=priority
    )


def test_the_fallback_replica_answers_a_user_before_background_work_that_came_first() -> None:
    async def scenario() -> list[str]:
        replica, engine = await _replica()

        async def answer(text: str, priority: int) -> None:
            async for _ in replica.chat(_request(text, priority)):
                pass

        tasks = [asyncio.create_task(answer("first", 2))]
        await asyncio.sleep(0.01)  # the engine is busy with it
        for text, priority in [("bg-a", 2), ("bg-b", 2), ("user", 0)]:
            tasks.append(asyncio.create_task(answer(text, priority)))
            await asyncio.sleep(0.01)
        engine.release.set()
        await asyncio.gather(*tasks)
        return engine.served

    assert asyncio.run(scenario()) == ["first", "user", "bg-a", "bg-b"]


def test_a_waiter_gains_one_number_per_aging_period_so_background_is_not_starved() -> None:
    async def scenario() -> list[str]:
        now = [0.0]
        turns = PriorityTurns(1, aging_s=10.0, clock=lambda: now[0])
        order: list[str] = []

        async def wait(name: str, priority: int) -> None:
            async with turns.turn(priority):
                order.append(name)

        first = turns.turn(0)
        await first.__aenter__()
        background = asyncio.create_task(wait("background", 2))
        await asyncio.sleep(0)
        now[0] = 25.0  # two periods later: background ranks as a user now, and came first
        user = asyncio.create_task(wait("user", 0))
        await asyncio.sleep(0)
        await first.__aexit__(None, None, None)
        await asyncio.gather(background, user)
        return order

    assert asyncio.run(scenario()) == ["background", "user"]


def test_a_client_that_leaves_mid_answer_frees_the_engine_for_the_next_waiter() -> None:
    async def scenario() -> list[str]:
        replica, engine = await _replica()
        leaving: Any = replica.chat(_request("first", 2))  # held on its first piece
        opened: asyncio.Task[Any] = asyncio.ensure_future(anext(leaving))
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(_drain(replica.chat(_request("next", 2))))
        await asyncio.sleep(0.01)
        assert engine.served == ["first"]  # the next one waits its turn
        opened.cancel()  # the client goes away mid-answer, as Serve cancels it
        await asyncio.gather(opened, return_exceptions=True)
        await leaving.aclose()
        await asyncio.wait_for(waiting, 5)
        return engine.served

    assert asyncio.run(scenario()) == ["first", "next"]


async def _drain(items: Any) -> None:
    async for _ in items:
        pass
