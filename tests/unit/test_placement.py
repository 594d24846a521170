"""The placement decision: offload and restore by free VRAM, with priorities, hysteresis,
cooldowns and the away-time rule, on an injected clock."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from core.types import GIB
from policy.placement import (
    Decision,
    History,
    ModelPlacement,
    Move,
    PlacementPolicy,
    decide,
)

POLICY = PlacementPolicy.from_gb(6, 12, cooldown_s=120, min_away_s=60)
POOLS = ("local", "cloud")


def models(**current: str) -> list[ModelPlacement]:
    """The four roles, home on local, allowed on cloud; `current` moves some of them."""
    priorities = {"orchestrator": 0, "coding": 1, "vision": 2, "reasoning": 3}
    return [
        ModelPlacement(role, p, POOLS, current.get(role, "local")) for role, p in priorities.items()
    ]


def free(local: float | None, cloud: float | None = 40) -> Mapping[str, int | None]:
    def to_bytes(gb: float | None) -> int | None:
        return None if gb is None else int(gb * GIB)

    return {"local": to_bytes(local), "cloud": to_bytes(cloud)}


class Placer:
    """Drives `decide` as the actor does: each move done at once, the history kept by the
    product's own bookkeeping."""

    def __init__(self) -> None:
        self.current = {m.name: m.current for m in models()}
        self.history = History()
        self.moves: list[tuple[float, Move]] = []

    def step(self, now: float, reading: Mapping[str, int | None]) -> Decision:
        decision = decide(reading, models(**self.current), self.history, now, POLICY)
        for move in decision.moves:
            self.current[move.model] = move.target
            self.history = self.history.after_move(move, now)
            self.moves.append((now, move))
        return decision


def test_low_vram_offloads_the_lowest_priority_model_first() -> None:
    decision = decide(free(4), models(), History(), 0, POLICY)
    [move] = decision.moves
    assert (move.model, move.source, move.target, move.kind) == (
        "reasoning",
        "local",
        "cloud",
        "offload",
    )
    assert "P3 reasoning" in move.reason


def test_between_the_thresholds_nothing_moves() -> None:
    assert decide(free(8), models(), History(), 0, POLICY) == Decision()
    away = models(reasoning="cloud")
    assert decide(free(11.9), away, History(left_home_at={"reasoning": 0}), 500, POLICY).moves == ()


def test_p0_never_moves_and_the_pool_says_so() -> None:
    only_orchestrator = [m for m in models() if m.priority == 0]
    decision = decide(free(1), only_orchestrator, History(), 0, POLICY)
    assert decision.moves == ()
    [hold] = decision.holds
    assert "only P0" in hold.reason


def test_no_room_anywhere_stays_put_and_says_why() -> None:
    decision = decide(free(2, cloud=5), models(), History(), 0, POLICY)
    assert decision.moves == ()
    [hold] = decision.holds
    assert hold.pool == "local"
    assert hold.model == "reasoning"
    assert "no pool can take" in hold.reason
    assert "staying" in hold.reason
    # A pool with no reading at all is never a target either.
    assert decide(free(2, cloud=None), models(), History(), 0, POLICY).moves == ()


def test_a_model_comes_back_only_after_the_away_time() -> None:
    away = models(reasoning="cloud")
    history = History(last_change={"local": 0, "cloud": 0}, left_home_at={"reasoning": 0})
    early = decide(free(20), away, history, 59, POLICY)
    assert early.moves == ()
    assert "away 59 of 60 s" in early.holds[0].reason
    # Away long enough, but the pools changed 59 s ago: the cooldown (120 s) still holds it.
    late_history = History(last_change={"local": 1, "cloud": 1}, left_home_at={"reasoning": 0})
    assert decide(free(20), away, late_history, 60, POLICY).moves == ()
    [move] = decide(free(20), away, late_history, 121, POLICY).moves
    assert (move.model, move.source, move.target, move.kind) == (
        "reasoning",
        "cloud",
        "local",
        "restore",
    )


def test_the_highest_priority_model_comes_back_first() -> None:
    away = models(reasoning="cloud", vision="cloud")
    history = History(left_home_at={"reasoning": 0, "vision": 0})
    [move] = decide(free(30), away, history, 1000, POLICY).moves
    assert move.model == "vision"  # P2 before P3; the next round may bring reasoning


def test_one_change_per_pool_per_round_then_the_cooldown() -> None:
    placer = Placer()
    placer.step(0, free(1))
    assert [m.model for _, m in placer.moves] == ["reasoning"]
    still_low = placer.step(30, free(1))  # the pool is still short: it waits out its cooldown
    assert still_low.moves == ()
    assert "cooldown 90 s" in still_low.holds[0].reason
    placer.step(120, free(1))
    assert [m.model for _, m in placer.moves] == ["reasoning", "vision"]


