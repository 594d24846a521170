"""Preemption with continuation: which running requests of lower classes a higher-class arrival
pauses, and when a lower class may run again (pure logic).

vLLM's scheduler preempts only when KV blocks run out, never to seat a higher class: once
background sequences run, a user request joins their batch and every decode step serves all of
them (on a CPU engine a step's cost grows with the batch; on a GPU once the batch is
compute-bound or the KV cache is full). So the router pauses some: the engine aborts them, and
each goes on later as the same answer (mid-stream failover's machinery, policy.stream_migration).

- **Who pauses.** A request of class C admitted to a backend whose batch (the requests running
  there, C's included) is larger than `above_running`, or whose KV cache reads above `above_kv`,
  pauses running requests of lower classes until the batch is back at `above_running` (one
  where only the KV cache is high), at most `may_pause[C]` of them: the lowest class first, the
  youngest first within it (the least work is lost).
- **Bounded unfairness.** Never paused: a request paused `max_pauses` times already, one within
  `protect_last_tokens` of its max_tokens, one that cannot be continued (tool calls, n > 1).
- **When it runs again.** While a higher class runs on the backend and the batch is at
  `above_running` or more, a lower class waits (`holds`), and with `resume_after_s` also until
  no higher class has ended for that long (a hold-down: the gaps between users do not resume
  paused answers only to have their text prefilled again in the next user's way). A paused
  request waits at the head of its class (it keeps its arrival time), and aging still lifts a
  waiter a class per `aging_s` past these rules (never past its class's share of the cap:
  policy.admission), so background work under steady user load never stops entirely. An
  answer aging seated is paused like any other of its class.
- **Whole answers too.** A whole (non-streamed) chat of a class that may be paused is generated
  as a stream and handed back whole (policy/whole_answer.py), so it pauses the same way.
- **Across routers.** With several routers sharing a backend's slots (`gateway.shared_slots`),
  each posts its work there to the slot broker (`RouterWork`) and learns the others'. The batch
  it weighs is the backend's (its own running and the others'), a lower class waits while a
  higher one runs at any router, and where a higher class runs at one router and the batch is
  past `above_running`, the others pause their lower-class work (`shared_pauses`: every router
  reckons the same split from the same books, and runs its own part).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.config import PreemptConfig
from core.types import PriorityClass

__all__ = [
    "PreemptRules",
    "RouterWork",
    "RunningView",
    "holds",
    "may_be_paused",
    "pausable_by_class",
    "rules_of",
    "shared_pauses",
    "still_pausing",
    "to_pause",
    "victims",
]


@dataclass(frozen=True)
class PreemptRules:
    above_running: int
    above_kv: float | None
    may_pause: Mapping[PriorityClass, int]  # by the arriving class
    max_pauses: int
    protect_last_tokens: int
    resume_after_s: float = 0.0


def rules_of(config: PreemptConfig) -> PreemptRules | None:
    """The rules `router.preempt` sets; None where preemption is off."""
    if not config.enabled:
        return None
    return PreemptRules(
        above_running=config.above_running,
        above_kv=config.above_kv,
        may_pause=config.may_pause,
        max_pauses=config.max_pauses,
        protect_last_tokens=config.protect_last_tokens,
        resume_after_s=config.resume_after_s,
    )


def may_be_paused(priority: PriorityClass, rules: PreemptRules) -> bool:
    """Whether an arrival of some higher class may pause a request of `priority`."""
    return any(n > 0 and c.rank < priority.rank for c, n in rules.may_pause.items())


@dataclass(frozen=True)
class RunningView:
    """One request running on the backend, as preemption sees it."""

    ticket: int
    priority: PriorityClass  # its own class (aging lifts waiters, not running work)
    started: float  # when it started running here
    pauses: int  # times it was paused already
    tokens_left: int | None  # of its max_tokens, after what it has produced; None: unknown
    pausable: bool  # it can be continued as text


def to_pause(
    running: Sequence[RunningView],
    arriving: PriorityClass,
    rules: PreemptRules,
    kv_usage: float | None = None,
    elsewhere: int = 0,
) -> list[int]:
    """The tickets to pause for a request of class `arriving` just admitted (`running`
    includes it; `elsewhere`: what other routers run on the backend), best victims first."""
    excess = len(running) + elsewhere - rules.above_running
    kv_high = rules.above_kv is not None and kv_usage is not None and kv_usage > rules.above_kv
    wanted = min(max(excess, 1 if kv_high else 0), rules.may_pause.get(arriving, 0))
    return victims(running, arriving, rules, wanted)


def victims(
    running: Sequence[RunningView], arriving: PriorityClass, rules: PreemptRules, wanted: int
) -> list[int]:
    """Up to `wanted` of `running` that `arriving` may pause: the lowest class first, the
    youngest first within it (the least work is lost)."""
    if wanted <= 0:
        return []
    chosen = sorted(
        (r for r in running if _may_pause(r, arriving, rules)),
        key=lambda r: (-r.priority.rank, -r.started),
    )
    return [r.ticket for r in chosen[:wanted]]


@dataclass(frozen=True)
class RouterWork:
    """One router's work on one backend, as it posts it to the slot broker."""

    running: Mapping[PriorityClass, int]  # by base class
    pausable: Mapping[PriorityClass, int]  # of those, what a higher class may pause
    pausing: int = 0  # asked to pause, not paused yet: they leave the batch soon

    @property
    def total(self) -> int:
        return sum(self.running.values())


