"""One set of slots per backend for every router of the app (pure logic).

With several routers (ingress replicas that each run one, or router replicas), each admits
under its own share of a backend's cap. A fixed share (`cap // routers`) lets a user request
wait at one router while another holds slots nobody uses. Here each router posts what it holds
and what waits there, by class, to the app's slot broker a few times a second, and runs under
the lease the broker hands back; admission itself stays local (no round trip per request).

Where the slots should be (`targets`): every request in flight keeps its slot; the free ones go
to the users waiting, round robin over the routers, then back towards each router's fair share
(what a fixed split would give it, so its class shares keep headroom for the users who arrive
there), then evenly. When no slot is free and users wait at one router, a router where no
user waits gives back the slots its requests free as they end: its target drops below what it
runs, so its own background work does not take them first.

The ledger hands out targets without ever letting the routers' slots sum past the cap: a
router's holding is the most it may admit under before its next post (the larger of the lease
it last reported running under, the lease last granted and what it runs); a lease grows only
into slots no other router holds, and a shrunk lease frees its slots once its router reports
running under it. A router that falls silent keeps its holding (at least its fallback share,
which it runs under once it cannot reach the broker) until it is known gone.

Each post also carries the router's work on the backend by class
(`policy.preemption.RouterWork`), and the books hand every router all the routers' last (fresh)
work: each router's class shares count the backend's running requests, and with preemption on
each reckons the backend's batch and its part of the pausing from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from core.types import PriorityClass
from policy.preemption import RouterWork

__all__ = ["Lease", "SlotAnswer", "SlotLedger", "SlotReport", "fallback_share", "targets"]


@dataclass(frozen=True)
class SlotReport:
    """One router's post for one backend."""

    lease: int  # the slots it admits under now
    in_flight: int  # admitted and not yet ended
    waiting: Mapping[PriorityClass, int]  # queued, by base class
    total: int  # the backend's slots over every router, as this router counts them
    work: RouterWork | None = None  # what it runs, by class (None from an older router)


@dataclass(frozen=True)
class Lease:
    """Slots granted to one router, out of `of_total` (a router whose count of the backend's
    replicas changes scales its lease by it until the next grant)."""

    slots: int
    of_total: int


@dataclass(frozen=True)
class SlotAnswer:
    """The broker's answer to a post: the router's leases, and whether users wait at some
    router (then every router posts more often, so slots reach them sooner)."""

    leases: Mapping[str, Lease]
    hurry: bool = False
    # Per backend, every router's last fresh work (its own too), by router name; `me` is this
    # router's name there.
    work: Mapping[str, Mapping[str, RouterWork]] = field(default_factory=dict)
    me: str = ""


