"""Caps, queue order, aging, shedding and pause, on the pure queue and on the asyncio gate."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config.router import DEFAULT_CLASS_SHARES
from core.types import PriorityClass
from policy.admission import AdmissionQueue
from policy.gate import BackendGate, GatePolicy, Shed
from policy.kv_pressure import KvPolicy, KvPressure
from policy.preemption import PreemptRules

USER, AGENT, BACKGROUND = PriorityClass.USER, PriorityClass.AGENT, PriorityClass.BACKGROUND


SHARES = {USER: 1.0, AGENT: 0.9, BACKGROUND: 0.75}


def queue(
    cap: int = 1,
    max_queue: int = 10,
    aging_s: float = 10.0,
    shares: dict[PriorityClass, float] | None = None,
) -> AdmissionQueue:
    return AdmissionQueue(cap=cap, max_queue=max_queue, aging_s=aging_s, shares=shares or {})


def test_admits_up_to_the_cap_then_queues() -> None:
    q = queue(cap=2)
    assert q.arrive(1, USER, 0).admitted
    assert q.arrive(2, USER, 0).admitted
    third = q.arrive(3, USER, 0)
    assert not third.admitted
    assert third.shed == ()
    assert (q.in_flight, q.depth) == (2, 1)
    assert q.release(1, ticket=1) == [3]
    assert (q.in_flight, q.depth) == (2, 0)


def test_higher_classes_go_first_fifo_within_a_class() -> None:
    q = queue(cap=1)
    q.arrive(0, USER, 0)
    for ticket, cls in [(1, BACKGROUND), (2, AGENT), (3, USER), (4, AGENT), (5, USER)]:
        q.arrive(ticket, cls, ticket * 0.1)
    order, running = [], 0
    for _ in range(5):
        running = q.release(1, running)[0]
        order.append(running)
    assert order == [3, 5, 2, 4, 1]


def test_aging_lifts_a_long_waiting_background_request_above_newer_users() -> None:
    q = queue(cap=1, aging_s=10)
    q.arrive(0, USER, 0)
    q.arrive(1, BACKGROUND, 0)
    q.arrive(2, USER, 15)  # background has aged one class by now: agent-level
    assert q.release(16, ticket=0) == [2]
    q.arrive(3, USER, 17)
    assert q.release(21, ticket=2) == [1]  # 21 s waited: two classes, user-level, and older


def test_a_full_queue_sheds_the_lowest_class_newest_first() -> None:
    q = queue(cap=1, max_queue=2)
    q.arrive(0, USER, 0)
    q.arrive(1, BACKGROUND, 1)
    q.arrive(2, BACKGROUND, 2)
    arrival = q.arrive(3, USER, 3)
    assert arrival.shed == (2,)
    assert not arrival.admitted
    assert q.depth_by_class() == {USER: 1, AGENT: 0, BACKGROUND: 1}


def test_a_full_queue_refuses_an_arrival_no_better_than_the_worst_waiter() -> None:
    q = queue(cap=1, max_queue=1)
    q.arrive(0, USER, 0)
    q.arrive(1, AGENT, 0)
    assert q.arrive(2, AGENT, 1).shed == (2,)
    assert q.arrive(3, BACKGROUND, 1).shed == (3,)


def test_aging_never_lets_background_displace_a_user() -> None:
    q = queue(cap=1, max_queue=1, aging_s=1)
    q.arrive(0, USER, 0)
    q.arrive(1, BACKGROUND, 0)
    assert q.arrive(2, USER, 100).shed == (1,)


def test_pause_holds_new_work_and_resume_admits_it() -> None:
    q = queue(cap=2)
    q.pause()
    assert not q.arrive(1, USER, 0).admitted
    assert q.resume(1) == [1]


def test_a_waiter_that_leaves_is_not_admitted() -> None:
    q = queue(cap=1)
    q.arrive(0, USER, 0)
    q.arrive(1, USER, 0)
    assert q.leave(1)
    assert not q.leave(1)
    assert q.release(1, ticket=0) == []
    assert q.in_flight == 0


def test_background_fills_only_its_share_and_a_user_starts_at_once() -> None:
    q = queue(cap=4, shares=SHARES)
    assert [q.arrive(t, BACKGROUND, 0).admitted for t in range(4)] == [True] * 3 + [False]
    assert q.arrive(4, USER, 1).admitted  # the headroom: no wait behind background work
    assert not q.arrive(5, USER, 1).admitted  # the cap itself still holds
    assert q.release(2, ticket=0) == [5]  # the user outranks the background waiter
    assert q.release(3, ticket=1) == [3]  # background holds one of its three: users do not count
    assert q.running_by_class() == {USER: 2, AGENT: 0, BACKGROUND: 2}
    assert q.release(4, ticket=4) == []  # a free slot, and background's share still has room
    assert q.depth == 0


def test_agents_and_background_together_hold_at_most_agents_share() -> None:
    q = queue(cap=10, shares=SHARES)  # user 10, agent 9, background 7
    assert all(q.arrive(t, BACKGROUND, 0).admitted for t in range(7))
    assert [q.arrive(t, AGENT, 0).admitted for t in range(7, 10)] == [True, True, False]
    assert q.arrive(10, USER, 0).admitted  # the one slot only users take
    assert (q.held(AGENT), q.held(BACKGROUND), q.in_flight) == (9, 7, 10)


def test_agent_gets_its_share_between_background_and_user() -> None:
    q = queue(cap=10, shares=SHARES)
    assert (q.limit(USER), q.limit(AGENT), q.limit(BACKGROUND)) == (10, 9, 7)
    assert queue(cap=1, shares=SHARES).limit(BACKGROUND) == 1  # never below one slot


def test_an_aged_background_waiter_keeps_backgrounds_share_and_a_user_is_seated_first() -> None:
    q = queue(cap=2, aging_s=10, shares=DEFAULT_CLASS_SHARES)  # background: one of the two
    assert q.arrive(0, BACKGROUND, 0).admitted  # background holds its share
    assert not q.arrive(1, BACKGROUND, 0).admitted
    arrival = q.arrive(2, USER, 25)  # ticket 1 has aged past two steps: it ranks as a user
    assert arrival.admitted
    assert arrival.granted == ()
    assert q.running_by_class() == {USER: 1, AGENT: 0, BACKGROUND: 1}
    assert not q.arrive(3, USER, 26).admitted  # the cap is full: it waits behind the aged one
    assert q.release(27, ticket=2) == [3]  # a user's slot freed: background is still at its share
    assert q.release(30, ticket=0) == [1]  # background's own slot freed: the aged one goes
    assert q.most_held()[BACKGROUND] == 1
    assert q.seats() == {USER: 2, AGENT: 0, BACKGROUND: 2}


def test_aging_orders_waiters_inside_a_share() -> None:
    q = queue(cap=2, aging_s=10, shares=DEFAULT_CLASS_SHARES)
    q.arrive(0, USER, 0)
    q.arrive(1, USER, 0)
    q.arrive(2, BACKGROUND, 0)
    q.arrive(3, USER, 25)  # newer than the background waiter, which ranks as a user by now
    assert q.release(26, ticket=0) == [2]  # background has room in its share: the older goes
    assert q.release(27, ticket=1) == [3]


def test_shared_slots_hold_the_share_of_the_backends_slots_over_every_router() -> None:
    q = queue(cap=1, shares=DEFAULT_CLASS_SHARES)
    q.resize(1, 0, total=2)  # a lease of one of the backend's two slots
    q.seen_elsewhere({USER: 0, AGENT: 0, BACKGROUND: 1}, 0)  # another router runs background
    assert not q.arrive(0, BACKGROUND, 0).admitted  # background's one slot is taken there
    assert q.arrive(1, USER, 0).admitted
    q.release(1, ticket=1)
    assert q.seen_elsewhere({USER: 0, AGENT: 0, BACKGROUND: 0}, 2) == [0]  # it ended there


def test_between_two_posts_each_router_keeps_backgrounds_share_of_its_own_lease() -> None:
    routers = [queue(cap=4, shares=DEFAULT_CLASS_SHARES) for _ in range(2)]
    for q in routers:
        q.resize(4, 0, total=8)  # leases of four of the backend's eight slots
    # Background arrives at both before either hears of the other's: each holds two of its
    # four, together background's four of eight, and users start at once at either.
    for q in routers:
        assert [q.arrive(t, BACKGROUND, 0).admitted for t in range(4)] == [True] * 2 + [False] * 2
        assert q.arrive(9, USER, 0).admitted


@given(
    st.lists(
        st.tuples(st.sampled_from(["arrive", "release", "leave"]), st.sampled_from(PriorityClass)),
        max_size=60,
    ),
    st.integers(1, 6),
    st.integers(0, 5),
    st.booleans(),
)
def test_in_flight_never_exceeds_the_cap_and_the_queue_its_bound(
    steps: list[tuple[str, PriorityClass]], cap: int, max_queue: int, with_shares: bool
) -> None:
    q = queue(cap=cap, max_queue=max_queue, aging_s=3, shares=SHARES if with_shares else None)
    running: list[int] = []  # tickets, oldest first
    for now, (action, cls) in enumerate(steps):
        if action == "arrive":
            arrival = q.arrive(now, cls, now)
            running += [now] if arrival.admitted else []
            running += arrival.granted
        elif action == "release" and running:
            running += q.release(now, running.pop(0))
        elif action == "leave":
            q.leave(now - 1)
        assert q.in_flight == len(running) <= cap
        assert sum(q.running_by_class().values()) == len(running)
        assert q.depth <= max_queue
        # No class ever holds past its share, however long its waiters waited.
        assert all(q.held(c) <= q.limit(c) for c in PriorityClass)
        # Work-conserving: nobody waits while a slot is free and every share it counts in
        # (its class's, and those above it but the users' cap) has room.
        full = {c for c in (AGENT, BACKGROUND) if q.held(c) >= q.limit(c)}
        waiting = [c for c, n in q.depth_by_class().items() if n]
        assert q.in_flight >= cap or all(
            full & {s for s in (AGENT, BACKGROUND) if s.rank <= c.rank} for c in waiting
        )


def test_kv_pressure_hysteresis_and_staleness() -> None:
    kv = KvPressure(KvPolicy(high=0.88, resume_factor=0.9, stale_after_s=5))
    assert not kv.pressured(0)  # no reading yet: a fresh engine is trusted
    kv.observe(0.89, 0)
    assert kv.pressured(0)
    kv.observe(0.85, 1)  # below the line, above 0.792: still held
    assert kv.pressured(1)
    kv.observe(0.79, 2)
    assert not kv.pressured(2)
    assert kv.pressured(7.1)  # the reading went stale
    kv.forget()  # a replaced engine: trusted again until it reports
    assert not kv.pressured(100)
    assert kv.usage is None


def gate(cap: int = 1, max_queue: int = 4, timeout_s: float = 5.0) -> BackendGate:
    return BackendGate(
        queue(cap=cap, max_queue=max_queue),
        GatePolicy(timeout_s, retry_after_s=3),
        clock=lambda: 0.0,
    )


def test_gate_waits_for_a_release() -> None:
    async def scenario() -> list[str]:
        g = gate(cap=1)
        events: list[str] = []
        first = await g.acquire(USER)

        async def second() -> None:
            await g.acquire(USER)
            events.append("second admitted")

        task = asyncio.create_task(second())
        await asyncio.sleep(0.01)
        events.append("releasing")
        g.release(first)
        await task
        return events

    assert asyncio.run(scenario()) == ["releasing", "second admitted"]


def test_gate_sheds_with_retry_after_when_displaced() -> None:
    # A long timeout: the displacement must not race the clock on a loaded machine.
    async def scenario() -> tuple[Shed, int]:
        g = gate(cap=1, max_queue=1, timeout_s=60.0)
        held = await g.acquire(USER)
        background = asyncio.create_task(g.acquire(BACKGROUND))
        await asyncio.sleep(0)  # the background request takes its place in the queue
        assert g.queue.depth == 1
        user = asyncio.create_task(g.acquire(USER))
        with pytest.raises(Shed) as displaced:
            await background
        g.release(held)
        g.release(await user)
        return displaced.value, g.queue.depth

    displaced, depth = asyncio.run(scenario())
    assert "displaced" in displaced.reason
    assert displaced.retry_after_s == 3
    assert depth == 0


def test_gate_sheds_with_retry_after_on_timeout() -> None:
    async def scenario() -> tuple[Shed, int]:
        g = gate(cap=1, max_queue=1, timeout_s=0.05)
        await g.acquire(USER)
        with pytest.raises(Shed) as timed_out:
            await g.acquire(USER)
        return timed_out.value, g.queue.depth

    timed_out, depth = asyncio.run(scenario())
    assert "timed out" in timed_out.reason
    assert timed_out.retry_after_s == 3
    assert depth == 0


def test_a_cancelled_waiter_leaves_the_queue_and_keeps_no_slot() -> None:
    async def scenario() -> tuple[int, int]:
        g = gate(cap=1)
        first = await g.acquire(USER)
        waiter = asyncio.create_task(g.acquire(USER))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        g.release(first)
        return g.queue.in_flight, g.queue.depth

    assert asyncio.run(scenario()) == (0, 0)


PREEMPT_AT_ONE = PreemptRules(above_running=1, above_kv=None, may_pause={PriorityClass.USER: 1},
                              max_pauses=2, protect_last_tokens=0)  # fmt: skip


def held_down_gate(resume_after_s: float) -> BackendGate:
    rules = replace(PREEMPT_AT_ONE, resume_after_s=resume_after_s)
    queue = AdmissionQueue(cap=4, max_queue=8, aging_s=60.0, preempt=rules)
    return BackendGate(queue, GatePolicy(queue_timeout_s=5.0, retry_after_s=1), time.monotonic)


async def background_waiting_behind_a_user(gate: BackendGate) -> tuple[int, asyncio.Task[int]]:
    """A user's slot, and a background acquire waiting: the batch is at its size of one."""
    user = await gate.acquire(PriorityClass.USER)
    waiting = asyncio.create_task(gate.acquire(PriorityClass.BACKGROUND))
    await asyncio.sleep(0)
    return user, waiting


