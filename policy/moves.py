"""Make-before-break, one step at a time (pure: the move's state, facts and the clock in).

A model moves from its source backend to a target backend without losing a request:

1. ask for its replicas on the target and wait until they are RUNNING and the deployment
   HEALTHY; past `move_timeout_s` the target is asked back to zero and the move abandoned (the
   source never stopped serving);
2. publish the view that sends the model's new work to the target and parks the source, and wait
   until every router replica has applied it; past `drain_timeout_s` the old view is published
   again, the target drained and asked back to zero, and the move abandoned;
3. wait until the router replicas hold nothing on the source, queued or in flight (up to
   `drain_timeout_s`: past it the source is dropped anyway), then ask the source for zero.

An evacuation (off a pool whose nodes died) goes straight to the target: nothing serves on the
source, so it is asked for zero first (else Serve would restart its replicas on the first node
that joins the pool, racing the target for the same start). If the source's pool is healthy
again before the target is up, the evacuation is given up: the target asked back to zero and
the source asked for its replicas again, one engine start instead of a move there and back.

`step` answers the one thing to do next and the state after it. The placement actor gathers the
facts the state waits on, carries the action out, and asks again until the answer is `Finish`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

__all__ = [
    "AbandonedBecause",
    "Action",
    "Finish",
    "MoveFacts",
    "MoveLimits",
    "MovePlan",
    "MoveState",
    "Phase",
    "Publish",
    "ScaleTo",
    "Step",
    "Wait",
    "begin",
    "step",
]


@dataclass(frozen=True)
class MoveLimits:
    move_timeout_s: float  # for the target to be RUNNING and HEALTHY
    drain_timeout_s: float  # for each wait on the router replicas (acks, drains)
    target_poll_s: float  # between looks at the target's deployment status
    router_poll_s: float  # between looks at the router replicas' reports


@dataclass(frozen=True)
class MovePlan:
    """What moves: a model's `replicas` from the `source` backend to the `target` (`model@pool`)."""

    model: str
    source: str
    target: str
    replicas: int
    evacuation: bool = False  # off a pool the cluster manager declared down: straight over


class Phase(Enum):
    STARTING = "starting"
    RAISING_TARGET = "raising target"  # an evacuation's source is at zero; now the target
    RAISING_SOURCE = "raising source"  # an evacuation given up: the source's pool is back
    TARGET_COMING_UP = "target coming up"
    SWITCHING = "switching"  # the new view is published; waiting for every router's ack
    DRAINING_SOURCE = "draining source"
    SWITCHING_BACK = "switching back"  # the old view is published again
    DRAINING_TARGET = "draining target"
    DONE = "done"
    ABANDONED = "abandoned"


class AbandonedBecause(Enum):
    TARGET_NOT_UP = "the target did not come up in time"
    ROUTERS_NOT_SWITCHED = "not every router replica switched in time"
    SOURCE_BACK = "the source's pool recovered before the target came up"


@dataclass(frozen=True)
class MoveState:
    plan: MovePlan
    started_at: float
    phase: Phase = Phase.STARTING
    deadline: float = float("inf")  # when the current wait gives up
    abandoned_because: AbandonedBecause | None = None

    @property
    def watches_target(self) -> bool:
        """The next step needs the target's deployment status (the other facts are cheap)."""
        return self.phase is Phase.TARGET_COMING_UP

    def entering(self, phase: Phase, deadline: float = float("inf")) -> MoveState:
        return dataclasses.replace(self, phase=phase, deadline=deadline)

    def abandoning(self, because: AbandonedBecause) -> MoveState:
        return dataclasses.replace(self.entering(Phase.ABANDONED), abandoned_because=because)


@dataclass(frozen=True)
class MoveFacts:
    """What the state waits on, read just before the step."""

    target_running: int = 0  # replicas RUNNING on the target (read only while it comes up)
    target_healthy: bool = False
    source_back: bool = False  # an evacuation's source pool is healthy again
    views_applied: bool = False  # every live router replica applied the latest published view
    source_held: int = 0  # jobs the router replicas hold on the source
    target_held: int = 0


@dataclass(frozen=True)
class ScaleTo:
    backend: str
    replicas: int


@dataclass(frozen=True)
class Publish:
    """A new view: the model's new work goes to `serving`, `parked` takes none."""

    model: str
    serving: str
    parked: str


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class Finish:
    outcome: Literal["done", "abandoned"]
    seconds: float  # since the move started, to a tenth
    because: AbandonedBecause | None = None


