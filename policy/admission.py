"""Admission for one backend: a concurrency cap and a bounded priority queue (pure logic).

A class may hold only its share of the cap (`shares`, from `router.class_shares`: background
half, agent three quarters, user all by default), counting the classes below it: background
holds at most its share, agents and background together at most agents' share, users may fill
the cap. What the shares leave is headroom that only the classes above ever take, so a user
who arrives while background work holds its share starts at once instead of waiting for a
background answer to end. Background work gets its share whenever it waits: a user running
does not keep it out, only its own share does.
Who gets the next free slot: the best effective class (user > agent > background) whose own
share has room, where a waiter gains one class for every `aging_s` it has waited, oldest first
within a class. Aging orders the queue (an aged background request goes ahead of newer users
for a slot inside background's share) and lifts a waiter past preemption's timing rules (a
hold-down, a higher class in a full batch); it never lifts a request past its own class's share,
however long it waited. When the queue is full, the lowest *base* class is shed first (newest
first within it): aging never lets background push a user out.
With several routers sharing a backend's slots (`total`, `elsewhere`), a class holds its share
both of the backend's slots, counting what every router runs (their last posts), and of this
router's own lease: the first keeps the backend's headroom, the second keeps headroom at each
router (users who arrive there start at once) and bounds what routers admit between two posts.
A paused backend (KV-cache pressure) admits nobody new until it resumes; its waiters keep waiting.
With preemption rules (`policy.preemption`), a lower class also waits while a higher one runs in
a batch already at its size; a waiter may keep an earlier arrival time (a paused request goes
back to the head of its class).

Callers pass the time in, so tests need no clock; `policy.gate` wraps this in asyncio.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.types import PriorityClass
from policy.preemption import PreemptRules, holds

__all__ = ["CLASSES", "AdmissionQueue", "Arrival", "Waiter", "background_slots", "class_limits"]

CLASSES = tuple(PriorityClass)


@dataclass(frozen=True)
class Waiter:
    ticket: int
    priority: PriorityClass
    since: float  # waiting from: aging counts from here
    first: float | None = None  # arrived first (a paused request): its place in its class

    @property
    def place(self) -> float:
        return self.since if self.first is None else self.first

    def effective_rank(self, now: float, aging_s: float) -> int:
        steps = math.floor((now - self.since) / aging_s) if aging_s > 0 else 0
        return max(0, self.priority.rank - steps)

    def effective_class(self, now: float, aging_s: float) -> PriorityClass:
        return CLASSES[self.effective_rank(now, aging_s)]


@dataclass(frozen=True)
class Arrival:
    admitted: bool
    # Tickets refused with 429: the arrival itself, or a lower-class waiter it displaced.
    shed: tuple[int, ...] = ()
    # Earlier waiters admitted now: time took them past a hold-down since the last event.
    granted: tuple[int, ...] = ()


def _at_or_below(running: Mapping[PriorityClass, int], priority: PriorityClass) -> int:
    """Running requests of `priority` and the classes below it (what its share counts)."""
    return sum(n for c, n in running.items() if c.rank >= priority.rank)


def class_limits(cap: int, shares: Mapping[PriorityClass, float]) -> dict[PriorityClass, int]:
    """Slots each class may fill: its share of the cap, at least one (none at a cap of zero: a
    backend asleep, whose requests wait for it to wake)."""
    return {c: max(min(cap, 1), math.floor(cap * shares.get(c, 1.0))) for c in CLASSES}


def background_slots(
    backends: Iterable[Mapping[str, Any]], model: str, shares: Mapping[PriorityClass, float]
) -> int:
    """Slots the background class may fill on `model`'s backends that take work, over every
    router, from one router's status report (each backend's `model`, `state` and `cap_total`,
    or `cap` from a router that reports no total)."""
    return sum(
        class_limits(int(backend.get("cap_total", backend["cap"])), shares)[
            PriorityClass.BACKGROUND
        ]
        for backend in backends
        if backend.get("model") == model and backend.get("state") in ("up", "degraded")
    )


@dataclass
class AdmissionQueue:
    cap: int
    max_queue: int
    aging_s: float
    shares: Mapping[PriorityClass, float] = field(default_factory=dict)
    paused: bool = False
    preempt: PreemptRules | None = None
    kv_usage: float | None = None  # the backend's last fresh KV cache reading (preemption)
    # What other routers run on the backend, by class (shared slots): the shares count it, and
    # preemption weighs the backend's batch, not this router's part of it.
    elsewhere: Mapping[PriorityClass, int] = field(default_factory=dict)
    # The backend's slots over every router, whose shares the classes hold (shared slots);
    # None: this router's own cap (one router, or a fixed split of the cap).
    total: int | None = None
    _waiting: list[Waiter] = field(default_factory=list)
    _limits: dict[PriorityClass, int] = field(init=False)  # of the backend's slots (`total`)
    _own_limits: dict[PriorityClass, int] = field(init=False)  # of this router's (`cap`)
    _running: dict[int, PriorityClass] = field(default_factory=dict)  # by ticket, base class
    # When a request of each class last ended here (preempt.resume_after_s holds lower ones).
    _ended: dict[PriorityClass, float] = field(default_factory=dict)
    _running_by_class: dict[PriorityClass, int] = field(
        default_factory=lambda: dict.fromkeys(PriorityClass, 0)
    )
    # Seats given, by base class; and the most each class held at once (with the classes below
    # it, as its share counts) since the limits last changed: who took which slot.
    _seats: dict[PriorityClass, int] = field(
        default_factory=lambda: dict.fromkeys(PriorityClass, 0)
    )
    _most_held: dict[PriorityClass, int] = field(
        default_factory=lambda: dict.fromkeys(PriorityClass, 0)
    )

    def __post_init__(self) -> None:
        self._limits = class_limits(self._shared_cap, self.shares)
        self._own_limits = class_limits(self.cap, self.shares)

    @property
    def _shared_cap(self) -> int:
        return self.cap if self.total is None else self.total

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def running_by_class(self) -> dict[PriorityClass, int]:
        return dict(self._running_by_class)

    def running_everywhere(self) -> dict[PriorityClass, int]:
        """What runs on the backend by class: here, and at the other routers (`elsewhere`)."""
        return {c: n + self.elsewhere.get(c, 0) for c, n in self._running_by_class.items()}

    def held(self, priority: PriorityClass) -> int:
        """What counts against `priority`'s share: the backend's running requests of its class
        and the classes below it."""
        return _at_or_below(self.running_everywhere(), priority)

    def seats(self) -> dict[PriorityClass, int]:
        """Seats given so far, by base class."""
        return dict(self._seats)

    def most_held(self) -> dict[PriorityClass, int]:
        """The most each class held at once (`held`) since the limits last changed."""
        return dict(self._most_held)

    def seen_elsewhere(self, running: Mapping[PriorityClass, int], now: float) -> list[int]:
        """What the other routers run now: waiters their work held back may go."""
        self.elsewhere = dict(running)
        return self._admit_waiters(now)

    def limit(self, priority: PriorityClass) -> int:
        return self._limits[priority]

    @property
    def depth(self) -> int:
        return len(self._waiting)

    def depth_by_class(self) -> dict[PriorityClass, int]:
        counts = dict.fromkeys(PriorityClass, 0)
        for waiter in self._waiting:
            counts[waiter.priority] += 1
        return counts

    def arrive(
        self, ticket: int, priority: PriorityClass, now: float, since: float | None = None
    ) -> Arrival:
        """`since`: when the request first arrived, where earlier than now: a paused request
        waiting again keeps its place in its class (its age counts from now: running is not
        waiting, or a long answer would come back aged past every class)."""
        # Time may have aged a waiter past a hold-down since the last event: them first.
        granted = tuple(self._admit_waiters(now))
        # Whoever still waits has no room; one of the arrival's class could not go either (the
        # same share, and no more time in its favour), so the arrival goes ahead exactly when
        # its own class has room: a user past an aged background waiter kept to its share.
        if self._has_room(priority, priority, now):
            self._start(ticket, priority)
            return Arrival(admitted=True, granted=granted)
        waiter = Waiter(ticket, priority, now, None if since is None else min(since, now))
        if len(self._waiting) < self.max_queue:
            self._waiting.append(waiter)
            return Arrival(admitted=False, granted=granted)
        victim = self._shed_candidate()
        if victim is None or victim.priority.rank <= priority.rank:
            return Arrival(admitted=False, shed=(ticket,), granted=granted)
        self._waiting.remove(victim)
        self._waiting.append(waiter)
        return Arrival(admitted=False, shed=(victim.ticket,), granted=granted)

    def release(self, now: float, ticket: int) -> list[int]:
        """A request ended (`ticket`, its arrival's): free its slot and admit whoever may go
        next."""
        if ticket in self._running:
            ended = self._running.pop(ticket)
            self._running_by_class[ended] -= 1
            self._ended[ended] = now
        return self._admit_waiters(now)

    def held_until(self) -> float | None:
        """When the hold-down (`preempt.resume_after_s`) of the waiters' best class (as they
        arrived) ends: the time to look at the queue again. One aged past it since may go
        sooner, at another event; never later than this."""
        rules = self.preempt
        if rules is None or not rules.resume_after_s or not self._waiting:
            return None  # asked at every release: nothing to work out where no hold-down is set
        return self._hold_down_end(min(self._waiting, key=lambda w: w.priority.rank).priority)

    def _hold_down_end(self, priority: PriorityClass) -> float | None:
        """When a higher class than `priority` last ended here, plus `resume_after_s`; None
        where no hold-down applies."""
        rules = self.preempt
        if rules is None or not rules.resume_after_s:
            return None
        ends = [t for c, t in self._ended.items() if c.rank < priority.rank]
        return max(ends) + rules.resume_after_s if ends else None

    def admit_due(self, now: float) -> list[int]:
        """Waiters whose hold-down has ended by `now`."""
        return self._admit_waiters(now)

    def leave(self, ticket: int) -> bool:
        """A waiter gave up (timeout, client gone); False if it was not waiting."""
        for waiter in self._waiting:
            if waiter.ticket == ticket:
                self._waiting.remove(waiter)
                return True
        return False

    def resize(self, cap: int, now: float, total: int | None = None) -> list[int]:
        """A new cap (the backend's replica count changed, or this router's lease; `total`:
        the backend's slots over every router, None where this router's cap is its own): class
        limits follow it, and waiters that now fit are admitted. A smaller cap lets running
        work finish; it only admits less."""
        self.cap, self.total = cap, total
        self._relimit()
        return self._admit_waiters(now)

    def retune(
        self,
        cap: int,
        max_queue: int,
        aging_s: float,
        shares: Mapping[PriorityClass, float],
        now: float,
        total: int | None = None,
    ) -> list[int]:
        """New settings (a reload): waiters that now fit are admitted; a shorter queue sheds
        no one already waiting, it only takes fewer new arrivals."""
        self.max_queue, self.aging_s, self.shares = max_queue, aging_s, shares
        return self.resize(cap, now, total)

    def pause(self) -> None:
        self.paused = True

    def resume(self, now: float) -> list[int]:
        self.paused = False
        return self._admit_waiters(now)

    def _relimit(self) -> None:
        self._own_limits = class_limits(self.cap, self.shares)
        limits = class_limits(self._shared_cap, self.shares)
        if limits != self._limits:
            self._limits = limits
            self._most_held = dict.fromkeys(PriorityClass, 0)

    def _has_room(self, priority: PriorityClass, effective: PriorityClass, now: float) -> bool:
        """Whether a request of class `priority`, `effective` as aged, may start now: a free
        slot and room in its own class's share (and those above it); with preemption, no rule
        holding its effective class back."""
        if self.paused or self.in_flight >= self.cap:
            return False
        # It counts in its own class's share and in every share above it (background in
        # agents'), of the backend's slots and of this router's; users' share is the cap,
        # which this router's own (its lease) already holds.
        for cls in CLASSES[1 : priority.rank + 1]:
            if self.held(cls) >= self._limits[cls]:
                return False
            if _at_or_below(self._running_by_class, cls) >= self._own_limits[cls]:
                return False
        rules = self.preempt
        if rules is None:
            return True
        until = self._hold_down_end(effective)
        held_down = until is not None and now < until  # the same sum held_until gives
        return not holds(effective, self.running_everywhere(), rules, self.kv_usage, held_down)

    def _start(self, ticket: int, priority: PriorityClass) -> None:
        self._running[ticket] = priority
        self._running_by_class[priority] += 1
        self._seats[priority] += 1
        for cls in CLASSES:
            self._most_held[cls] = max(self._most_held[cls], self.held(cls))

    def _admit_waiters(self, now: float) -> list[int]:
        """Admit waiters best first (effective class, then place) while slots are free, each
        that its own share has room for: one kept out by its share does not hold back a
        better class behind it. A start only takes room, so one pass in order is enough."""
        admitted = []
        order = sorted(self._waiting, key=lambda w: (w.effective_rank(now, self.aging_s), w.place))
        for waiter in order:
            if self.paused or self.in_flight >= self.cap:
                break
            if self._has_room(waiter.priority, waiter.effective_class(now, self.aging_s), now):
                self._waiting.remove(waiter)
                self._start(waiter.ticket, waiter.priority)
                admitted.append(waiter.ticket)
        return admitted

    def _shed_candidate(self) -> Waiter | None:
        if not self._waiting:
            return None
        return max(self._waiting, key=lambda w: (w.priority.rank, w.place))
