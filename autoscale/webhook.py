"""Events POSTed to `cluster_manager.webhook_url` as JSON: in order, retried, never blocking.

`send` only queues (the oldest is dropped, with a warning, past `max_pending`); a task of its
own delivers each event, retrying connection errors, 429 and 5xx with exponential backoff up to
`attempts`, then logs and drops it. Any other 4xx is the receiver's final word: not retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

logger = logging.getLogger("ray.serve")

Sleep = Callable[[float], Awaitable[None]]


class WebhookSender:
    def __init__(
        self,
        url: str,
        client: httpx.AsyncClient | None = None,
        attempts: int = 5,
        backoff_s: float = 1.0,
        max_pending: int = 1000,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._url = url
        self._own_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(timeout=10)
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._pending: deque[Mapping[str, Any]] = deque()
        self._max_pending = max_pending
        self._sleep = sleep
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def send(self, event: Mapping[str, Any]) -> None:
        if len(self._pending) >= self._max_pending:
            dropped = self._pending.popleft()
            logger.warning("webhook: %d events pending; dropped %s", self._max_pending, dropped)
        self._pending.append(dict(event))
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._deliver_all())

    async def _deliver_all(self) -> None:
        while True:
            while self._pending:
                await self._deliver(self._pending[0])
                self._pending.popleft()
            self._wake.clear()
            await self._wake.wait()

    async def _deliver(self, event: Mapping[str, Any]) -> None:
        for attempt in range(1, self._attempts + 1):
            try:
                reply = await self._client.post(self._url, json=event)
            except httpx.HTTPError as error:
                why = f"{type(error).__name__}: {error}"
            else:
                if reply.status_code < 400:
                    return
                if reply.status_code != 429 and reply.status_code < 500:
                    status = reply.status_code
                    logger.warning("webhook: %s refused an event (%d)", self._url, status)
                    return
                why = f"HTTP {reply.status_code}"
            if attempt < self._attempts:
                await self._sleep(self._backoff_s * 2 ** (attempt - 1))
        logger.warning("webhook: gave up on an event after %d attempts (%s)", self._attempts, why)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._own_client:
            await self._client.aclose()