def test_flapping_readings_do_not_make_models_flap() -> None:
    placer = Placer()
    # Free VRAM swings across both thresholds every 15 s for an hour.
    for tick in range(240):
        now = tick * 15.0
        placer.step(now, free(3 if tick % 2 == 0 else 20))
    times = [t for t, _ in placer.moves]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= POLICY.cooldown_s for gap in gaps), gaps
    assert len(placer.moves) <= 3600 / POLICY.cooldown_s + 1
    # Every restore came at least min_away_s after that model's offload.
    left: dict[str, float] = {}
    for now, move in placer.moves:
        if move.kind == "offload":
            left[move.model] = now
        else:
            assert now - left[move.model] >= POLICY.min_away_s


def test_a_steady_drop_then_recovery_moves_out_once_and_back_once() -> None:
    placer = Placer()
    for tick in range(8):  # 2 minutes low
        placer.step(tick * 15.0, free(4))
    for tick in range(8, 40):  # then plenty
        placer.step(tick * 15.0, free(30))
    kinds = [(m.kind, m.model) for _, m in placer.moves]
    assert kinds[0] == ("offload", "reasoning")
    assert ("restore", "reasoning") in kinds
    assert kinds.count(("offload", "reasoning")) == 1


def test_a_move_rests_both_pools_and_the_away_time_runs_from_the_first_offload() -> None:
    offload = Move("reasoning", "local", "cloud", "offload", "")
    onward = Move("reasoning", "cloud", "mesh", "offload", "")
    history = History().after_move(offload, 10).after_move(onward, 200)
    assert history.last_change == {"local": 10, "cloud": 200, "mesh": 200}
    assert history.left_home_at == {"reasoning": 10}
    restore = Move("reasoning", "mesh", "local", "restore", "")
    assert history.after_move(restore, 400).left_home_at == {}


def test_an_abandoned_move_rests_both_pools_and_leaves_the_model_where_it_was() -> None:
    history = History(left_home_at={"vision": 5})
    move = Move("reasoning", "local", "cloud", "offload", "")
    after = history.after_abandoned_move(move, 50)
    assert after == History({"local": 50, "cloud": 50}, {"vision": 5})
    assert decide(free(1), models(), after, 60, POLICY).moves == ()  # both pools cool down


def test_after_a_restart_every_model_away_starts_its_cooldowns_again() -> None:
    homes = {"reasoning": "local", "vision": "local"}
    history = History.resumed(homes, {"reasoning": "cloud", "vision": "local"}, now=7)
    assert history == History({"local": 7, "cloud": 7}, {"reasoning": 7})


def test_a_dead_pool_is_evacuated_at_once_whatever_the_priority_and_cooldown() -> None:
    # Cloud is home here; both pools just changed (cooldown), and the model is P0.
    model = ModelPlacement("reasoning", 0, ("cloud", "local"), "cloud")
    history = History(last_change={"cloud": 0, "local": 0})
    reading = {"cloud": None, "local": int(7 * GIB)}
    decision = decide(reading, [model], history, 1, POLICY, down=frozenset({"cloud"}))
    [move] = decision.moves
    assert (move.source, move.target, move.kind) == ("cloud", "local", "evacuate")


def test_an_evacuation_needs_a_pool_that_is_up_and_has_room() -> None:
    model = ModelPlacement("reasoning", 3, ("cloud", "local"), "cloud")
    cramped = {"cloud": int(40 * GIB), "local": int(5 * GIB)}
    decision = decide(cramped, [model], History(), 0, POLICY, down=frozenset({"cloud"}))
    assert decision.moves == ()
    [hold] = decision.holds
    assert "cloud is down" in hold.reason
    both_down = decide(free(30), [model], History(), 0, POLICY, down=frozenset({"cloud", "local"}))
    assert both_down.moves == ()


def test_nothing_moves_onto_a_down_pool_nor_home_before_it_is_up() -> None:
    # local is short of memory; cloud has room but is down: no offload there.
    assert decide(free(2), models(), History(), 0, POLICY, down=frozenset({"cloud"})).moves == ()
    # Evacuated from home (local) long ago; home has room but is still down: no restore.
    away = [m for m in models(reasoning="cloud") if m.name == "reasoning"]
    history = History(left_home_at={"reasoning": 0})
    assert decide(free(30), away, history, 1000, POLICY, down=frozenset({"local"})).moves == ()
    [move] = decide(free(30), away, history, 1000, POLICY).moves
    assert move.kind == "restore"


def test_an_evacuation_starts_the_away_time_like_an_offload() -> None:
    move = Move("reasoning", "local", "cloud", "evacuate", "local is down")
    after = History().after_move(move, 50)
    assert after.left_home_at == {"reasoning": 50}
