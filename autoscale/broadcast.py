"""Where each model serves, as every router replica must see it: published by the placement actor,
pulled by the routers.

A Serve handle call reaches one replica, so the placement actor cannot tell "the router" to switch;
with `gateway.router_replicas` > 1 (or a router replica restarted after a move) some replica
would keep sending work to a pool being scaled to zero. Instead each router replica asks the
actor every `SYNC_INTERVAL_S` for the current view, applies it, and reports the version it
applied and the jobs it holds per backend (being fitted, queued or in flight). A move goes on
only when every router replica that reported recently has applied the new view, and drains until
they all report nothing held on the source.

Pure: no Ray here; the actor (`placer.py`) and the router carry it out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.wire import PlacementView

# A replica silent this long is gone (restarted, scaled down): three times a sync's own timeout,
# so a slow replica still counts. The actor also waits this long after (re)starting before it
# moves anything, so every router replica has reported to it.
STALE_AFTER_S = 15.0


@dataclass(frozen=True)
class Report:
    version: int  # the latest view the replica applied
    held: Mapping[str, int]  # jobs per backend (fitted, queued or in flight) when it reported
    at: float


@dataclass
class Broadcast:
    """The placement actor's side: the view to publish and what the router replicas reported."""

    view: PlacementView
    clock: Callable[[], float]
    moves_kept: int = 20
    reports: dict[str, Report] = field(default_factory=dict)

    @classmethod
    def starting(
        cls,
        placements: Mapping[str, str],
        backends: Iterable[str],
        clock: Callable[[], float],
        version: int = 1,
    ) -> Broadcast:
        """Each model on its backend in `placements`; every other backend parked (the CPU
        fallback is not a model's backend: leave it out of `backends`)."""
        parked = frozenset(b for b in backends if b not in placements.values())
        return cls(PlacementView(version, dict(placements), parked), clock)

    def move(self, model: str, source: str, target: str) -> int:
        """Publish: the model's new work goes to `target`, `source` is parked. The new version."""
        placements = {**self.view.placements, model: target}
        parked = (self.view.parked - {target}) | {source}
        self.view = PlacementView(self.view.version + 1, placements, parked, self.view.moves)
        return self.view.version

    def record(self, move: dict[str, Any]) -> None:
        """Add a move's record to what the routers show and count (its `seq` numbers the moves
        from 1); not a new version (nothing to apply)."""
        seq = self.view.moves[-1]["seq"] + 1 if self.view.moves else 1
        moves = (*self.view.moves, {**move, "seq": move.get("seq", seq)})[-self.moves_kept :]
        self.view = PlacementView(self.view.version, self.view.placements, self.view.parked, moves)

    def report(self, replica: str, version: int, held: Mapping[str, int]) -> PlacementView:
        """A router replica's sync: note what it applied and holds; answer the current view."""
        self.reports[replica] = Report(version, dict(held), self.clock())
        return self.view

    def _live(self) -> list[Report]:
        now = self.clock()
        return [r for r in self.reports.values() if now - r.at <= STALE_AFTER_S]

    def applied(self, version: int) -> bool:
        """Every live router replica has applied `version`. With none live (none has routed
        since the actor started `STALE_AFTER_S` ago), nobody holds an older view: a router
        replica waits for its first sync before it routes."""
        return all(r.version >= version for r in self._live())

    def held(self, backend: str) -> int:
        """Jobs the live router replicas last said they held on `backend`."""
        return sum(r.held.get(backend, 0) for r in self._live())