def fallback_share(total: int, routers: int) -> int:
    """What a router admits under without a lease: an equal share (as without a broker)."""
    return max(1, total // max(1, routers)) if total else 0


def targets(cap: int, reports: Mapping[str, SlotReport]) -> dict[str, int]:
    """Where each router's slots should be (their sum never past `cap`, unless what runs is).

    Each router's fair share (as with fixed shares) unless users wait: the free slots go to the
    users waiting first, then back towards each router's fair share, then evenly. Only users
    pull slots: a router's class shares let background (and agent) work fill only part of its
    lease, so a slot moved to a router for its background waiters would sit idle there while
    users wait elsewhere; its fair share keeps the headroom its class shares hold for the users
    who arrive there."""
    routers = sorted(reports)
    target = {r: reports[r].in_flight for r in routers}
    free = cap - sum(target.values())
    users = {r: reports[r].waiting.get(PriorityClass.USER, 0) for r in routers}
    granted = _round_robin(users, max(free, 0))
    for r, n in granted.items():
        target[r] += n
    free -= sum(granted.values())
    unserved = {r: users[r] - granted.get(r, 0) for r in routers}
    unserved = {r: n for r, n in unserved.items() if n > 0}
    if unserved:  # no slot free
        _reclaim(target, {r for r in routers if not users[r]}, unserved)
        return target
    fair = _fair_shares(cap, routers)
    below = {r: max(0, fair[r] - target[r]) for r in routers}
    towards_fair = _round_robin(below, max(free, 0))
    for r, n in towards_fair.items():
        target[r] += n
    free -= sum(towards_fair.values())
    if free > 0:  # evenly, so an arrival anywhere starts at once
        for r, n in _round_robin(dict.fromkeys(routers, free), free).items():
            target[r] += n
    return target


def _fair_shares(cap: int, routers: list[str]) -> dict[str, int]:
    """`cap` split as evenly as it goes (the first routers get the remainder)."""
    share, extra = divmod(cap, max(1, len(routers)))
    return {r: share + (1 if i < extra else 0) for i, r in enumerate(routers)}


def _reclaim(target: dict[str, int], idle: set[str], unserved: Mapping[str, int]) -> None:
    """No slot free and users still waiting: the `idle` routers (where no user waits) give
    back the slots their requests free as they end, one per waiting user, to the routers where
    those wait (round robin both ways)."""
    donors = {r: n for r, n in target.items() if r in idle}
    given = _round_robin(donors, sum(unserved.values()))
    for r, n in given.items():
        target[r] -= n
    for r, n in _round_robin(dict(unserved), sum(given.values())).items():
        target[r] += n


def _round_robin(wants: Mapping[str, int], supply: int) -> dict[str, int]:
    """`supply` units one at a time over `wants` (in name order), none past what each wants."""
    got = dict.fromkeys(wants, 0)
    while supply > 0:
        takers = [r for r in sorted(wants) if got[r] < wants[r]]
        if not takers:
            break
        for r in takers[:supply]:
            got[r] += 1
        supply -= min(supply, len(takers))
    return {r: n for r, n in got.items() if n}


@dataclass
class _Router:
    report: SlotReport
    granted: int
    at: float

    @property
    def holding(self) -> int:
        return max(self.report.lease, self.granted, self.report.in_flight)


@dataclass
class SlotLedger:
    """The broker's books for one app: every router's last post and grant, per backend.

    `routers`: how many share each cap (the fallback share a silent router runs under)."""

    routers: int
    _books: dict[str, dict[str, _Router]] = field(default_factory=dict)
    # Slot-seconds a user request waited at one router while another held a slot it did not
    # use (from the posts: the broker's view, at its posts' pace), by backend.
    idle_while_user_waits: dict[str, float] = field(default_factory=dict)
    user_wait_seconds: dict[str, float] = field(default_factory=dict)

    def post(self, router: str, reports: Mapping[str, SlotReport], now: float) -> dict[str, Lease]:
        """`router`'s post; its lease for each backend."""
        leases = {}
        for backend, report in reports.items():
            book = self._books.setdefault(backend, {})
            previous = book.get(router)
            if previous is not None:
                self._count(backend, router, report, now - previous.at)
            entry = book[router] = _Router(report, previous.granted if previous else report.lease,
                                           now)  # fmt: skip
            cap = min(r.report.total for r in book.values())
            # Routers not heard from yet run under their fallback share.
            unheard = max(0, self.routers - len(book)) * fallback_share(cap, self.routers)
            want = targets(cap - unheard, {r: e.report for r, e in book.items()})[router]
            others = unheard + sum(e.holding for r, e in book.items() if r != router)
            entry.granted = max(0, min(want, cap - others))
            leases[backend] = Lease(entry.granted, cap)
        return leases

    def work_for(
        self, reports: Mapping[str, SlotReport], now: float, fresh_s: float
    ) -> dict[str, dict[str, RouterWork]]:
        """For each backend of a post that carried its work: every router's work there from a
        post in the last `fresh_s` (one silent longer may be gone: its work would hold lower
        classes back for nothing)."""
        return {
            backend: {
                router: e.report.work
                for router, e in self._books.get(backend, {}).items()
                if e.report.work is not None and now - e.at <= fresh_s
            }
            for backend, report in reports.items()
            if report.work is not None
        }

    def forget(self, gone: Iterable[str]) -> None:
        """Routers known to be gone (dead replicas): their slots are free."""
        gone = set(gone)
        for book in self._books.values():
            for router in gone & book.keys():
                del book[router]

    def users_waiting(self) -> bool:
        """Whether some router's last post had users waiting."""
        return any(
            e.report.waiting.get(PriorityClass.USER, 0)
            for book in self._books.values()
            for e in book.values()
        )

    def routers_known(self) -> set[str]:
        return {router for book in self._books.values() for router in book}

    def silent(self, router: str) -> None:
        """A router not heard from: until it is known gone, it holds at least its fallback
        share (which it runs under once it cannot reach the broker)."""
        for book in self._books.values():
            entry = book.get(router)
            if entry is not None:
                share = fallback_share(entry.report.total, self.routers)
                entry.granted = max(entry.granted, share)

    def _count(self, backend: str, router: str, report: SlotReport, dt: float) -> None:
        users = report.waiting.get(PriorityClass.USER, 0)
        if not users or dt <= 0:
            return
        book = self._books[backend]
        unused = sum(
            max(0, e.report.lease - e.report.in_flight) for r, e in book.items() if r != router
        )
        self.user_wait_seconds[backend] = self.user_wait_seconds.get(backend, 0.0) + users * dt
        if unused:
            idle = min(users, unused) * dt
            self.idle_while_user_waits[backend] = (
                self.idle_while_user_waits.get(backend, 0.0) + idle
            )
