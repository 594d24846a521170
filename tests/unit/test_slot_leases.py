"""One set of slots per backend over every router (policy/slot_leases.py): where the slots
should be, and a ledger that moves them there without the routers ever admitting past the
cap, checked against a seeded simulation of routers admitting under their leases."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.types import PriorityClass
from deployments.router.adapters.serve_ports import BrokerSlots
from deployments.router.loops.slot_sync import FALLBACK_AFTER_S, HURRY_S, POST_S, SlotSync
from deployments.router.request_path.link import build_links
from deployments.router.slot_broker import (
    PROTOCOL,
    SILENT_AFTER_S,
    WORK_FRESH_S,
    SlotBroker,
    broker_name,
    work_from_wire,
    work_to_wire,
)
from policy.preemption import RouterWork
from policy.slot_leases import (
    Lease,
    SlotAnswer,
    SlotLedger,
    SlotReport,
    fallback_share,
    targets,
)
from tests.fakes.clock import FakeClock
from tests.fakes.router_harness import (
    FakeBackend,
    FakeStream,
    collect,
    job,
    make_config,
    make_router,
    ok,
    two,
)
from tests.unit.test_reload import changed

USER, AGENT, BACKGROUND = PriorityClass.USER, PriorityClass.AGENT, PriorityClass.BACKGROUND


def report(lease: int, in_flight: int = 0, total: int = 16, **waiting: int) -> SlotReport:
    return SlotReport(lease, in_flight, {PriorityClass(c): n for c, n in waiting.items()}, total)


def test_where_no_user_waits_each_router_has_its_fair_share() -> None:
    assert targets(16, {"a": report(8), "b": report(8)}) == {"a": 8, "b": 8}
    assert targets(16, {"a": report(8, 3), "b": report(8, 1)}) == {"a": 8, "b": 8}
    assert targets(16, {"a": report(8, 10), "b": report(8, 1)}) == {"a": 10, "b": 6}
    assert targets(5, {"a": report(3), "b": report(2)}) == {"a": 3, "b": 2}
    assert fallback_share(16, 3) == 5


def test_free_slots_go_to_the_users_waiting_and_the_rest_evenly() -> None:
    # b: 10 running, 4 users waiting; a: nothing running, 6 background waiting. 6 free: the
    # users' 4, then 2 towards a's fair share. Background waiters pull none (a's share of its
    # lease bounds them).
    got = targets(16, {"a": report(8, 0, background=6), "b": report(8, 10, user=4)})
    assert got == {"a": 2, "b": 14}
    assert targets(16, {"a": report(8, 0, background=6), "b": report(8, 0, agent=6)}) == {
        "a": 8,
        "b": 8,
    }


def test_a_saturated_backend_gives_the_next_freed_slots_to_the_users_waiting_elsewhere() -> None:
    # Every slot runs; users wait at b; a runs 8 and only background waits there: as a's
    # requests end, their slots go to b's users, not to a's background work.
    got = targets(16, {"a": report(8, 8, background=5), "b": report(8, 8, user=3)})
    assert got == {"a": 5, "b": 11}
    # Where users wait at both, each keeps its own.
    both = targets(16, {"a": report(8, 8, user=1), "b": report(8, 8, user=3)})
    assert both == {"a": 8, "b": 8}
    # One slot free, users at both: a's user gets it, and a gives none back to b's.
    one_free = targets(16, {"a": report(8, 7, user=1), "b": report(8, 8, user=3)})
    assert one_free == {"a": 8, "b": 8}


def test_a_lease_grows_only_into_slots_no_other_router_holds() -> None:
    ledger = SlotLedger(routers=2)
    ledger.post("a", {"m": report(8, 0)}, 0.0)
    # b's users wait; a still holds its 8 (as it last reported): b may not have them yet.
    assert ledger.post("b", {"m": report(8, 8, user=4)}, 0.1) == {"m": Lease(8, 16)}
    # a posts again: its lease shrinks to what its target is (the 4 slots b's users do not
    # need go back towards a's fair share)...
    assert ledger.post("a", {"m": report(8, 0)}, 0.2)["m"].slots == 4
    # ...but b gets those slots only once a runs under the smaller lease.
    assert ledger.post("b", {"m": report(8, 8, user=4)}, 0.3)["m"].slots == 8
    ledger.post("a", {"m": report(4, 0)}, 0.4)
    assert ledger.post("b", {"m": report(8, 8, user=4)}, 0.5)["m"].slots == 12
    # Users waited at b while a held unused slots: counted.
    assert ledger.user_wait_seconds["m"] >= ledger.idle_while_user_waits["m"] > 0


def test_a_silent_router_keeps_its_fallback_share_until_it_is_known_gone() -> None:
    ledger = SlotLedger(routers=2)
    ledger.post("a", {"m": report(8, 0)}, 0.0)
    ledger.post("b", {"m": report(8, 0, user=20)}, 0.1)
    ledger.post("a", {"m": report(8, 0)}, 0.2)  # a shrinks to 2...
    ledger.post("a", {"m": report(2, 0)}, 0.3)  # ...and runs under it
    ledger.silent("a")  # then falls silent: it runs under its share of 8 once it notices
    assert ledger.post("b", {"m": report(8, 8, user=12)}, 0.4)["m"].slots == 8
    # Gone: Serve starts a replacement, which runs under its share until it posts.
    ledger.forget(["a"])
    assert ledger.post("b", {"m": report(8, 8, user=12)}, 0.5)["m"].slots == 8
    ledger.post("c", {"m": report(8, 0)}, 0.6)
    ledger.post("c", {"m": report(0, 0)}, 0.7)  # it runs under the lease it was given
    assert ledger.post("b", {"m": report(8, 8, user=12)}, 0.8)["m"].slots == 16


def test_routers_not_heard_from_yet_hold_their_fallback_share() -> None:
    ledger = SlotLedger(routers=4)
    assert ledger.post("a", {"m": report(1, 0, total=4, user=3)}, 0.0)["m"].slots == 1


@dataclass
class SimRouter:
    """A router admitting under its lease, best class first (as its gate does)."""

    lease: int
    in_flight: int = 0
    queue: list[PriorityClass] = field(default_factory=list)

    def admit(self) -> None:
        self.queue.sort(key=lambda c: c.rank)
        while self.queue and self.in_flight < self.lease:
            self.queue.pop(0)
            self.in_flight += 1

    def post(self, name: str, ledger: SlotLedger, cap: int, now: float) -> None:
        waiting = {c: self.queue.count(c) for c in PriorityClass}
        lease = ledger.post(name, {"m": SlotReport(self.lease, self.in_flight, waiting, cap)}, now)
        self.lease = lease["m"].slots
        self.admit()


def test_routers_posting_in_any_order_never_admit_past_the_cap_and_users_get_free_slots() -> None:
    for seed in range(40):
        rng = random.Random(seed)
        cap, names = rng.choice([4, 8, 16, 17]), [f"r{i}" for i in range(rng.choice([2, 3, 4]))]
        ledger = SlotLedger(routers=len(names))
        routers = {n: SimRouter(fallback_share(cap, len(names))) for n in names}
        for step in range(600):
            name = rng.choice(names)
            router = routers[name]
            event = rng.random()
            if event < 0.35:
                router.queue.append(rng.choice([USER, AGENT, BACKGROUND, BACKGROUND]))
                router.admit()
            elif event < 0.7 and router.in_flight:
                router.in_flight -= 1
                router.admit()
            else:
                router.post(name, ledger, cap, step * 0.1)
            running = sum(r.in_flight for r in routers.values())
            assert running <= cap, f"seed {seed} step {step}: {running} running past {cap}"
        # Quiet now: nobody arrives, every request ends; a user arrives at one router after
        # another held every slot. Two rounds of posts bring it a slot.
        for router in routers.values():
            router.in_flight, router.queue = 0, []
        routers[names[0]].lease = cap - (len(names) - 1)  # one router held almost all
        for router in list(routers.values())[1:]:
            router.lease = 1
        last = routers[names[-1]]
        last.in_flight, last.queue = 1, [USER]
        for round_ in range(3):
            for name in names:
                routers[name].post(name, ledger, cap, 100.0 + round_)
        assert last.queue == [], f"seed {seed}: the user still waits"


async def eventually(check: Callable[[], bool], within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


async def eventually_async(check: Callable[[], Awaitable[bool]], within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


async def queued(router: Any, backend: str, count: int) -> bool:
    """Whether `count` jobs wait in `backend`'s queue at `router`."""
    status = await router.status()
    return bool(status["backends"][backend]["queue_depth"] == count)


