"""The pool recovery state machine, driven round by round on a hand-turned clock."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policy.pool_health import (
    CancelProvisioning,
    EventType,
    NodeFact,
    PoolFacts,
    PoolRecord,
    PoolState,
    Provision,
    ProvisionOutcome,
    RecoveryPolicy,
    Step,
    node_fact,
    step,
    unhealthy,
)

POLICY = RecoveryPolicy(
    dead_after_s=30, provision_timeout_s=300, max_attempts=3, backoff_s=10, can_provision=True
)
SOUND = PoolFacts((NodeFact("n1", alive=True),))
DEAD = PoolFacts((NodeFact("n1", alive=False, problem="node is dead"),))


def run(
    facts_by_time: Sequence[tuple[float, PoolFacts]],
    policy: RecoveryPolicy = POLICY,
    record: PoolRecord | None = None,
) -> list[tuple[float, Step]]:
    record = record if record is not None else step(PoolRecord(), SOUND, 0, policy).record
    steps = []
    for now, facts in facts_by_time:
        result = step(record, facts, now, policy)
        record = result.record
        steps.append((now, result))
    return steps


def events(steps: list[tuple[float, Step]]) -> list[tuple[float, EventType]]:
    return [(now, e.type) for now, s in steps for e in s.events]


def test_a_healthy_pool_stays_quiet() -> None:
    steps = run([(t, SOUND) for t in range(0, 100, 5)])
    assert events(steps) == []
    assert steps[-1][1].record.state == PoolState.HEALTHY


def test_the_first_round_learns_the_nodes_without_calling_them_new() -> None:
    first = step(PoolRecord(), SOUND, 0, POLICY)
    assert first.events == ()
    assert first.record.known_nodes == frozenset({"n1"})


def test_a_short_outage_is_only_unhealthy() -> None:
    steps = run([(5, DEAD), (10, DEAD), (15, SOUND)])
    assert events(steps) == [(5, EventType.POOL_UNHEALTHY)]
    assert [s.record.state for _, s in steps] == [PoolState.HEALTHY] * 3
    assert steps[-1][1].record.down_since is None


def test_dead_for_dead_after_s_drains_then_provisions() -> None:
    steps = run([(t, DEAD) for t in range(5, 50, 5)])
    states = {now: s.record.state for now, s in steps}
    assert states[30] == PoolState.HEALTHY  # down since 5: 25 s
    assert states[35] == PoolState.DRAINING
    assert states[40] == PoolState.PROVISIONING
    assert events(steps) == [
        (5, EventType.POOL_UNHEALTHY),
        (35, EventType.POOL_DRAINING),
        (40, EventType.NODE_PROVISIONING),
    ]
    actions = [(now, a) for now, s in steps for a in s.actions]
    assert actions == [(40, Provision(1))]


def provisioning_record() -> PoolRecord:
    steps = run([(5, DEAD), (35, DEAD), (40, DEAD)])
    record = steps[-1][1].record
    assert record.state == PoolState.PROVISIONING
    return record


def test_a_joined_sound_node_recovers_the_pool_and_says_how_long_it_took() -> None:
    record = provisioning_record()
    asked = PoolFacts(DEAD.nodes, ProvisionOutcome(1, ok=True, detail="node asked for"))
    replaced = PoolFacts((*DEAD.nodes, NodeFact("n2", alive=True)))
    steps = run([(45, asked), (100, replaced)], record=record)
    assert steps[0][1].record.state == PoolState.PROVISIONING
    assert "node asked for" in (steps[0][1].record.reason or "")
    last = steps[-1][1]
    assert [e.type for e in last.events] == [EventType.NODE_JOINED, EventType.GPU_RECOVERED]
    assert "65.0 s after detection" in last.events[1].detail
    assert last.record.state == PoolState.HEALTHY
    assert last.record.attempt == 0
    assert unhealthy([("cloud", last.record)]) == frozenset()


def test_a_node_that_joins_unsound_does_not_recover_the_pool() -> None:
    record = provisioning_record()
    faulty = PoolFacts((NodeFact("n2", alive=True, problem="Xid 79 on GPU 0"),))
    result = step(record, faulty, 60, POLICY)
    assert [e.type for e in result.events] == [EventType.NODE_JOINED]
    assert result.record.state == PoolState.PROVISIONING


def test_failed_attempts_back_off_then_the_pool_fails_and_says_why() -> None:
    record = provisioning_record()  # attempt 1 started at 40
    rounds: list[tuple[float, PoolFacts]] = [
        (45, PoolFacts(DEAD.nodes, ProvisionOutcome(1, ok=False, detail="exit 3: quota"))),
        (50, DEAD),  # backing off 10 s
        (55, DEAD),  # attempt 2
        (60, PoolFacts(DEAD.nodes, ProvisionOutcome(2, ok=False, detail="exit 3: quota"))),
        (75, DEAD),  # backing off 20 s
        (80, DEAD),  # attempt 3
        (85, PoolFacts(DEAD.nodes, ProvisionOutcome(3, ok=False, detail="exit 3: quota"))),
        (500, DEAD),
    ]
    steps = run(rounds, record=record)
    actions = [(now, a) for now, s in steps for a in s.actions]
    assert actions == [(55, Provision(2)), (80, Provision(3))]
    final = steps[-1][1].record
    assert final.state == PoolState.FAILED
    assert "3 provisioning attempts failed" in (final.reason or "")
    assert "quota" in (final.reason or "")
    assert events(steps)[-1] == (85, EventType.POOL_FAILED)


def test_an_attempt_with_no_node_in_time_is_cancelled_and_retried() -> None:
    record = provisioning_record()  # attempt 1 started at 40, timeout 300
    asked = PoolFacts(DEAD.nodes, ProvisionOutcome(1, ok=True, detail="asked"))
    steps = run([(45, asked), (339, DEAD), (340, DEAD), (350, DEAD)], record=record)
    actions = [(now, a) for now, s in steps for a in s.actions]
    assert actions == [(340, CancelProvisioning(1)), (350, Provision(2))]


def test_a_late_outcome_of_an_earlier_attempt_is_ignored() -> None:
    record = provisioning_record()
    stale = PoolFacts(DEAD.nodes, ProvisionOutcome(0, ok=False, detail="old"))
    result = step(record, stale, 45, POLICY)
    assert result.record.attempt_started == 40
    assert result.actions == ()


def test_a_pool_without_a_provisioner_is_drained_and_waits() -> None:
    policy = RecoveryPolicy(30, 300, 3, 10, can_provision=False)
    steps = run([(t, DEAD) for t in range(5, 200, 5)], policy=policy)
    final = steps[-1][1].record
    assert final.state == PoolState.DRAINING
    assert "no provisioner" in (final.reason or "")
    assert all(s.actions == () for _, s in steps)
    back = step(final, SOUND, 205, policy)
    assert back.record.state == PoolState.HEALTHY
    assert [e.type for e in back.events] == [EventType.GPU_RECOVERED]


def test_a_failed_pool_recovers_when_a_node_joins_by_hand() -> None:
    failed = PoolRecord(state=PoolState.FAILED, detected_at=10, known_nodes=frozenset({"n1"}))
    result = step(failed, PoolFacts((NodeFact("n9", alive=True),)), 100, POLICY)
    assert result.record.state == PoolState.HEALTHY
    assert unhealthy([("cloud", failed)]) == frozenset({"cloud"})


@pytest.mark.parametrize(
    ("alive", "answered", "needs_gpu", "has_gpu", "faults", "problem"),
    [
        (False, True, True, True, (), "node is dead"),
        (True, False, True, True, (), "probe did not answer"),
        (True, True, True, False, (), "no GPU"),
        (True, True, False, False, (), None),
        (True, True, False, False, ("Xid 79 on GPU 0",), "Xid 79 on GPU 0"),
        (True, True, True, True, (), None),
    ],
)
def test_node_verdicts(
    alive: bool,
    answered: bool,
    needs_gpu: bool,
    has_gpu: bool,
    faults: tuple[str, ...],
    problem: str | None,
) -> None:
    fact = node_fact("n", alive, answered, needs_gpu, has_gpu, None, faults)
    assert fact.problem == problem
    assert fact.sound == (problem is None)


def test_a_replacements_budget_is_every_attempt_and_the_backoffs_between_them() -> None:
    policy = RecoveryPolicy(10, 120, 3, 5, can_provision=True)
    assert [policy.retry_delay_s(n) for n in (1, 2, 3)] == [5, 10, 20]
    assert policy.replacement_budget_s() == 3 * 120 + 5 + 10  # no backoff after the last