def pausable_by_class(
    running: Sequence[RunningView], rules: PreemptRules
) -> dict[PriorityClass, int]:
    """How many of `running` some higher class may pause, by class (`RouterWork.pausable`)."""
    counts = dict.fromkeys(PriorityClass, 0)
    for request in running:
        if _pausable(request, rules):
            counts[request.priority] += 1
    return counts


def shared_pauses(
    work: Mapping[str, RouterWork], rules: PreemptRules
) -> dict[str, tuple[PriorityClass, int]]:
    """For higher classes running at other routers: how many of its own requests each router
    pauses, and the class it pauses them for (what it may pause is below that class).

    While the backend's batch (every router's running, less what is already pausing) is past
    `above_running`, requests of classes below the highest one running at another router are
    paused, the lowest class first, spread one at a time over the routers in name order, until
    the batch is back at `above_running`. Every router reckons this from the same books, so
    each runs only its own part. A class that may pause none (`may_pause`) pauses none here."""
    excess = sum(w.total - w.pausing for w in work.values()) - rules.above_running
    # No more than the running requests of the classes that may pause could pause on arrival.
    allowance = sum(
        n * rules.may_pause.get(c, 0) for w in work.values() for c, n in w.running.items()
    )
    excess = min(excess, allowance)
    pauses: dict[str, tuple[PriorityClass, int]] = {}
    if excess <= 0:
        return pauses
    above = {name: _highest_elsewhere(work, name) for name in work}
    for cls in sorted(PriorityClass, key=lambda c: -c.rank):  # the lowest class first
        wants = {
            name: w.pausable.get(cls, 0)
            for name, w in sorted(work.items())
            if (top := above[name]) is not None
            and top.rank < cls.rank
            and rules.may_pause.get(top, 0) > 0
        }
        while excess > 0 and any(wants.values()):
            for name in [n for n, want in wants.items() if want > 0][:excess]:
                wants[name] -= 1
                top = above[name]
                assert top is not None
                pauses[name] = (top, pauses.get(name, (top, 0))[1] + 1)
                excess -= 1
    return pauses


def _highest_elsewhere(work: Mapping[str, RouterWork], router: str) -> PriorityClass | None:
    running = {c for name, w in work.items() if name != router for c, n in w.running.items() if n}
    return min(running, key=lambda c: c.rank, default=None)


def holds(
    priority: PriorityClass,
    running_by_class: Mapping[PriorityClass, int],
    rules: PreemptRules,
    kv_usage: float | None = None,
    held_down: bool = False,
) -> bool:
    """Whether a request of `priority` (a waiter's class as aged) must wait although its class
    has room: a higher class runs on the backend and the batch is at `above_running` already
    (or the KV cache reads above `above_kv`): the same test that paused it, so a paused request
    is not let back in at once. `held_down`: a higher class ended less than `resume_after_s`
    ago (the caller knows when)."""
    if held_down:
        return True
    higher = sum(n for c, n in running_by_class.items() if c.rank < priority.rank)
    if higher == 0:
        return False
    kv_high = rules.above_kv is not None and kv_usage is not None and kv_usage > rules.above_kv
    return kv_high or sum(running_by_class.values()) >= rules.above_running


def still_pausing(
    request: RunningView,
    running_by_class: Mapping[PriorityClass, int],
    rules: PreemptRules,
    kv_usage: float | None = None,
) -> bool:
    """Whether a request asked to pause should still, when it gets to pause (its next item,
    maybe much later): only if it would be held the moment it leaves (the higher class that
    asked may be gone by then)."""
    without = {c: n - (1 if c is request.priority else 0) for c, n in running_by_class.items()}
    return holds(request.priority, without, rules, kv_usage)


def _may_pause(request: RunningView, arriving: PriorityClass, rules: PreemptRules) -> bool:
    return request.priority.rank > arriving.rank and _pausable(request, rules)


def _pausable(request: RunningView, rules: PreemptRules) -> bool:
    """Whether `request` may be paused at all, whoever asks."""
    return (
        request.pausable
        and request.pauses < rules.max_pauses
        and (request.tokens_left is None or request.tokens_left > rules.protect_last_tokens)
    )