class HeldStream(FakeStream):
    """Ends only once its backend's `release` is set."""

    async def __anext__(self) -> Any:
        owner = self._owner
        assert isinstance(owner, HeldBackend)
        await owner.release.wait()
        return await super().__anext__()


class HeldBackend(FakeBackend):
    stream_type = HeldStream

    def __init__(self) -> None:
        super().__init__(ok)
        self.release = asyncio.Event()


class LedgerSlots:
    """The slot broker as one router posts to it (an in-process ledger, shared)."""

    def __init__(self, ledger: SlotLedger, router: str) -> None:
        self._ledger = ledger
        self._router = router
        self.now = 0.0

    async def post(self, reports: Mapping[str, SlotReport]) -> SlotAnswer:
        self.now += 0.1
        leases = self._ledger.post(self._router, reports, self.now)
        work = self._ledger.work_for(reports, self.now, fresh_s=1.0)
        return SlotAnswer(leases, self._ledger.users_waiting(), work, self._router)


def test_a_user_waiting_at_one_router_gets_the_slots_another_leaves_unused() -> None:
    config = make_config(cap=4)
    config = changed(config, gateway={**config.gateway.model_dump(mode="json"),
                                      "ingress_replicas": 2})  # fmt: skip
    assert config.gateway.router_shares == 2
    ledger = SlotLedger(routers=2)
    busy_coding = HeldBackend()
    idle = make_router(
        config, two(FakeBackend(ok), FakeBackend(ok)), slots=LedgerSlots(ledger, "a")
    )
    busy = make_router(config, two(busy_coding, FakeBackend(ok)), slots=LedgerSlots(ledger, "b"))

    async def scenario() -> list[Any]:
        jobs = [asyncio.create_task(collect(busy, job())) for _ in range(4)]
        # Two run on b's equal share of 2, two wait (read as it happens: a fixed 20 ms wait
        # failed beside a loaded machine's other sessions).
        await eventually(lambda: busy_coding.calls == 2)
        assert busy_coding.running == 2
        # Posted before the other two wait in b's queue, b's report asks for nothing more and
        # no later post comes (1 in 12 runs here hung so, 2026-12-04).
        await eventually_async(lambda: queued(busy, "coding@local", 2))
        for _ in range(2):  # a gives up the slots it leaves unused; b runs under them
            await idle.post_slots_once()
            await busy.post_slots_once()
        # The first two are held until the waiting two run beside them: with streams of a
        # fixed length, a loaded machine ended the first two before (make test, 8507aca).
        await eventually(lambda: busy_coding.running == 4)
        busy_coding.release.set()
        return [await asyncio.gather(*jobs)]

    [answers] = asyncio.run(scenario())
    assert busy_coding.max_running == 4  # the two waiting ran beside the first two
    assert all(answer[-1] == ["data: [DONE]\n\n"] for answer in answers)
    caps = {name: r["cap"] for name, r in asyncio.run(busy.status())["backends"].items()}
    assert caps["coding@local"] >= 2


