"""The CPU fallback serves the lowest engine priority first, in arrival order within one, each
number held to its class's share of the engine's width (counting the worse numbers), and a
client that leaves while it waits gives its place up (deployments/fallback/turns.py); a reload
retunes the line in place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from core.config import RouterConfig
from core.requests import ChatRequest
from core.types import PriorityClass
from deployments.fallback.engine import ChatParams, CompletionParams, Finish, Piece
from deployments.fallback.replica import CpuFallback, FallbackSettings
from deployments.fallback.turns import PriorityTurns, TurnRules
from tests.fakes.router_harness import make_config


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


async def _replica(build: str = "") -> tuple[CpuFallback, _OneAtATime]:
    """A fallback replica over an engine that decodes one sequence at a time."""
    settings = FallbackSettings(
        engine="llama_cpp", source="x.gguf", model_id="fallback", context_window=512,
        threads=1, ollama_model="x", keep_alive="1h",
    )  # fmt: skip
    engine = _OneAtATime(settings)
    replica = CpuFallback.__new__(CpuFallback)
    await CpuFallback.__init__(replica, settings, lambda _: engine, build)
    return replica, engine


def _request(text: str, priority: int) -> ChatRequest:
    return ChatRequest(
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
        turns = PriorityTurns(1, TurnRules(aging_s=10.0), clock=lambda: now[0])
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


# -- Headroom: each number held to its class's share of the width ---------------------------

USER, AGENT, BACKGROUND = 0, 1, 2  # router.engine_priorities' defaults
DEFAULT_RULES = TurnRules.of(4, RouterConfig())  # of 4 places: user 4, agent 3, background 2


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class _Line:
    """Requests on a PriorityTurns, each holding its place until it is let go."""

    def __init__(self, turns: PriorityTurns) -> None:
        self.turns = turns
        self.seated: list[str] = []
        self._done: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def arrive(self, name: str, number: int) -> None:
        done = self._done[name] = asyncio.Event()

        async def hold() -> None:
            async with self.turns.turn(number):
                self.seated.append(name)
                await done.wait()

        self._tasks[name] = asyncio.create_task(hold())
        await _settle()

    async def leave(self, name: str) -> None:
        self._done[name].set()
        await self._tasks[name]
        await _settle()

    async def close(self) -> None:
        for done in self._done.values():
            done.set()
        await asyncio.gather(*self._tasks.values())


def test_limits_are_the_classes_shares_of_the_width_a_shared_number_takes_the_best() -> None:
    assert TurnRules.of(4, RouterConfig()) == TurnRules(10.0, {USER: 4, AGENT: 3, BACKGROUND: 2})
    assert TurnRules.of(10, RouterConfig()).limits == {USER: 10, AGENT: 7, BACKGROUND: 5}
    # One place: each class may hold it (at least one slot each, as the router's shares).
    assert TurnRules.of(1, RouterConfig()).limits == {USER: 1, AGENT: 1, BACKGROUND: 1}
    numbers = {PriorityClass.USER: 0, PriorityClass.AGENT: 5, PriorityClass.BACKGROUND: 5}
    shared = TurnRules.of(4, RouterConfig(engine_priorities=numbers, aging_s=3.0))
    assert shared == TurnRules(3.0, {0: 4, 5: 3})  # agent's limit, not background's
    assert shared.limit(7, 4) == 4  # a number no class has: the whole width


def test_background_holds_at_most_its_share_and_users_get_the_rest() -> None:
    async def scenario() -> None:
        line = _Line(PriorityTurns(4, DEFAULT_RULES))
        for name in ("bg-1", "bg-2", "bg-3"):
            await line.arrive(name, BACKGROUND)
        assert (line.seated, line.turns.waiting) == (["bg-1", "bg-2"], 1)  # two of four
        await line.arrive("user-1", USER)
        await line.arrive("user-2", USER)
        assert line.seated[2:] == ["user-1", "user-2"]  # at once: background's wait no matter
        await line.leave("user-1")
        assert "bg-3" not in line.seated  # a free place, but background holds its share
        await line.arrive("user-3", USER)
        assert line.seated[-1] == "user-3"
        await line.leave("bg-1")
        assert line.seated[-1] == "bg-3"
        await line.close()

    asyncio.run(scenario())


def test_an_aged_background_waiter_is_not_lifted_past_its_share_a_later_user_goes() -> None:
    async def scenario() -> None:
        now = [0.0]
        line = _Line(PriorityTurns(4, DEFAULT_RULES, clock=lambda: now[0]))
        for name, number in [("bg-1", 2), ("bg-2", 2), ("user-1", 0), ("user-2", 0)]:
            await line.arrive(name, number)
        await line.arrive("bg-3", BACKGROUND)  # full: it waits
        now[0] = 25.0  # two aging periods: it ranks as a user now, and came first
        await line.arrive("user-3", USER)
        await line.leave("user-1")
        assert line.seated[-1] == "user-3"
        assert line.turns.waiting == 1  # bg-3: still two background requests run
        await line.close()

    asyncio.run(scenario())


def test_agents_and_background_together_hold_at_most_the_agents_share() -> None:
    async def scenario() -> None:
        line = _Line(PriorityTurns(4, DEFAULT_RULES))
        await line.arrive("bg-1", BACKGROUND)
        await line.arrive("bg-2", BACKGROUND)
        await line.arrive("agent-1", AGENT)
        await line.arrive("agent-2", AGENT)  # three of four held by agents and background
        assert line.seated == ["bg-1", "bg-2", "agent-1"]
        await line.arrive("user", USER)  # kept out agent-2 does not hold it back
        assert line.seated[-1] == "user"
        await line.leave("bg-1")
        assert line.seated[-1] == "agent-2"
        await line.leave("user")  # a place free, and background's own share has room (one
        await line.arrive("bg-3", BACKGROUND)  # of two), but agents' (three of four) counts it
        assert line.seated[-1] == "agent-2"
        await line.leave("agent-1")
        assert line.seated[-1] == "bg-3"
        await line.close()

    asyncio.run(scenario())


def test_with_engine_priority_off_everyone_may_fill_the_width() -> None:
    rules = TurnRules.of(4, RouterConfig(engine_priority=False))
    assert rules.limits == {0: 4}

    async def scenario() -> list[str]:
        line = _Line(PriorityTurns(4, rules))
        for i in range(5):
            await line.arrive(f"r{i}", 0)  # the router sends 0 for every class
        seated = list(line.seated)
        await line.close()
        return seated

    assert asyncio.run(scenario()) == ["r0", "r1", "r2", "r3"]


def test_retune_applies_new_limits_now_and_seats_the_waiters_that_fit() -> None:
    async def scenario() -> None:
        line = _Line(PriorityTurns(4, DEFAULT_RULES))
        for name in ("bg-1", "bg-2", "bg-3", "bg-4"):
            await line.arrive(name, BACKGROUND)
        assert line.seated == ["bg-1", "bg-2"]
        shares = {PriorityClass.AGENT: 0.75, PriorityClass.BACKGROUND: 0.75}
        line.turns.retune(TurnRules.of(4, RouterConfig(class_shares=shares)))
        await _settle()
        assert line.seated == ["bg-1", "bg-2", "bg-3"]  # three of four now
        line.turns.retune(DEFAULT_RULES)  # lowered: those running keep their places
        await line.leave("bg-1")
        assert (line.seated[-1], line.turns.waiting) == ("bg-3", 1)  # two held: the limit
        await line.close()

    asyncio.run(scenario())


def test_retune_applies_a_new_aging_period_to_the_waiters_already_in_line() -> None:
    async def scenario() -> list[str]:
        now = [0.0]
        line = _Line(PriorityTurns(1, TurnRules(aging_s=100.0), clock=lambda: now[0]))
        await line.arrive("first", USER)
        await line.arrive("background", BACKGROUND)
        now[0] = 25.0
        await line.arrive("user", USER)
        line.turns.retune(TurnRules(aging_s=10.0))  # background has aged two periods now
        await line.leave("first")
        seated = list(line.seated)
        await line.close()
        return seated

    assert asyncio.run(scenario()) == ["first", "background"]


def test_the_replica_takes_a_reloads_aging_shares_and_numbers() -> None:
    async def scenario() -> None:
        replica, _ = await _replica(build="a-build")  # outside Serve: no sync, nothing read
        assert replica._live is None
        replica.apply_config(make_config(router={"aging_s": 3.0}), {})
        assert replica._turns.rules == TurnRules(3.0, {USER: 1, AGENT: 1, BACKGROUND: 1})
        await replica.aclose()

    asyncio.run(scenario())
