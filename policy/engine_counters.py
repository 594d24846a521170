"""A backend's engine counters (preemptions; prefix-cache tokens queried and hit), summed over
its replicas from readings of one replica at a time.

Each vLLM replica counts from its own start; the router reads whichever replica Serve hands
the reading to. So each reading adds what that replica counted since its last one: all of it
the first time (it counted from its start), and all of it again when its counts went back
(its engine restarted).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["MAX_REPLICAS_KEPT", "EngineCounters", "ReplicaTally"]

MAX_REPLICAS_KEPT = 256  # replicas come and go for months; the oldest readings are let go


@dataclass(frozen=True)
class EngineCounters:
    preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of those, found there

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(
            self.preemptions + other.preemptions,
            self.prefix_queries + other.prefix_queries,
            self.prefix_hits + other.prefix_hits,
        )

    def since(self, earlier: EngineCounters) -> EngineCounters:
        """What was counted after `earlier`; all of it where a count went back (a restart)."""
        went_back = (
            self.preemptions < earlier.preemptions
            or self.prefix_queries < earlier.prefix_queries
            or self.prefix_hits < earlier.prefix_hits
        )
        if went_back:
            return self
        return EngineCounters(
            self.preemptions - earlier.preemptions,
            self.prefix_queries - earlier.prefix_queries,
            self.prefix_hits - earlier.prefix_hits,
        )

    @property
    def prefix_hit_rate(self) -> float | None:
        """Hit tokens over queried tokens; None before any prompt was looked up."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


class ReplicaTally:
    """A backend's counters over its replicas, from their readings as they come."""

    def __init__(self) -> None:
        self._last: OrderedDict[str, EngineCounters] = OrderedDict()
        self.total = EngineCounters()

    def read(self, replica: str, counters: EngineCounters) -> EngineCounters:
        """Take in one replica's reading; what it adds to the total."""
        added = counters.since(self._last.pop(replica, EngineCounters()))
        self._last[replica] = counters
        while len(self._last) > MAX_REPLICAS_KEPT:
            self._last.popitem(last=False)
        self.total = self.total + added
        return added