class FlakySlots:
    """A broker that answers `leases` until it is `down`."""

    def __init__(
        self,
        leases: Mapping[str, Lease],
        work: Mapping[str, Mapping[str, RouterWork]] | None = None,
    ) -> None:
        self.leases = leases
        self.work = work or {}
        self.down = False
        self.hurry = False

    async def post(self, reports: Mapping[str, SlotReport]) -> SlotAnswer:
        if self.down:
            raise ConnectionError("the broker's node is gone")
        return SlotAnswer(self.leases, self.hurry, self.work, "me")


def test_a_router_cut_off_from_the_broker_keeps_its_leases_a_while_then_an_equal_share() -> None:
    config = make_config(cap=4)
    config = changed(config, gateway={**config.gateway.model_dump(mode="json"),
                                      "ingress_replicas": 2})  # fmt: skip
    clock = FakeClock()
    links = build_links(config, two(FakeBackend(ok), FakeBackend(ok)), {}, clock.monotonic)
    broker = FlakySlots({"coding@local": Lease(3, 4), "orchestrator@local": Lease(1, 4)})
    sync = SlotSync(links, broker, clock)

    def caps() -> tuple[int, int]:
        return links["coding@local"].gate.queue.cap, links["orchestrator@local"].gate.queue.cap

    assert caps() == (2, 2)  # an equal share before the first post
    asyncio.run(sync.step())
    assert caps() == (3, 1)
    broker.down = True
    clock.now += FALLBACK_AFTER_S / 2
    asyncio.run(sync.step())
    assert caps() == (3, 1)  # a broker restarting: the leases stand
    clock.now += FALLBACK_AFTER_S
    asyncio.run(sync.step())
    assert caps() == (2, 2)
    broker.down = False
    asyncio.run(sync.step())
    assert caps() == (3, 1)