def test_the_gate_admits_a_held_down_waiter_when_its_hold_down_ends_with_no_other_event() -> None:
    gate = held_down_gate(0.05)

    async def scenario() -> list[bool]:
        user, waiting = await background_waiting_behind_a_user(gate)
        gate.release(user)
        held = gate.queue.depth == 1  # the user just ended: held down, still in the queue
        await asyncio.wait_for(waiting, 5.0)  # no release or arrival comes: the gate's reminder
        return [held, gate.queue.depth == 0, gate.queue.in_flight == 1]

    assert asyncio.run(scenario()) == [True, True, True]


def test_a_waiter_the_hold_down_holds_after_a_wake_is_looked_at_again_when_it_ends() -> None:
    # Every event that admits may leave waiters to the hold-down alone, not only a release.
    gate = held_down_gate(0.0)

    async def scenario() -> list[bool]:
        user, waiting = await background_waiting_behind_a_user(gate)
        gate.pause()  # the backend put to sleep
        gate.release(user)  # no hold-down yet: nothing to look at later
        gate.queue.preempt = replace(PREEMPT_AT_ONE, resume_after_s=0.05)  # a reload
        gate.resume()  # awake: the hold-down, now on, holds the waiter
        held = gate.queue.depth == 1
        await asyncio.wait_for(waiting, 5.0)
        return [held, gate.queue.in_flight == 1]

    assert asyncio.run(scenario()) == [True, True]
