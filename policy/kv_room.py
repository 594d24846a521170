"""The memory-pressure guard's decision (pure): does a request fit the KV cache free now?

A request needs KV cache for its prompt and every token it may generate. When that is more than
the engine has free while other requests run, the engine could only take it by making them wait
or by preempting them, and an engine near the edge of its memory is where out-of-memory failures
happen. Such a request is refused with the out-of-memory code and goes down its chain to a link
with room. An idle engine takes whatever fits its window: vLLM checked at start that its cache
holds one full window.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KvRoom", "admits"]


@dataclass(frozen=True)
class KvRoom:
    capacity_tokens: int  # KV blocks x block size
    usage: float  # 0..1 after the engine's last step
    running: int  # requests the engine is running

    @property
    def free_tokens(self) -> int:
        return int(self.capacity_tokens * (1.0 - min(max(self.usage, 0.0), 1.0)))


def admits(room: KvRoom | None, needed_tokens: int) -> bool:
    """Whether a request needing `needed_tokens` of KV cache may start now."""
    if room is None or room.running == 0:
        return True
    return needed_tokens <= room.free_tokens