def test_the_broker_frees_a_router_only_once_it_is_silent_and_its_replica_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import deployments.live_config as live_config

    broker = SlotBroker("gateway", routers=2)
    listed: set[str] = set()  # a busy GCS may list no replica at all
    monkeypatch.setattr(live_config, "replica_ids", lambda app, deployments: set(listed))
    idle = {"m": [8, 0, {}, 16]}

    async def scenario() -> list[Any]:
        await broker.post("a", 2, idle)
        await broker.post("b", 2, idle)
        await broker.prune()  # neither listed, both just heard: both kept
        kept = broker.stats()["routers"]
        broker._heard["a"] -= SILENT_AFTER_S + 1  # a falls silent (its replica died)
        await broker.prune()
        return [kept, broker.stats()["routers"]]

    kept, after = asyncio.run(scenario())
    assert (kept, after) == (["a", "b"], ["b"])


def test_routers_post_more_often_while_users_wait_somewhere() -> None:
    config = make_config(cap=4)
    clock = FakeClock()
    links = build_links(config, two(FakeBackend(ok), FakeBackend(ok)), {}, clock.monotonic)
    broker = FlakySlots({})

    async def one_round(hurry: bool) -> None:
        broker.hurry = hurry
        loop = asyncio.create_task(SlotSync(links, broker, clock).loop())
        await asyncio.sleep(0.01)  # one post, then the loop sleeps (for good: a FakeClock)
        loop.cancel()

    asyncio.run(one_round(hurry=False))
    asyncio.run(one_round(hurry=True))
    assert clock.sleeps == [POST_S, HURRY_S]


