"""What the ingress uses of a Serve deployment handle, for tests that drive an `Ingress` with a
router of their own: `handle.method.remote(job)` and the stream it gives back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ItemStream:
    """A DeploymentResponseGenerator over fixed items."""

    def __init__(self, items: list[Any]) -> None:
        self._items = iter(items)

    def __aiter__(self) -> ItemStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        pass


class HandleMethod:
    """`handle.<method>`: `.remote(job)` calls `answer(job)`."""

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self._answer = answer

    def remote(self, job: Any) -> Any:
        return self._answer(job)
