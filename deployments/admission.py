"""Admission for one backend: a concurrency cap and a bounded priority queue (pure logic).

A request is admitted at once while the backend has a free slot and nobody waits; otherwise it
waits. Who gets the next free slot: the best effective class (user > agent > background), where a
waiter gains one class for every `aging_s` it has waited (so background work is not starved
forever), oldest first within a class. When the queue is full, the lowest *base* class is shed
first (newest first within it): aging orders the queue, it never lets background push a user out.
A paused backend (KV-cache pressure) admits nobody new until it resumes; its waiters keep waiting.

Callers pass the time in, so tests need no clock; `deployments.gate` wraps this in asyncio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cluster.config import PriorityClass


@dataclass(frozen=True)
class Waiter:
    ticket: int
    priority: PriorityClass
    since: float

    def effective_rank(self, now: float, aging_s: float) -> int:
        steps = math.floor((now - self.since) / aging_s) if aging_s > 0 else 0
        return max(0, self.priority.rank - steps)


@dataclass(frozen=True)
class Arrival:
    admitted: bool
    # Tickets refused with 429: the arrival itself, or a lower-class waiter it displaced.
    shed: tuple[int, ...] = ()


@dataclass
class AdmissionQueue:
    cap: int
    max_queue: int
    aging_s: float
    in_flight: int = 0
    paused: bool = False
    _waiting: list[Waiter] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return len(self._waiting)

    def depth_by_class(self) -> dict[PriorityClass, int]:
        counts = dict.fromkeys(PriorityClass, 0)
        for waiter in self._waiting:
            counts[waiter.priority] += 1
        return counts

    def arrive(self, ticket: int, priority: PriorityClass, now: float) -> Arrival:
        if not self._waiting and self._has_room():
            self.in_flight += 1
            return Arrival(admitted=True)
        waiter = Waiter(ticket, priority, now)
        if len(self._waiting) < self.max_queue:
            self._waiting.append(waiter)
            return Arrival(admitted=False)
        victim = self._shed_candidate()
        if victim is None or victim.priority.rank <= priority.rank:
            return Arrival(admitted=False, shed=(ticket,))
        self._waiting.remove(victim)
        self._waiting.append(waiter)
        return Arrival(admitted=False, shed=(victim.ticket,))

    def release(self, now: float) -> list[int]:
        """A request ended: free its slot and admit whoever may go next."""
        self.in_flight = max(0, self.in_flight - 1)
        return self._admit_waiters(now)

    def leave(self, ticket: int) -> bool:
        """A waiter gave up (timeout, client gone); False if it was not waiting."""
        for waiter in self._waiting:
            if waiter.ticket == ticket:
                self._waiting.remove(waiter)
                return True
        return False

    def pause(self) -> None:
        self.paused = True

    def resume(self, now: float) -> list[int]:
        self.paused = False
        return self._admit_waiters(now)

    def _has_room(self) -> bool:
        return not self.paused and self.in_flight < self.cap

    def _admit_waiters(self, now: float) -> list[int]:
        admitted = []
        while self._waiting and self._has_room():
            best = min(self._waiting, key=lambda w: (w.effective_rank(now, self.aging_s), w.since))
            self._waiting.remove(best)
            self.in_flight += 1
            admitted.append(best.ticket)
        return admitted

    def _shed_candidate(self) -> Waiter | None:
        if not self._waiting:
            return None
        return max(self._waiting, key=lambda w: (w.priority.rank, w.since))
