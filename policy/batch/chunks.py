"""How many lines a chunk holds: what the model's backends can run at background priority now
(their caps times the background share, the router's own limit: more would only queue there),
a few rounds of it, so a chunk's commit is rare against its work yet a crash redoes little."""

from __future__ import annotations

__all__ = ["chunk_size"]


def chunk_size(background_slots: int, rounds: int, largest: int) -> int:
    """Lines per chunk for `background_slots` requests at once (at least one line)."""
    return max(1, min(largest, max(1, background_slots) * rounds))
