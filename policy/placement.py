"""Where each model should serve, from free VRAM per pool (pure: readings, state and time in).

Every interval the placement actor reads free VRAM per pool and asks `decide` what to change:

- **Offload**: a pool whose free VRAM is below `offload_below` sheds one model, the one of lowest
  priority there (P3 first; P0 never moves), to the first other pool on that model's list that
  can take it: free VRAM at or above `restore_above` and not in its cooldown.
- **Restore**: a model away from its home pool (the first on its list) goes back once home has
  `restore_above` free again, it has been away `min_away_s`, and neither pool is cooling down;
  highest priority first.
- A pool changes at most once per round and then rests `cooldown_s`; the gap between the two
  thresholds (hysteresis) and the cooldown keep models from flapping between pools.
- A pool below the line with nothing that can move says why (`Hold`): a model stays where it is
  rather than go where there is no room. A pool with no reading is never a target.
- **Evacuate**: a model on a pool the cluster manager declared unhealthy (`down`: its nodes
  died) goes first, whatever its priority and any cooldown, to the first pool on its list that
  is up and has `offload_below` free. Down pools are never a target, and a model comes home
  only once its home is up again (through the usual restore, hysteresis included).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from core.types import GIB

__all__ = ["Decision", "History", "Hold", "ModelPlacement", "Move", "PlacementPolicy", "decide"]


@dataclass(frozen=True)
class PlacementPolicy:
    offload_below_bytes: int
    restore_above_bytes: int
    cooldown_s: float
    min_away_s: float

    @classmethod
    def from_gb(
        cls, offload_below_gb: float, restore_above_gb: float, cooldown_s: float, min_away_s: float
    ) -> PlacementPolicy:
        return cls(int(offload_below_gb * GIB), int(restore_above_gb * GIB), cooldown_s, min_away_s)


@dataclass(frozen=True)
class ModelPlacement:
    """One model: its priority (0 for P0 .. 3 for P3), pools it may use (home first), and the
    pool it serves on now."""

    name: str
    priority: int
    pools: tuple[str, ...]
    current: str

    @property
    def home(self) -> str:
        return self.pools[0]

    @property
    def away(self) -> bool:
        return self.current != self.home


@dataclass(frozen=True)
class History:
    """What earlier moves left behind: when each pool last changed, when each model left home."""

    last_change: Mapping[str, float] = field(default_factory=dict)
    left_home_at: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def resumed(cls, homes: Mapping[str, str], current: Mapping[str, str], now: float) -> History:
        """Carrying on after a restart: the history is gone, so every model away from home
        left it `now` and both its pools changed `now` (every cooldown starts again)."""
        away = {name for name, pool in current.items() if pool != homes[name]}
        last_change = {pool: now for name in away for pool in (homes[name], current[name])}
        return cls(last_change, dict.fromkeys(away, now))

    def after_move(self, move: Move, now: float) -> History:
        """`move` done at `now`: both its pools rest from now; an offload notes when the model
        left home (the first pool it left, if it moves on), a restore forgets it."""
        left_home_at = dict(self.left_home_at)
        if move.kind in ("offload", "evacuate"):
            left_home_at.setdefault(move.model, now)
        else:
            left_home_at.pop(move.model, None)
        return History(self._rested(move, now), left_home_at)

    def after_abandoned_move(self, move: Move, now: float) -> History:
        """A failed attempt rests both pools too: the next try costs another engine start."""
        return History(self._rested(move, now), self.left_home_at)

    def _rested(self, move: Move, now: float) -> dict[str, float]:
        return {**self.last_change, move.source: now, move.target: now}


@dataclass(frozen=True)
class Move:
    model: str
    source: str
    target: str
    kind: Literal["offload", "restore", "evacuate"]
    reason: str


@dataclass(frozen=True)
class Hold:
    """A pool that needed a change and got none this round, and why."""

    pool: str
    model: str | None
    reason: str


@dataclass(frozen=True)
class Decision:
    moves: tuple[Move, ...] = ()
    holds: tuple[Hold, ...] = ()


def _gb(value: int | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.1f} GB"


def decide(
    free: Mapping[str, int | None],
    models: Sequence[ModelPlacement],
    history: History,
    now: float,
    policy: PlacementPolicy,
    down: frozenset[str] = frozenset(),
) -> Decision:
    """The moves to make now (at most one per pool, evacuations aside), and why pools that
    needed one got none. `down`: pools the cluster manager declared unhealthy."""
    round_ = _Round(free, history, now, policy, down)
    for model in sorted((m for m in models if m.current in down), key=lambda m: m.name):
        round_.evacuate(model)
    for pool in sorted(p for p, room in free.items() if room is not None and p not in down):
        round_.offload_from(pool, [m for m in models if m.current == pool])
    for model in sorted((m for m in models if m.away), key=lambda m: (m.priority, m.name)):
        round_.restore(model)
    return Decision(tuple(round_.moves), tuple(round_.holds))


@dataclass
class _Round:
    """One call of `decide`: the facts, and the moves and holds found so far."""

    free: Mapping[str, int | None]
    history: History
    now: float
    policy: PlacementPolicy
    down: frozenset[str] = frozenset()
    touched: set[str] = field(default_factory=set)  # pools already changed this round
    moves: list[Move] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)

    def cooling(self, pool: str) -> float:
        """Seconds of cooldown left on a pool (0 when it may change)."""
        last = self.history.last_change.get(pool)
        return 0.0 if last is None else max(0.0, self.policy.cooldown_s - (self.now - last))

    def can_take(self, pool: str) -> bool:
        room = self.free.get(pool)
        return (
            pool not in self.down
            and pool not in self.touched
            and self.cooling(pool) == 0
            and room is not None
            and room >= self.policy.restore_above_bytes
        )

    def offload_from(self, pool: str, on_pool: Sequence[ModelPlacement]) -> None:
        room = self.free[pool]
        assert room is not None
        if room >= self.policy.offload_below_bytes or pool in self.touched or not on_pool:
            return  # room enough, changed already, or another tenant is using the memory
        here = sorted((m for m in on_pool if m.priority > 0), key=lambda m: (-m.priority, m.name))
        if not here:
            self.holds.append(Hold(pool, None, f"{_gb(room)} free, but only P0 models run here"))
        elif (left := self.cooling(pool)) > 0:
            self.holds.append(Hold(pool, here[0].name, f"{_gb(room)} free; cooldown {left:.0f} s"))
        elif (move := _offload(here, pool, room, self.can_take)) is not None:
            self._make(move)
        else:
            names = ", ".join(m.name for m in here)
            reason = f"{_gb(room)} free; no pool can take {names}: staying"
            self.holds.append(Hold(pool, here[0].name, reason))

    def evacuate(self, model: ModelPlacement) -> None:
        """Off a dead pool now: no cooldown, any priority; room enough not to be offloaded."""
        for pool in model.pools:
            room = self.free.get(pool)
            if pool in self.down or room is None or room < self.policy.offload_below_bytes:
                continue
            reason = f"{model.current} is down; {pool} has {_gb(room)} free"
            self.moves.append(Move(model.name, model.current, pool, "evacuate", reason))
            self.touched.update((model.current, pool))
            return
        reason = f"{model.current} is down and no pool on {model.name}'s list is up with room"
        self.holds.append(Hold(model.current, model.name, reason))

    def restore(self, model: ModelPlacement) -> None:
        home_room = self.free.get(model.home)
        if model.current in self.down or model.home in self.down:
            return  # evacuated above, or home is not back yet
        if home_room is None or home_room < self.policy.restore_above_bytes:
            return
        away_s = self.now - self.history.left_home_at.get(model.name, self.now)
        if away_s < self.policy.min_away_s:
            reason = (
                f"home has {_gb(home_room)} free; away {away_s:.0f} of "
                f"{self.policy.min_away_s:.0f} s"
            )
            self.holds.append(Hold(model.home, model.name, reason))
        elif (
            not self.can_take(model.home)
            or model.current in self.touched
            or self.cooling(model.current) > 0
        ):
            left = max(self.cooling(model.home), self.cooling(model.current))
            self.holds.append(Hold(model.home, model.name, f"restore waits: cooldown {left:.0f} s"))
        else:
            reason = (
                f"{model.home} has {_gb(home_room)} free (restore at "
                f"{_gb(self.policy.restore_above_bytes)}); away {away_s:.0f} s"
            )
            self._make(Move(model.name, model.current, model.home, "restore", reason))

    def _make(self, move: Move) -> None:
        self.moves.append(move)
        self.touched.update((move.source, move.target))


def _offload(
    candidates: Sequence[ModelPlacement],
    pool: str,
    room: int,
    can_take: Callable[[str], bool],
) -> Move | None:
    for model in candidates:
        target = next((p for p in model.pools if p != pool and can_take(p)), None)
        if target is not None:
            return Move(
                model.name,
                pool,
                target,
                "offload",
                f"{pool} has {_gb(room)} free; P{model.priority} {model.name} is the lowest "
                f"priority there",
            )
    return None
