"""The Router in the ingress's own process, behind the handle calls the ingress makes.

With `gateway.router_in_ingress` each ingress replica runs a Router instead of calling a router
deployment: a request crosses one Serve hop (ingress -> engine) instead of two, and the job and
its answer are never pickled between them. The ingress keeps its code: `chat_once.remote(job)`,
`options(stream=True).chat.remote(job)` and the rest behave as on a deployment handle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the ingress imports this module whether or not it runs a Router
    from deployments.router.router import Router


class _Unary:
    def __init__(self, method: Callable[..., Awaitable[Any]]) -> None:
        self._method = method

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self._method(*args)


class InProcessStream:
    """A DeploymentResponseGenerator over the Router's own generator: `cancel` closes it, so
    its slot is released and the engine's request aborted, as a cancelled call would."""

    def __init__(self, items: AsyncGenerator[Any, None]) -> None:
        self._items = items
        self._closing: asyncio.Task[None] | None = None

    def __aiter__(self) -> InProcessStream:
        return self

    def __anext__(self) -> Awaitable[Any]:
        return self._items.__anext__()  # the generator's own awaitable: no frame per item

    def cancel(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._items.aclose())


class _Streamed:
    def __init__(self, method: Callable[..., AsyncGenerator[Any, None]]) -> None:
        self._method = method

    def remote(self, *args: Any) -> InProcessStream:
        return InProcessStream(self._method(*args))


class InProcessRouter:
    """What the ingress calls on its router, served by a Router in this process."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.chat = _Streamed(router.chat)
        self.chat_once = _Unary(router.chat_once)
        self.status = _Unary(router.status)
        self.count_tokens = _Unary(router.count_tokens)
        self.metrics_text = _Unary(router.metrics_text)

    def options(self, **_: Any) -> InProcessRouter:
        return self  # `stream=True`: `chat` already streams
