"""What the batch service needs of the gateway: an answer for one line, and how many lines the
line's model can run at background priority at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Answer", "Gateway", "Unreachable"]


class Unreachable(Exception):
    """The gateway did not answer (the app restarting, the ingress replaced): try again."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]
    request_id: str = ""
    retry_after_s: float | None = None
    usage: tuple[int, int] = field(default=(0, 0))  # prompt and completion tokens


class Gateway(Protocol):
    async def answer(self, endpoint: str, body: dict[str, Any], owner: str) -> Answer:
        """The line's request, as `owner`'s key at background priority; Unreachable when the
        gateway gave no answer."""
        ...

    async def background_slots(self, model: str) -> int:
        """Requests the model's backends run at background priority at once, now."""
        ...
