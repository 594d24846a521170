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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from core.types import GIB


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

    role: str
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


@dataclass(frozen=True)
class Move:
    role: str
    source: str
    target: str
    kind: Literal["offload", "restore"]
    reason: str


@dataclass(frozen=True)
class Hold:
    """A pool that needed a change and got none this round, and why."""

    pool: str
    role: str | None
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
) -> Decision:
    """The moves to make now (at most one per pool), and why pools that needed one got none."""
    touched: set[str] = set()
    moves: list[Move] = []
    holds: list[Hold] = []

    def cooling(pool: str) -> float:
        """Seconds of cooldown left on a pool (0 when it may change)."""
        last = history.last_change.get(pool)
        return 0.0 if last is None else max(0.0, policy.cooldown_s - (now - last))

    def can_take(pool: str) -> bool:
        room = free.get(pool)
        return (
            pool not in touched
            and cooling(pool) == 0
            and room is not None
            and room >= policy.restore_above_bytes
        )

    for pool in sorted(p for p, room in free.items() if room is not None):
        room = free[pool]
        assert room is not None
        if room >= policy.offload_below_bytes or pool in touched:
            continue
        on_pool = [m for m in models if m.current == pool]
        here = sorted((m for m in on_pool if m.priority > 0), key=lambda m: (-m.priority, m.role))
        if not on_pool:
            continue  # nothing of ours to move: another tenant is using the memory
        if not here:
            holds.append(Hold(pool, None, f"{_gb(room)} free, but only P0 models run here"))
            continue
        if (left := cooling(pool)) > 0:
            holds.append(Hold(pool, here[0].role, f"{_gb(room)} free; cooldown {left:.0f} s"))
            continue
        move = _offload(here, pool, room, can_take)
        if move is None:
            roles = ", ".join(m.role for m in here)
            holds.append(
                Hold(pool, here[0].role, f"{_gb(room)} free; no pool can take {roles}: staying")
            )
            continue
        moves.append(move)
        touched.update((move.source, move.target))

    for model in sorted((m for m in models if m.away), key=lambda m: (m.priority, m.role)):
        home_room = free.get(model.home)
        if home_room is None or home_room < policy.restore_above_bytes:
            continue
        away_s = now - history.left_home_at.get(model.role, now)
        if away_s < policy.min_away_s:
            reason = (
                f"home has {_gb(home_room)} free; away {away_s:.0f} of {policy.min_away_s:.0f} s"
            )
            holds.append(Hold(model.home, model.role, reason))
            continue
        if not can_take(model.home) or model.current in touched or cooling(model.current) > 0:
            left = max(cooling(model.home), cooling(model.current))
            holds.append(Hold(model.home, model.role, f"restore waits: cooldown {left:.0f} s"))
            continue
        moves.append(
            Move(
                model.role,
                model.current,
                model.home,
                "restore",
                f"{model.home} has {_gb(home_room)} free (restore at "
                f"{_gb(policy.restore_above_bytes)}); away {away_s:.0f} s",
            )
        )
        touched.update((model.current, model.home))
    return Decision(tuple(moves), tuple(holds))


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
                model.role,
                pool,
                target,
                "offload",
                f"{pool} has {_gb(room)} free; P{model.priority} {model.role} is the lowest "
                f"priority there",
            )
    return None
