"""Make-before-break as a step machine: every path a move can take, on a clock turned by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import replace

from policy.moves import (
    AbandonedBecause,
    Finish,
    MoveFacts,
    MoveLimits,
    MovePlan,
    MoveState,
    Phase,
    Publish,
    ScaleTo,
    Step,
    Wait,
    begin,
    step,
)

PLAN = MovePlan("reasoning", source="reasoning@local", target="reasoning@cloud", replicas=2)
LIMITS = MoveLimits(move_timeout_s=60, drain_timeout_s=20, target_poll_s=1, router_poll_s=0.5)
UP = MoveFacts(target_running=2, target_healthy=True)  # the target RUNNING and HEALTHY


def run(
    facts_at: Callable[[float, MoveState], MoveFacts], plan: MovePlan = PLAN
) -> list[tuple[float, Step]]:
    """Drive a move from t=0 to its Finish: each Wait turns the clock; every step with its time."""
    now, state = 0.0, begin(plan, 0.0)
    steps: list[tuple[float, Step]] = []
    while not steps or not isinstance(steps[-1][1].action, Finish):
        taken = step(state, facts_at(now, state), now, LIMITS)
        steps.append((now, taken))
        state = taken.state
        if isinstance(taken.action, Wait):
            now += taken.action.seconds
        assert now < 1000, "the move never finished"
    return steps


def actions(steps: list[tuple[float, Step]]) -> list[object]:
    """The actions, with runs of Wait folded into one."""
    folded: list[object] = []
    for _, taken in steps:
        if not (isinstance(taken.action, Wait) and folded and folded[-1] == taken.action):
            folded.append(taken.action)
    return folded


def gave_up(steps: list[tuple[float, Step]]) -> list[str]:
    return [what for _, taken in steps for what in taken.gave_up_on]


def test_a_move_raises_the_target_switches_drains_then_drops_the_source() -> None:
    def facts(now: float, state: MoveState) -> MoveFacts:
        return MoveFacts(
            target_running=2 if now >= 5 else 1,
            target_healthy=now >= 5,
            views_applied=now >= 6,  # the routers ack a second after the switch
            source_held=3 if now < 8 else 0,  # and finish the source's last jobs by t=8
        )

    steps = run(facts)
    assert actions(steps) == [
        ScaleTo("reasoning@cloud", 2),
        Wait(1),
        Publish("reasoning", serving="reasoning@cloud", parked="reasoning@local"),
        Wait(0.5),
        ScaleTo("reasoning@local", 0),
        Finish("done", 8.0),
    ]
    assert [now for now, s in steps if isinstance(s.action, Publish)] == [5.0]
    assert [now for now, s in steps if isinstance(s.action, ScaleTo)] == [0.0, 8.0]
    assert gave_up(steps) == []


def test_a_target_never_healthy_is_dropped_and_the_source_never_stops_serving() -> None:
    steps = run(lambda now, state: MoveFacts(target_running=2, target_healthy=False))
    assert actions(steps) == [
        ScaleTo("reasoning@cloud", 2),
        Wait(1),
        ScaleTo("reasoning@cloud", 0),
        Finish("abandoned", 60.0, AbandonedBecause.TARGET_NOT_UP),
    ]
    assert not any(isinstance(s.action, Publish) for _, s in steps)  # no router ever switched


def test_too_few_replicas_running_is_not_up_either() -> None:
    steps = run(lambda now, state: MoveFacts(target_running=1, target_healthy=True))
    assert steps[-1][1].action == Finish("abandoned", 60.0, AbandonedBecause.TARGET_NOT_UP)


def test_a_source_that_never_drains_is_dropped_at_the_drain_timeout() -> None:
    steps = run(lambda now, state: replace(UP, views_applied=True, source_held=1))
    assert actions(steps)[-2:] == [ScaleTo("reasoning@local", 0), Finish("done", 20.0)]
    assert gave_up(steps) == ["reasoning@local drained"]


def test_a_source_already_dead_holds_nothing_so_the_ack_goes_straight_to_dropping_it() -> None:
    steps = run(lambda now, state: replace(UP, views_applied=True, source_held=0))
    assert actions(steps) == [
        ScaleTo("reasoning@cloud", 2),
        Publish("reasoning", serving="reasoning@cloud", parked="reasoning@local"),
        ScaleTo("reasoning@local", 0),
        Finish("done", 0.0),
    ]


def test_routers_that_never_ack_get_the_old_view_back_and_the_target_is_dropped() -> None:
    def facts(now: float, state: MoveState) -> MoveFacts:
        back = state.phase in (Phase.SWITCHING_BACK, Phase.DRAINING_TARGET)
        return replace(
            UP,
            views_applied=back and now >= 22,  # the old view is applied at once
            target_held=1 if now < 23 else 0,  # the target's few jobs finish a second later
        )

    steps = run(facts)
    assert actions(steps) == [
        ScaleTo("reasoning@cloud", 2),
        Publish("reasoning", serving="reasoning@cloud", parked="reasoning@local"),
        Wait(0.5),
        Publish("reasoning", serving="reasoning@local", parked="reasoning@cloud"),
        Wait(0.5),
        ScaleTo("reasoning@cloud", 0),
        Finish("abandoned", 23.0, AbandonedBecause.ROUTERS_NOT_SWITCHED),
    ]
    assert gave_up(steps) == ["routers on reasoning@cloud"]
    assert not any(s.action == ScaleTo("reasoning@local", 0) for _, s in steps)


def test_when_even_the_old_view_is_not_acked_the_target_still_drains_before_it_drops() -> None:
    steps = run(lambda now, state: replace(UP, target_held=1 if now < 50 else 0))
    assert actions(steps)[-2:] == [
        ScaleTo("reasoning@cloud", 0),
        Finish("abandoned", 50.0, AbandonedBecause.ROUTERS_NOT_SWITCHED),
    ]
    assert gave_up(steps) == ["routers on reasoning@cloud", "routers back on reasoning@local"]


def test_the_target_is_watched_only_while_it_comes_up() -> None:
    watched = []

    def facts(now: float, state: MoveState) -> MoveFacts:
        watched.append(state.watches_target)
        return replace(UP, views_applied=True)

    run(facts)
    assert watched == [False, True, False, False]


def test_an_evacuation_empties_the_source_first_and_gives_up_when_its_pool_is_back() -> None:
    evacuation = dataclasses.replace(PLAN, evacuation=True)

    def facts(now: float, state: MoveState) -> MoveFacts:
        return MoveFacts(target_running=0, source_back=now >= 12)

    steps = run(facts, evacuation)
    assert actions(steps) == [
        ScaleTo("reasoning@local", 0),  # nothing serves there: Serve must not restart it
        ScaleTo("reasoning@cloud", 2),
        Wait(1),
        ScaleTo("reasoning@cloud", 0),
        ScaleTo("reasoning@local", 2),  # the pool is back: one engine start there
        Finish("abandoned", 12.0, AbandonedBecause.SOURCE_BACK),
    ]
    # An ordinary move ignores the source: it serves all along.
    assert run(facts)[-1][1].action == Finish("abandoned", 60.0, AbandonedBecause.TARGET_NOT_UP)


def test_an_evacuation_whose_target_comes_up_finishes_like_any_move() -> None:
    evacuation = dataclasses.replace(PLAN, evacuation=True)
    steps = run(lambda now, state: dataclasses.replace(UP, views_applied=True), evacuation)
    assert actions(steps)[0] == ScaleTo("reasoning@local", 0)
    assert steps[-1][1].action == Finish("done", 0.0)
