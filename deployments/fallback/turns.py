"""Whose turn it is on the CPU fallback's engine: the lowest priority number first (the
router's class, as `router.engine_priorities` numbers it for vLLM), in arrival order within one,
and a waiter's number falls by one per `aging_s` waited (`router.aging_s`, as in the router's
own queue), so background work is served under a steady stream of users, not starved until the
router gives up on it and blames the fallback.

The engine decodes `width` sequences at once (llama.cpp one; Ollama as many as it was started
with). Requests beyond that used to wait in the engine's own queue, in arrival order, so a
user's request waited behind every background request admitted before it; here they wait in
priority order. A waiter that goes away (its client left) leaves the line.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

__all__ = ["PriorityTurns"]


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
        aging_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
        self._width = width
        self._aging_s = aging_s
        self._clock = clock
        self._holding = 0
        self._waiting: list[_Waiter] = []  # a few at most: the router caps the fallback
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def turn(self, priority: int) -> AsyncIterator[None]:
        """Hold one of the engine's `width` places while the block runs."""
        await self._take(priority)
        try:
            yield
        finally:
            self._give_back()

    async def _take(self, priority: int) -> None:
        if self._holding < self._width and not self._waiting:
            self._holding += 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(priority, self._clock(), next(self._arrivals), granted)
        self._waiting.append(waiter)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._give_back()  # handed the place just as it left: pass it on
            elif waiter in self._waiting:  # (a release may have dropped it already)
                self._waiting.remove(waiter)
            raise

    def _give_back(self) -> None:
        self._holding -= 1
        while self._waiting and self._holding < self._width:
            waiter = min(self._waiting, key=self._rank)
            self._waiting.remove(waiter)
            if not waiter.granted.done():
                self._holding += 1
                waiter.granted.set_result(None)

    def _rank(self, waiter: _Waiter) -> tuple[int, int]:
        """Its number less one per `aging_s` waited, then its arrival."""
        aged = int((self._clock() - waiter.since) / self._aging_s)
        return waiter.priority - aged, waiter.arrival
