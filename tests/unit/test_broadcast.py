"""The placement view every router replica pulls: versions, acks, drains, on an injected clock."""

from __future__ import annotations

from autoscale.broadcast import STALE_AFTER_S, Broadcast
from core.wire import PlacementView
from tests.fakes.clock import FakeClock

BACKENDS = ("reasoning@local", "reasoning@cloud", "coding@local")


def starting(clock: FakeClock) -> Broadcast:
    homes = {"reasoning": "reasoning@local", "coding": "coding@local"}
    return Broadcast.starting(homes, BACKENDS, clock, version=7)


def test_every_backend_a_role_is_not_placed_on_starts_parked() -> None:
    view = starting(FakeClock()).view
    assert view.version == 7
    assert view.parked == {"reasoning@cloud"}


def test_a_move_places_the_target_parks_the_source_and_needs_every_live_replica() -> None:
    clock = FakeClock()
    broadcast = starting(clock)
    broadcast.report("router-a", 7, {})
    broadcast.report("router-b", 7, {})
    version = broadcast.move("reasoning", "reasoning@local", "reasoning@cloud")
    assert version == 8
    assert broadcast.view.placements["reasoning"] == "reasoning@cloud"
    assert broadcast.view.parked == {"reasoning@local"}
    assert not broadcast.applied(version)
    seen = broadcast.report("router-a", 7, {})
    assert seen.version == 8  # the reply carries the view to apply
    broadcast.report("router-a", 8, {})
    assert not broadcast.applied(version)  # router-b still routes on version 7
    broadcast.report("router-b", 8, {})
    assert broadcast.applied(version)


def test_a_replica_silent_past_the_stale_time_holds_nothing_up() -> None:
    clock = FakeClock()
    broadcast = starting(clock)
    broadcast.report("gone", 7, {"reasoning@local": 3})
    version = broadcast.move("reasoning", "reasoning@local", "reasoning@cloud")
    clock.now += 1
    broadcast.report("alive", version, {"reasoning@local": 1})
    assert not broadcast.applied(version)
    assert broadcast.held("reasoning@local") == 4
    clock.now += STALE_AFTER_S
    broadcast.report("alive", version, {"reasoning@local": 0})
    assert broadcast.applied(version)
    assert broadcast.held("reasoning@local") == 0


def test_the_source_drains_by_the_latest_report_of_each_replica() -> None:
    broadcast = starting(FakeClock())
    version = broadcast.move("reasoning", "reasoning@local", "reasoning@cloud")
    broadcast.report("router-a", version, {"reasoning@local": 2, "coding@local": 5})
    broadcast.report("router-b", version, {"reasoning@local": 1})
    assert broadcast.held("reasoning@local") == 3
    broadcast.report("router-a", version, {"reasoning@local": 0, "coding@local": 5})
    assert broadcast.held("reasoning@local") == 1
    broadcast.report("router-b", version, {"reasoning@local": 0})
    assert broadcast.held("reasoning@local") == 0


def test_moving_back_unparks_the_home_and_parks_the_other_pool() -> None:
    broadcast = starting(FakeClock())
    broadcast.move("reasoning", "reasoning@local", "reasoning@cloud")
    broadcast.move("reasoning", "reasoning@cloud", "reasoning@local")
    assert broadcast.view.placements["reasoning"] == "reasoning@local"
    assert broadcast.view.parked == {"reasoning@cloud"}


def test_records_are_shown_without_a_new_version_and_only_the_latest_kept() -> None:
    broadcast = starting(FakeClock())
    broadcast.moves_kept = 2
    for n in range(3):
        broadcast.record({"n": n})
    assert broadcast.view.version == 7
    assert [(m["n"], m["seq"]) for m in broadcast.view.moves] == [(1, 2), (2, 3)]


def test_the_view_survives_its_trip_through_json() -> None:
    broadcast = starting(FakeClock())
    broadcast.move("reasoning", "reasoning@local", "reasoning@cloud")
    broadcast.record({"kind": "offload"})
    assert PlacementView.from_json(broadcast.view.to_json()) == broadcast.view
