"""A pool's life when its machines die: healthy, draining, provisioning, failed (pure).

Every interval the cluster manager gathers each pool's facts (its nodes: alive in the GCS, and
whether their probe answered and found the GPUs sound; how the provisioning attempt in flight
ended) and asks `step` what the pool's record becomes, which events to record and what to do.

- **healthy**: some node is alive and sound. A pool with none is `POOL_UNHEALTHY` at once (the
  router's breakers already cover a short outage) and, after `dead_after_s` of it, `draining`.
- **draining**: routers send the pool no new work and the placement actor moves its models to
  the next pool on their lists. A pool with a provisioner goes on to `provisioning` the next
  round; one without stays draining until a node joins.
- **provisioning**: the provisioner is asked for a node (`Provision`), and the pool waits for a
  sound node to join. A failed ask, or no node within `provision_timeout_s` of the ask, is
  retried after `backoff_s * 2**(attempt-1)`; after `max_attempts` the pool is `failed` and
  says why. Nothing relaunches forever.
- From any state, a sound node makes the pool healthy again (`GPU_RECOVERED`, with the seconds
  since detection); models whose home it is go back through the placement actor's restore.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "CancelProvisioning",
    "Event",
    "EventType",
    "NodeFact",
    "PoolFacts",
    "PoolRecord",
    "PoolState",
    "Provision",
    "ProvisionOutcome",
    "RecoveryPolicy",
    "Step",
    "node_fact",
    "step",
    "unhealthy",
]


class PoolState(StrEnum):
    HEALTHY = "healthy"
    DRAINING = "draining"
    PROVISIONING = "provisioning"
    FAILED = "failed"


class EventType(StrEnum):
    POOL_UNHEALTHY = "POOL_UNHEALTHY"
    POOL_DRAINING = "POOL_DRAINING"
    NODE_PROVISIONING = "NODE_PROVISIONING"
    NODE_JOINED = "NODE_JOINED"
    GPU_RECOVERED = "GPU_RECOVERED"
    POOL_FAILED = "POOL_FAILED"


@dataclass(frozen=True)
class NodeFact:
    node_id: str
    alive: bool
    problem: str | None = None  # why this node cannot serve; None when it is sound

    @property
    def sound(self) -> bool:
        return self.alive and self.problem is None


def node_fact(
    node_id: str,
    alive: bool,
    probe_answered: bool,
    needs_gpu: bool,
    has_gpu: bool,
    nvml_error: str | None,
    faults: Sequence[str],
) -> NodeFact:
    """One node's verdict from the GCS and its probe. A pool whose models all run on CPU
    engines needs no GPU; a node with hardware faults is unsound whatever it serves."""
    if not alive:
        return NodeFact(node_id, False, "node is dead")
    if not probe_answered:
        return NodeFact(node_id, True, "probe did not answer")
    if faults:
        return NodeFact(node_id, True, "; ".join(faults))
    if needs_gpu and not has_gpu:
        return NodeFact(node_id, True, nvml_error or "no GPU")
    return NodeFact(node_id, True)


@dataclass(frozen=True)
class ProvisionOutcome:
    """How one provisioning call ended: the node was asked for (`ok`) or not, and why."""

    attempt: int
    ok: bool
    detail: str


@dataclass(frozen=True)
class PoolFacts:
    nodes: tuple[NodeFact, ...] = ()
    outcome: ProvisionOutcome | None = None  # the call that ended since the last round

    @property
    def sound(self) -> tuple[NodeFact, ...]:
        return tuple(n for n in self.nodes if n.sound)

    def problems(self) -> str:
        if not self.nodes:
            return "no node carries the pool's resource"
        return "; ".join(f"{n.node_id[:8]}: {n.problem}" for n in self.nodes if not n.sound)


@dataclass(frozen=True)
class RecoveryPolicy:
    dead_after_s: float
    provision_timeout_s: float
    max_attempts: int
    backoff_s: float
    can_provision: bool  # the pool's provisioner is not `none`

    def retry_delay_s(self, attempt: int) -> float:
        """The backoff after failed attempt `attempt` (1-based)."""
        return self.backoff_s * 2.0 ** (attempt - 1)

    def replacement_budget_s(self) -> float:
        """The longest a replacement can take before the pool is failed: every attempt's
        timeout and the backoffs between them."""
        backoffs = sum(self.retry_delay_s(n) for n in range(1, self.max_attempts))
        return self.max_attempts * self.provision_timeout_s + backoffs


@dataclass(frozen=True)
class PoolRecord:
    state: PoolState = PoolState.HEALTHY
    down_since: float | None = None  # first round with no sound node
    detected_at: float | None = None  # when it was declared dead (draining)
    attempt: int = 0  # provisioning attempts made since detection
    attempt_started: float | None = None  # the attempt in flight (None between attempts)
    next_attempt_at: float | None = None
    reason: str | None = None  # why the pool is not healthy, for the status
    known_nodes: frozenset[str] | None = None  # alive nodes seen; None before the first round


@dataclass(frozen=True)
class Event:
    type: EventType
    detail: str
    seconds: float | None = None  # GPU_RECOVERED: from detection to recovered


@dataclass(frozen=True)
class Provision:
    attempt: int


@dataclass(frozen=True)
class CancelProvisioning:
    attempt: int


@dataclass(frozen=True)
class Step:
    record: PoolRecord
    events: tuple[Event, ...] = ()
    actions: tuple[Provision | CancelProvisioning, ...] = ()


@dataclass
class _Turn:
    """One call of `step`: the record so far and what it has said and asked."""

    record: PoolRecord
    events: list[Event] = field(default_factory=list)
    actions: list[Provision | CancelProvisioning] = field(default_factory=list)

    def become(self, **changes: Any) -> None:
        self.record = replace(self.record, **changes)

    def say(self, type_: EventType, detail: str, seconds: float | None = None) -> None:
        self.events.append(Event(type_, detail, seconds))

    def done(self) -> Step:
        return Step(self.record, tuple(self.events), tuple(self.actions))


def step(record: PoolRecord, facts: PoolFacts, now: float, policy: RecoveryPolicy) -> Step:
    """The pool's record after this round's facts, the events to record and what to do."""
    turn = _Turn(record)
    _note_joined(turn, facts)
    if facts.sound:
        _recovered(turn, facts, now)
        return turn.done()
    _noticed_down(turn, facts, now, policy)
    match turn.record.state:
        case PoolState.DRAINING:
            _after_draining(turn, now, policy)
        case PoolState.PROVISIONING:
            _provisioning(turn, facts, now, policy)
    return turn.done()


def _note_joined(turn: _Turn, facts: PoolFacts) -> None:
    alive = frozenset(n.node_id for n in facts.nodes if n.alive)
    known = turn.record.known_nodes
    if known is not None:
        for node in sorted(alive - known):
            turn.say(EventType.NODE_JOINED, f"node {node} joined")
    turn.become(known_nodes=alive if known is None else known | alive)


def _recovered(turn: _Turn, facts: PoolFacts, now: float) -> None:
    record = turn.record
    if record.state != PoolState.HEALTHY:
        since = record.detected_at if record.detected_at is not None else now
        nodes = ", ".join(sorted(n.node_id for n in facts.sound))
        turn.say(
            EventType.GPU_RECOVERED,
            f"healthy again {now - since:.1f} s after detection (node {nodes})",
            seconds=now - since,
        )
    turn.record = PoolRecord(known_nodes=record.known_nodes)


def _noticed_down(turn: _Turn, facts: PoolFacts, now: float, policy: RecoveryPolicy) -> None:
    record = turn.record
    if record.down_since is None:
        turn.become(down_since=now, reason=facts.problems())
        turn.say(EventType.POOL_UNHEALTHY, facts.problems())
    down_since = turn.record.down_since
    assert down_since is not None
    if record.state == PoolState.HEALTHY and now - down_since >= policy.dead_after_s:
        reason = f"no sound node for {now - down_since:.0f} s: {facts.problems()}"
        turn.become(state=PoolState.DRAINING, detected_at=now, reason=reason)
        turn.say(EventType.POOL_DRAINING, reason)


def _after_draining(turn: _Turn, now: float, policy: RecoveryPolicy) -> None:
    if turn.record.detected_at == now:
        return  # drained this round; provisioning starts on the next
    if not policy.can_provision:
        turn.become(reason="no provisioner (pools[].provisioner: none): waiting for a node to join")
        return
    turn.become(state=PoolState.PROVISIONING)
    _start_attempt(turn, now)


def _start_attempt(turn: _Turn, now: float) -> None:
    attempt = turn.record.attempt + 1
    turn.become(attempt=attempt, attempt_started=now, next_attempt_at=None)
    turn.actions.append(Provision(attempt))
    turn.say(EventType.NODE_PROVISIONING, f"attempt {attempt}: asking the provisioner for a node")


def _provisioning(turn: _Turn, facts: PoolFacts, now: float, policy: RecoveryPolicy) -> None:
    record = turn.record
    if record.attempt_started is None:  # between attempts, backing off
        if record.next_attempt_at is not None and now >= record.next_attempt_at:
            _start_attempt(turn, now)
        return
    outcome = facts.outcome if facts.outcome and facts.outcome.attempt == record.attempt else None
    if outcome is not None and not outcome.ok:
        _attempt_failed(turn, now, policy, f"provisioner failed: {outcome.detail}")
    elif now - record.attempt_started >= policy.provision_timeout_s:
        turn.actions.append(CancelProvisioning(record.attempt))
        why = f"no sound node joined within {policy.provision_timeout_s:.0f} s"
        _attempt_failed(turn, now, policy, why)
    elif outcome is not None:
        turn.become(reason=f"attempt {record.attempt}: {outcome.detail}; waiting for the node")


def _attempt_failed(turn: _Turn, now: float, policy: RecoveryPolicy, why: str) -> None:
    attempt = turn.record.attempt
    if attempt >= policy.max_attempts:
        reason = f"{attempt} provisioning attempts failed; last: {why}"
        turn.become(state=PoolState.FAILED, attempt_started=None, reason=reason)
        turn.say(EventType.POOL_FAILED, reason)
        return
    delay = policy.retry_delay_s(attempt)
    reason = f"attempt {attempt} failed ({why}); retrying in {delay:.0f} s"
    turn.become(attempt_started=None, next_attempt_at=now + delay, reason=reason)


def unhealthy(records: Iterable[tuple[str, PoolRecord]]) -> frozenset[str]:
    """The pools routers and placement keep work away from."""
    return frozenset(pool for pool, r in records if r.state != PoolState.HEALTHY)