Action = ScaleTo | Publish | Wait | Finish


@dataclass(frozen=True)
class Step:
    action: Action
    state: MoveState
    gave_up_on: tuple[str, ...] = ()  # waits cut short by their deadline on the way here


def begin(plan: MovePlan, now: float) -> MoveState:
    return MoveState(plan, started_at=now)


def step(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    """The next action for a move in `state`, given `facts` read at `now`."""
    return _BY_PHASE[state.phase](state, facts, now, limits)


def _starting(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    plan = state.plan
    if plan.evacuation:
        return Step(ScaleTo(plan.source, 0), state.entering(Phase.RAISING_TARGET))
    return _raising_target(state, facts, now, limits)


def _raising_target(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    plan = state.plan
    coming_up = state.entering(Phase.TARGET_COMING_UP, now + limits.move_timeout_s)
    return Step(ScaleTo(plan.target, plan.replicas), coming_up)


def _target_coming_up(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    plan = state.plan
    if now >= state.deadline:
        return Step(ScaleTo(plan.target, 0), state.abandoning(AbandonedBecause.TARGET_NOT_UP))
    if plan.evacuation and facts.source_back:
        return Step(ScaleTo(plan.target, 0), state.entering(Phase.RAISING_SOURCE))
    if facts.target_running >= plan.replicas and facts.target_healthy:
        switching = state.entering(Phase.SWITCHING, now + limits.drain_timeout_s)
        return Step(Publish(plan.model, plan.target, plan.source), switching)
    return Step(Wait(limits.target_poll_s), state)


def _raising_source(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    plan = state.plan
    return Step(ScaleTo(plan.source, plan.replicas), state.abandoning(AbandonedBecause.SOURCE_BACK))


def _switching(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    plan = state.plan
    if facts.views_applied:
        draining = state.entering(Phase.DRAINING_SOURCE, now + limits.drain_timeout_s)
        return step(draining, facts, now, limits)  # the drain may be over already
    if now >= state.deadline:
        back = state.entering(Phase.SWITCHING_BACK, now + limits.drain_timeout_s)
        gave_up = (f"routers on {plan.target}",)
        return Step(Publish(plan.model, plan.source, plan.target), back, gave_up)
    return Step(Wait(limits.router_poll_s), state)


def _switching_back(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    if facts.views_applied or now >= state.deadline:
        draining = state.entering(Phase.DRAINING_TARGET, now + limits.drain_timeout_s)
        after = step(draining, facts, now, limits)
        if facts.views_applied:
            return after
        gave_up = (f"routers back on {state.plan.source}", *after.gave_up_on)
        return dataclasses.replace(after, gave_up_on=gave_up)
    return Step(Wait(limits.router_poll_s), state)


def _draining_source(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    done = state.entering(Phase.DONE)
    return _drain(state, facts.source_held, state.plan.source, now, limits, done)


def _draining_target(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    abandoned = state.abandoning(AbandonedBecause.ROUTERS_NOT_SWITCHED)
    return _drain(state, facts.target_held, state.plan.target, now, limits, abandoned)


def _drain(
    state: MoveState, held: int, backend: str, now: float, limits: MoveLimits, then: MoveState
) -> Step:
    """Ask `backend` for zero once nothing is held on it, or once the wait is over; `then`."""
    if held == 0:
        return Step(ScaleTo(backend, 0), then)
    if now >= state.deadline:
        return Step(ScaleTo(backend, 0), then, (f"{backend} drained",))
    return Step(Wait(limits.router_poll_s), state)


def _finished(state: MoveState, facts: MoveFacts, now: float, limits: MoveLimits) -> Step:
    outcome: Literal["done", "abandoned"] = "done" if state.phase is Phase.DONE else "abandoned"
    seconds = round(now - state.started_at, 1)
    return Step(Finish(outcome, seconds, state.abandoned_because), state)


_BY_PHASE: dict[Phase, Callable[[MoveState, MoveFacts, float, MoveLimits], Step]] = {
    Phase.STARTING: _starting,
    Phase.RAISING_TARGET: _raising_target,
    Phase.RAISING_SOURCE: _raising_source,
    Phase.TARGET_COMING_UP: _target_coming_up,
    Phase.SWITCHING: _switching,
    Phase.DRAINING_SOURCE: _draining_source,
    Phase.SWITCHING_BACK: _switching_back,
    Phase.DRAINING_TARGET: _draining_target,
    Phase.DONE: _finished,
    Phase.ABANDONED: _finished,
}
