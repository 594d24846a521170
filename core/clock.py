"""Time, as every layer takes it: a `Clock` port for loops and actors, a `Now` for decisions.

Loops and actors reach time through a `Clock` so tests turn it by hand; pure decisions
(policy/) are given `Now`, a reading of the monotonic clock, or the reading itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "Now", "SystemClock"]

Now = Callable[[], float]  # seconds on a monotonic clock


class Clock(Protocol):
    def monotonic(self) -> float:
        """For deadlines, cooldowns and ages."""
        ...

    def wall(self) -> float:
        """For records read elsewhere, against other machines' clocks."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
