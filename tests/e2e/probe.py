"""A Serve deployment in front of a real backend that sees what the router sends it.

It counts calls and the most requests it ever had at once (to check caps at the backend), keeps
the last message of each chat it passed (a continuation's partial answer), and it has switches,
in the style of Ray's own test_healthcheck.py: a fault switch (every chat, completion and health
check fails) and a KV-cache reading to report instead of the engine's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray.serve.handle import DeploymentHandle


class Probe:
    def __init__(self, inner: DeploymentHandle) -> None:
        self._stream = inner.options(stream=True)
        self._inner = inner
        self._faulty = False
        self._kv_override: float | None = None
        self.reset_counts()

    def reset_counts(self) -> None:
        self._calls = 0
        self._running = 0
        self._max_running = 0
        self._last_messages: list[dict[str, Any]] = []

    def last_messages(self) -> list[dict[str, Any]]:
        """Each chat's last message since the reset, with whether it was to be continued."""
        return list(self._last_messages)

    def counts(self) -> dict[str, int]:
        return {"calls": self._calls, "running": self._running, "max_running": self._max_running}

    def set_faulty(self, faulty: bool) -> None:
        self._faulty = faulty

    def set_kv_cache_usage(self, usage: float | None) -> None:
        self._kv_override = usage

    async def chat(self, request: Any) -> AsyncIterator[Any]:
        last = dict(request.messages[-1])
        self._last_messages.append({**last, "continue": bool(request.continue_final_message)})
        async for item in self._passed("chat", request):
            yield item

    async def completions(self, request: Any) -> AsyncIterator[Any]:
        async for item in self._passed("completions", request):
            yield item

    async def _passed(self, method: str, request: Any) -> AsyncIterator[Any]:
        self._calls += 1
        self._running += 1
        self._max_running = max(self._max_running, self._running)
        running = True
        try:
            if self._faulty:
                raise RuntimeError("injected fault")
            items = getattr(self._stream, method).remote(request)
            if getattr(request, "stream", False):
                async for item in items:
                    yield item
            else:
                # A whole answer's one item may be the last the router reads: it ends the call
                # and frees the slot without waiting for this generator's end, so the next call
                # could arrive before a `finally` here ran (a cap of 2 read as 3, run of
                # 8f2d521). The engine is done once its items are: counted so, then passed on.
                whole = [item async for item in items]
                self._running -= 1
                running = False
                for item in whole:
                    yield item
        finally:
            if running:
                self._running -= 1

    async def check_health(self) -> None:
        if self._faulty:
            raise RuntimeError("injected fault")
        await self._inner.check_health.remote()

    async def kv_cache_usage(self) -> float | None:
        if self._kv_override is not None:
            return self._kv_override
        usage: float | None = await self._inner.kv_cache_usage.remote()
        return usage

    async def engine_counters(self) -> dict[str, Any] | None:
        counters: dict[str, Any] | None = await self._inner.engine_counters.remote()
        return counters

    async def image_tokens(self, sizes: list[tuple[int, int]]) -> list[int] | None:
        counts: list[int] | None = await self._inner.image_tokens.remote(sizes)
        return counts
