"""The asyncio side of admission: requests wait on futures the pure queue decides about."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from core.types import PriorityClass
from policy.admission import AdmissionQueue

__all__ = ["BackendGate", "GatePolicy", "Shed"]


class Shed(Exception):
    """Refused by admission: the queue was full of equal or better work, or the wait expired."""

    def __init__(self, reason: str, retry_after_s: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class GatePolicy:
    queue_timeout_s: float
    retry_after_s: int


class BackendGate:
    """Slots of one backend. `acquire` returns once admitted; every acquire needs one release."""

    def __init__(
        self, queue: AdmissionQueue, policy: GatePolicy, clock: Callable[[], float]
    ) -> None:
        self._queue = queue
        self._policy = policy
        self._clock = clock
        self._tickets = itertools.count()
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._reminder: asyncio.TimerHandle | None = None

    @property
    def queue(self) -> AdmissionQueue:
        return self._queue

    async def acquire(
        self, priority: PriorityClass, timeout_s: float | None = None, since: float | None = None
    ) -> int:
        """The slot's ticket, to release it with. `timeout_s`: how long to wait for a slot,
        where not the policy's queue timeout; `since`: the request's first arrival, where it
        waits again (a paused request: at the head of its class)."""
        ticket = next(self._tickets)
        arrival = self._queue.arrive(ticket, priority, self._clock(), since)
        for earlier in arrival.granted:
            self._grant(earlier)
        for victim in arrival.shed:
            if victim != ticket:
                self._refuse(victim, "displaced by higher-priority work")
        if ticket in arrival.shed:
            raise Shed("the queue is full", self._policy.retry_after_s)
        if arrival.admitted:
            return ticket
        admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = admitted
        self._remind()
        try:
            limit = self._policy.queue_timeout_s if timeout_s is None else timeout_s
            await asyncio.wait_for(admitted, limit)
        except TimeoutError:
            # A grant that raced the timeout found the future cancelled and passed the slot on.
            self._queue.leave(ticket)
            raise Shed("timed out waiting for a slot", self._policy.retry_after_s) from None
        except asyncio.CancelledError:
            # The client went away: give up the place, or the slot if it was just granted.
            granted = admitted.done() and not admitted.cancelled() and admitted.exception() is None
            if not self._queue.leave(ticket) and granted:
                self.release(ticket)
            raise
        finally:
            self._waiting.pop(ticket, None)
        return ticket

    def release(self, ticket: int) -> None:
        """A slot freed: `ticket`'s (acquire's), so its class leaves the count."""
        for granted in self._queue.release(self._clock(), ticket):
            self._grant(granted)
        self._remind()

    def _remind(self) -> None:
        """Look at the queue again when the hold-down (`preempt.resume_after_s`) that alone
        holds its waiters ends: no release or arrival may come to do it."""
        due = self._queue.held_until()
        now = self._clock()
        if due is None or due <= now:  # nothing held by it, or what holds them is another test
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a pure caller): its next event looks again
            return
        if self._reminder is not None:
            self._reminder.cancel()
        self._reminder = loop.call_later(due - now, self._due)

    def _due(self) -> None:
        self._reminder = None
        for ticket in self._queue.admit_due(self._clock()):
            self._grant(ticket)
        self._remind()

    def seen_elsewhere(self, running: Mapping[PriorityClass, int]) -> None:
        """What the other routers run on the backend (preemption across routers)."""
        for ticket in self._queue.seen_elsewhere(running, self._clock()):
            self._grant(ticket)
        self._remind()

    def resize(self, cap: int, total: int | None = None) -> None:
        """This router's slots (`cap`) and, with shared slots, the backend's over every router
        (`total`, whose shares the classes hold)."""
        if (cap, total) != (self._queue.cap, self._queue.total):
            for ticket in self._queue.resize(cap, self._clock(), total):
                self._grant(ticket)
            self._remind()  # a new cap or settings: the hold-down may hold them now

    def retune(
        self,
        policy: GatePolicy,
        cap: int,
        max_queue: int,
        aging_s: float,
        shares: Mapping[PriorityClass, float],
        total: int | None = None,
    ) -> None:
        """New settings (a reload; `total` as in `resize`); a waiter's timeout already running
        keeps its length."""
        self._policy = policy
        now = self._clock()
        for ticket in self._queue.retune(cap, max_queue, aging_s, shares, now, total):
            self._grant(ticket)
        self._remind()  # a new cap or settings: the hold-down may hold them now

    def pause(self) -> None:
        self._queue.pause()

    def resume(self) -> None:
        for ticket in self._queue.resume(self._clock()):
            self._grant(ticket)
        self._remind()

    def _grant(self, ticket: int) -> None:
        future = self._waiting.get(ticket)
        if future is not None and not future.done():
            future.set_result(None)
        else:  # the waiter vanished between the decision and now: pass the slot on
            self.release(ticket)

    def _refuse(self, ticket: int, reason: str) -> None:
        future = self._waiting.get(ticket)
        if future is not None and not future.done():
            future.set_exception(Shed(reason, self._policy.retry_after_s))
