"""A link's state derived from the facts recorded about it, its breaker and KV pressure, on a
clock the tests turn by hand."""

from __future__ import annotations

from policy.breaker import BreakerPolicy, BreakerState, CircuitBreaker
from policy.kv_pressure import KvPolicy, KvPressure
from policy.link_choice import LinkView
from policy.links import Health, LinkFacts, LinkStatus, link_status
from tests.fakes.clock import FakeClock


class Link:
    """What the router keeps per link, as far as its state goes."""

    def __init__(self) -> None:
        self.clock = FakeClock(100.0)
        self.breaker = CircuitBreaker(BreakerPolicy(cooldown_s=10.0), self.clock)
        self.kv = KvPressure(KvPolicy(high=0.9, stale_after_s=5.0))
        self.facts = LinkFacts()

    def status(self) -> LinkStatus:
        return link_status(self.facts, self.breaker, self.kv, self.clock.now)


def test_a_new_link_is_trusted_until_a_reading_says_otherwise() -> None:
    status = Link().status()
    assert status.view() == LinkView(running=True, breaker_passes=True, kv_pressured=False)
    assert not status.troubled
    assert not status.needs_probe
    assert status.reads_kv


def test_no_running_replica_takes_a_link_out_until_serve_reports_one() -> None:
    link = Link()
    link.facts = link.facts.read(Health.NO_REPLICA)
    assert not link.status().running
    assert link.status().troubled
    assert not link.status().reads_kv
    link.facts = link.facts.read(Health.RUNNING)
    assert link.status().running
    assert not link.status().troubled


def test_a_dead_only_replica_is_out_until_a_probe_passes() -> None:
    link = Link()
    link.facts = link.facts.replica_died(at=link.clock.now)
    link.breaker.trip("its only replica died")
    assert link.status().awaiting_recovery
    assert link.status().needs_probe
    for health in (Health.RUNNING, Health.PROBE_FAILED, Health.NO_REPLICA):
        link.facts = link.facts.read(health)  # Serve may count a dead replica RUNNING
        assert not link.status().running
        assert link.status().awaiting_recovery
    link.facts = link.facts.read(Health.PROBE_PASSED)
    assert link.status().running
    assert not link.status().awaiting_recovery


def test_the_placement_actor_vouching_for_a_link_answers_its_death_too() -> None:
    facts = LinkFacts().replica_died(at=1.0).read(Health.PLACED)
    assert facts.replica_died_at is None


def test_a_death_after_a_passed_probe_takes_the_link_out_again() -> None:
    facts = LinkFacts().read(Health.PROBE_PASSED).replica_died(at=2.0)
    assert facts.replica_died_at == 2.0
    assert not link_status(facts, Link().breaker, Link().kv, 2.0).running


def test_a_tripped_link_whose_probe_fails_waits_out_its_cooldown_then_lets_one_through() -> None:
    link = Link()
    link.breaker.trip("no running replica")
    link.facts = link.facts.read(Health.PROBE_FAILED)
    status = link.status()
    assert status.running
    assert status.troubled
    assert status.needs_probe
    assert not status.view().breaker_passes
    link.clock.now += 10.0
    status = link.status()
    assert status.breaker is BreakerState.HALF_OPEN
    assert status.view().breaker_passes


def test_a_parked_link_is_never_chosen_and_never_troubled() -> None:
    link = Link()
    link.facts = link.facts.placed(parked=True).read(Health.NO_REPLICA)
    status = link.status()
    assert not status.view().running
    assert not status.troubled  # at zero replicas on purpose: no health checks for it
    link.facts = link.facts.placed(parked=False).read(Health.RUNNING)
    assert link.status().view().running


def test_kv_pressure_and_a_stale_reading_both_press_on_the_clock() -> None:
    link = Link()
    link.kv.observe(0.95, link.clock.now)
    assert link.status().view().kv_pressured
    link.kv.observe(0.2, link.clock.now)
    assert not link.status().kv_pressured
    link.clock.now += 6.0  # no reading for longer than stale_after_s
    assert link.status().kv_pressured


def test_an_engine_without_kv_readings_is_not_asked_again() -> None:
    link = Link()
    link.facts = link.facts.kv_unobservable()
    assert not link.status().reads_kv
    assert link.status().running
