"""Whose turn it is on the CPU fallback's engine, by the router's own rule for a backend's cap.

The engine decodes `width` sequences at once (llama.cpp one; llama-server and Ollama as many as
they were started with). Requests beyond that used to wait in the engine's own queue, in
arrival order, so a user's request waited behind every background request admitted before it;
here they wait in the replica, by the priority number the router sends (`request.priority`:
the class's number from `router.engine_priorities`, all 0 with `router.engine_priority` off).

Headroom, as in policy/admission.py: a request numbered n takes a place only while fewer than
`limit(m)` places are held by requests numbered m or worse, for n and every better number m
(its own share and those it counts in), and fewer than `width` in all. The limits are the
classes' shares of the width (`router.class_shares`, `class_limits`), so background holds at
most its share, agents and background together at most agents' share, and a user who arrives
while background holds its share starts at once instead of waiting for a background answer.

Order: a waiter's number falls by one per `aging_s` waited (`router.aging_s`), then arrival.
Aging only orders the line: it never seats a waiter past its own number's limit. A waiter kept
out by its limit does not block a better-numbered one behind it, and a new arrival goes ahead
only where no waiter with room is ahead of it. A waiter that goes away (its client left) leaves
the line. `retune` applies a reload's rules (deployments/fallback/replica.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import MappingProxyType

from core.config import RouterConfig
from core.types import PriorityClass
from policy.admission import class_limits

__all__ = ["PriorityTurns", "TurnRules"]


@dataclass(frozen=True)
class TurnRules:
    """How the line is kept: the aging period, and the places each priority number may hold
    counting the worse numbers (a number not listed may fill the width)."""

    aging_s: float = 10.0
    limits: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.aging_s <= 0:
            raise ValueError(f"aging_s must be above 0, got {self.aging_s}")

    @classmethod
    def of(cls, width: int, router: RouterConfig) -> TurnRules:
        """The router's rules at an engine of `width` places. Classes that share a number
        (all of them, with engine_priority off) share the best one's limit: the engine cannot
        tell them apart, and a user must never be held to background's share."""
        shares = class_limits(width, router.class_shares)
        limits: dict[int, int] = {}
        for cls_ in PriorityClass:
            number = router.engine_priority_of(cls_)
            limits[number] = max(limits.get(number, 0), shares[cls_])
        return cls(router.aging_s, MappingProxyType(limits))

    def limit(self, number: int, width: int) -> int:
        return min(width, self.limits.get(number, width))


@dataclass(eq=False)
class _Waiter:
    priority: int
    since: float
    arrival: int
    granted: asyncio.Future[None] = field(repr=False)


class PriorityTurns:
    def __init__(
        self,
        width: int = 1,
        rules: TurnRules | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
        self._width = width
        self._rules = rules or TurnRules()
        self._clock = clock
        self._held: Counter[int] = Counter()  # places held, by priority number
        self._waiting: list[_Waiter] = []  # a few at most: the router caps the fallback
        self._arrivals = itertools.count()

    @property
    def width(self) -> int:
        return self._width

    @property
    def rules(self) -> TurnRules:
        return self._rules

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def holding(self) -> int:
        return self._held.total()

    def retune(self, rules: TurnRules) -> None:
        """New aging and limits from now (a reload); waiters that fit now are seated. Places
        already held are kept: a lowered limit only holds new ones back."""
        self._rules = rules
        self._seat()

    @asynccontextmanager
    async def turn(self, priority: int) -> AsyncIterator[None]:
        """Hold one of the engine's `width` places while the block runs."""
        await self._take(priority)
        try:
            yield
        finally:
            self._give_back(priority)

    async def _take(self, priority: int) -> None:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(priority, self._clock(), next(self._arrivals), granted)
        # In line first: it goes at once only where it has room and no waiter with room is
        # ahead of it.
        self._waiting.append(waiter)
        self._seat()
        if granted.done():
            return
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._give_back(priority)  # handed the place just as it left: pass it on
            elif waiter in self._waiting:  # (a seating pass may have dropped it already)
                self._waiting.remove(waiter)
            raise

    def _give_back(self, priority: int) -> None:
        self._held[priority] -= 1
        self._seat()

    def _seat(self) -> None:
        """Seat waiters in rank order while places are free, skipping any whose limit is
        full: they do not block better-numbered ones behind them."""
        now = self._clock()
        for waiter in sorted(self._waiting, key=lambda w: self._rank(w, now)):
            if self.holding >= self._width:
                return
            if waiter.granted.done():  # cancelled: its task takes it off the line, or we do
                self._waiting.remove(waiter)
            elif self._has_room(waiter.priority):
                self._waiting.remove(waiter)
                self._held[waiter.priority] += 1
                waiter.granted.set_result(None)

    def _has_room(self, priority: int) -> bool:
        """Room in its own number's limit and in every better number's it counts in (a
        background request in agents' too), as in the router."""
        return all(
            self._held_from(number) < self._rules.limit(number, self._width)
            for number in {priority, *(n for n in self._rules.limits if n < priority)}
        )

    def _held_from(self, number: int) -> int:
        """Places held by `number` and worse."""
        return sum(count for held, count in self._held.items() if held >= number)

    def _rank(self, waiter: _Waiter, now: float) -> tuple[int, int]:
        """Its number less one per `aging_s` waited, then its arrival."""
        aged = int((now - waiter.since) / self._rules.aging_s)
        return waiter.priority - aged, waiter.arrival
