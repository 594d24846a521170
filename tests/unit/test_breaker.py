"""The circuit breaker state machine, on a hand-moved clock."""

from __future__ import annotations

from policy.breaker import BreakerPolicy, BreakerState, CircuitBreaker
from tests.fakes.clock import FakeClock


def breaker(**policy: float) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(BreakerPolicy(**policy), clock), clock  # type: ignore[arg-type]


def test_opens_after_exactly_n_consecutive_failures() -> None:
    b, _ = breaker(failure_threshold=3)
    for _ in range(2):
        assert b.try_acquire()
        b.record_failure()
        assert b.state is BreakerState.CLOSED
    assert b.try_acquire()
    b.record_failure()
    assert b.state is BreakerState.OPEN
    assert not b.try_acquire()


def test_a_success_resets_the_count() -> None:
    b, _ = breaker(failure_threshold=3)
    for outcome in ("fail", "fail", "ok", "fail", "fail"):
        b.try_acquire()
        b.record_failure() if outcome == "fail" else b.record_success()
    assert b.state is BreakerState.CLOSED
    assert b.consecutive_failures == 2


def test_abandoned_requests_prove_nothing() -> None:
    b, _ = breaker(failure_threshold=1)
    b.try_acquire()
    b.record_abandoned()
    assert b.state is BreakerState.CLOSED


def test_half_open_after_cooldown_lets_one_probe_through() -> None:
    b, clock = breaker(failure_threshold=1, cooldown_s=10, half_open_probes=1)
    b.try_acquire()
    b.record_failure()
    clock.now += 9.9
    assert b.state is BreakerState.OPEN
    clock.now += 0.2
    assert b.state is BreakerState.HALF_OPEN
    assert b.try_acquire()
    assert not b.try_acquire()  # the probe slot is taken
    b.record_success()
    assert b.state is BreakerState.CLOSED
    assert b.try_acquire()
    assert b.try_acquire()


def test_a_failed_probe_reopens_with_a_fresh_cooldown() -> None:
    b, clock = breaker(failure_threshold=1, cooldown_s=10)
    b.try_acquire()
    b.record_failure()
    clock.now += 10
    assert b.try_acquire()
    b.record_failure()
    assert b.state is BreakerState.OPEN
    clock.now += 9
    assert b.state is BreakerState.OPEN
    clock.now += 1
    assert b.state is BreakerState.HALF_OPEN


def test_an_abandoned_probe_returns_its_slot() -> None:
    b, clock = breaker(failure_threshold=1, cooldown_s=1)
    b.try_acquire()
    b.record_failure()
    clock.now += 1
    assert b.try_acquire()
    b.record_abandoned()
    assert b.state is BreakerState.HALF_OPEN
    assert b.try_acquire()


def test_health_check_reset_and_trip() -> None:
    b, _ = breaker(failure_threshold=1)
    b.trip("no running replica")
    assert b.state is BreakerState.OPEN
    b.reset()
    assert b.state is BreakerState.CLOSED
    assert [(t.source, t.target) for t in b.transitions] == [
        (BreakerState.CLOSED, BreakerState.OPEN),
        (BreakerState.OPEN, BreakerState.CLOSED),
    ]
    assert b.transitions[0].reason == "no running replica"
