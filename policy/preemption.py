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
  `above_running` or more, a lower class waits (`holds`). A paused request waits at the head of
  its class (it keeps its arrival time), and aging still lifts a waiter a class per `aging_s`,
  so background work under steady user load never stops entirely.
- **Whole answers too.** A whole (non-streamed) chat of a class that may be paused is generated
  as a stream and handed back whole (policy/whole_answer.py), so it pauses the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.config import PreemptConfig
from core.types import PriorityClass

__all__ = [
    "PreemptRules",
    "RunningView",
    "holds",
    "may_be_paused",
    "rules_of",
    "still_pausing",
    "to_pause",
]


@dataclass(frozen=True)
class PreemptRules:
    above_running: int
    above_kv: float | None
    may_pause: Mapping[PriorityClass, int]  # by the arriving class
    max_pauses: int
    protect_last_tokens: int


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
) -> list[int]:
    """The tickets to pause for a request of class `arriving` just admitted (`running`
    includes it), best victims first."""
    excess = len(running) - rules.above_running
    kv_high = rules.above_kv is not None and kv_usage is not None and kv_usage > rules.above_kv
    wanted = min(max(excess, 1 if kv_high else 0), rules.may_pause.get(arriving, 0))
    if wanted <= 0:
        return []
    victims = sorted(
        (r for r in running if _may_pause(r, arriving, rules)),
        key=lambda r: (-r.priority.rank, -r.started),
    )
    return [r.ticket for r in victims[:wanted]]


def holds(
    priority: PriorityClass,
    running_by_class: Mapping[PriorityClass, int],
    rules: PreemptRules,
    kv_usage: float | None = None,
) -> bool:
    """Whether a request of `priority` (a waiter's class as aged) must wait although its class
    has room: a higher class runs on the backend and the batch is at `above_running` already
    (or the KV cache reads above `above_kv`): the same test that paused it, so a paused request
    is not let back in at once."""
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
    return (
        request.priority.rank > arriving.rank
        and request.pausable
        and request.pauses < rules.max_pauses
        and (request.tokens_left is None or request.tokens_left > rules.protect_last_tokens)
    )
