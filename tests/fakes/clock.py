"""A clock turned by hand, for the code that takes its clock as a port: a callable (`now()`), or
`monotonic`, `wall` and `sleep` (deployments.router.adapters.ports, autoscale.ports)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["FakeClock"]


class FakeClock:
    """`now` moves only when a test moves it, or (`advance`) by what the code sleeps. Without
    `advance` a sleep never returns: a background loop's round ends there for good, so each loop
    runs exactly one."""

    def __init__(self, now: float = 1000.0, *, advance: bool = False) -> None:
        self.now = now
        self.sleeps: list[float] = []
        # Run after each sleep that advances (the placer's tests let the routers sync first).
        self.on_tick: list[Callable[[], Awaitable[Any]]] = []
        self._advance = advance

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_800_000_000.0 + self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if not self._advance:
            await asyncio.Event().wait()
        self.now += seconds
        for tick in self.on_tick:
            await tick()
        await asyncio.sleep(0)