def test_the_broker_hands_every_router_all_routers_fresh_work_on_each_backend() -> None:
    broker = SlotBroker("gateway", routers=2)
    users = work_to_wire(RouterWork({PriorityClass.USER: 1}, {}))
    background = work_to_wire(
        RouterWork({PriorityClass.BACKGROUND: 2}, {PriorityClass.BACKGROUND: 2})
    )

    async def scenario() -> list[Any]:
        await broker.post("a", 2, {"m": [8, 1, {}, 16, users]})
        answer = await broker.post("b", 2, {"m": [8, 2, {}, 16, background], "n": [8, 0, {}, 16]})
        broker._ledger._books["m"]["a"].at -= WORK_FRESH_S + 1  # a falls silent
        later = await broker.post("b", 2, {"m": [8, 2, {}, 16, background]})
        return [answer, later]

    answer, later = asyncio.run(scenario())
    assert answer["me"] == "b"
    assert {r: work_from_wire(w) for r, w in answer["work"]["m"].items()} == {
        "a": RouterWork({PriorityClass.USER: 1}, {}),
        "b": RouterWork({PriorityClass.BACKGROUND: 2}, {PriorityClass.BACKGROUND: 2}),
    }
    assert "n" not in answer["work"]  # posted without work (an older router)
    assert set(later["work"]["m"]) == {"b"}  # a silent router's work holds nobody back


def test_a_router_cut_off_from_the_broker_forgets_the_others_work_with_their_leases() -> None:
    # Another router's user, as last heard, would hold background work here for as long as the
    # broker stays away.
    config = make_config(cap=4, router={"preempt": {"enabled": True, "above_running": 1}})
    config = changed(config, gateway={**config.gateway.model_dump(mode="json"),
                                      "ingress_replicas": 2})  # fmt: skip
    clock = FakeClock()
    links = build_links(config, two(FakeBackend(ok), FakeBackend(ok)), {}, clock.monotonic)
    users = RouterWork({PriorityClass.USER: 1}, {})
    broker = FlakySlots({"coding@local": Lease(2, 4)},
                        {"coding@local": {"other": users, "me": RouterWork({}, {})}})  # fmt: skip
    sync = SlotSync(links, broker, clock)
    queue = links["coding@local"].gate.queue
    asyncio.run(sync.step())
    assert queue.running_everywhere()[PriorityClass.USER] == 1
    assert not queue.arrive(1, PriorityClass.BACKGROUND, clock.now).admitted  # held
    broker.down = True
    clock.now += FALLBACK_AFTER_S / 2
    asyncio.run(sync.step())
    assert queue.depth == 1  # a broker restarting: what the others ran stands a while
    clock.now += FALLBACK_AFTER_S
    asyncio.run(sync.step())
    assert queue.running_everywhere()[PriorityClass.USER] == 0
    assert queue.depth == 0  # admitted with the fallback share


def test_a_broker_of_an_older_protocol_has_another_name() -> None:
    assert broker_name("gateway", 1) == "gps_slot_broker::gateway"  # what routers before 2 used
    assert broker_name("gateway") == f"gps_slot_broker::v{PROTOCOL}::gateway"


class ActorMethod:
    """`actor.post.remote(...)` on a broker in this process (the Ray actor's call)."""

    def __init__(self, method: Any) -> None:
        self._method = method

    def remote(self, *args: Any) -> Any:
        return self._method(*args)


def test_routers_work_goes_to_the_broker_and_back_through_the_routers_port() -> None:
    broker = SlotBroker("gateway", routers=2)
    actor = type("Actor", (), {"post": ActorMethod(broker.post)})()
    users = RouterWork({PriorityClass.USER: 1}, {PriorityClass.USER: 1})
    background = RouterWork({PriorityClass.BACKGROUND: 3}, {PriorityClass.BACKGROUND: 2}, 1)

    async def scenario() -> SlotAnswer:
        await BrokerSlots(actor, "a", 2).post({"m": SlotReport(8, 1, {}, 16, users)})
        return await BrokerSlots(actor, "b", 2).post(
            {"m": SlotReport(8, 3, {PriorityClass.USER: 0}, 16, background),
             "n": SlotReport(8, 0, {}, 16)}
        )  # fmt: skip

    answer = asyncio.run(scenario())
    assert answer.me == "b"
    assert answer.work == {"m": {"a": users, "b": background}}
    assert set(answer.leases) == {"m", "n"}
