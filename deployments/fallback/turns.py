"""Whose turn it is on the CPU fallback's engine: the lowest priority number first (the
router's class, as `router.engine_priorities` numbers it for vLLM), in arrival order within one.

The engine decodes `width` sequences at once (llama.cpp one; Ollama as many as it was started
with). Requests beyond that used to wait in the engine's own queue, in arrival order, so a
user's request waited behind every background request admitted before it; here they wait in
priority order. A waiter that goes away (its client left) leaves the line.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["PriorityTurns"]


class PriorityTurns:
    def __init__(self, width: int = 1) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
        self._width = width
        self._holding = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap
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
        entry = (priority, next(self._arrivals), granted)
        heapq.heappush(self._waiting, entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._give_back()  # handed the place just as it left: pass it on
            elif entry in self._waiting:  # (a release may have dropped it already)
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
            raise

    def _give_back(self) -> None:
        self._holding -= 1
        while self._waiting and self._holding < self._width:
            _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():
                self._holding += 1
                granted.set_result(None)
