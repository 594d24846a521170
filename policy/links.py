"""What state a failover link is in, derived from what has been recorded about it (pure).

The router records facts as they arrive: the last health reading, its only replica dying,
placement parking it, load putting it to sleep, its engine having no KV reading to give, the
cluster manager declaring its pool down. Whether the link runs, awaits
recovery or is worth a health check is computed from those facts, with its breaker and KV
pressure, never stored beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from policy.breaker import BreakerState, CircuitBreaker
from policy.kv_pressure import KvPressure
from policy.link_choice import LinkView

__all__ = ["Health", "LinkFacts", "LinkStatus", "link_status"]


class Health(StrEnum):
    """One health reading of a link."""

    NO_REPLICA = "no_replica"  # Serve reports no RUNNING replica
    PROBE_FAILED = "probe_failed"  # replicas RUNNING, but a troubled link's probe failed
    PROBE_PASSED = "probe_passed"
    PLACED = "placed"  # the placement actor saw it RUNNING and healthy before moving work here
    RUNNING = "running"  # replicas RUNNING and nothing troubled to probe

    @property
    def vouches(self) -> bool:
        """The link was seen answering: a replica death before this is answered."""
        return self in {Health.PROBE_PASSED, Health.PLACED}


@dataclass(frozen=True)
class LinkFacts:
    health: Health | None = None  # the last reading; None until the first
    replica_died_at: float | None = None  # its only replica died, and nothing vouched since
    parked: bool = False  # at zero replicas on purpose, or draining on its way there
    # At zero by load (idle past scale_to_zero_after_s), or waking from there: not a fault.
    asleep: bool = False
    kv_observable: bool = True  # False once the engine said it has no KV reading to give
    pool_down: bool = False  # the cluster manager declared its pool unhealthy (nodes died)

    def read(self, health: Health) -> LinkFacts:
        died = None if health.vouches else self.replica_died_at
        return replace(self, health=health, replica_died_at=died)

    def replica_died(self, at: float) -> LinkFacts:
        return replace(self, replica_died_at=at)

    def placed(self, parked: bool) -> LinkFacts:
        return replace(self, parked=parked)

    def slept(self, asleep: bool) -> LinkFacts:
        return replace(self, asleep=asleep)

    def kv_unobservable(self) -> LinkFacts:
        return replace(self, kv_observable=False)

    def on_pool(self, down: bool) -> LinkFacts:
        return replace(self, pool_down=down)


@dataclass(frozen=True)
class LinkStatus:
    running: bool  # not known to be down (a link is trusted until a reading says otherwise)
    awaiting_recovery: bool  # its only replica died: out until a probe passes
    parked: bool
    asleep: bool
    # Asleep, it takes requests that wait for it to wake (else they go down the chain).
    waits_when_asleep: bool
    pool_down: bool
    breaker: BreakerState
    breaker_passes: bool
    kv_pressured: bool
    kv_observable: bool

    @property
    def needs_probe(self) -> bool:
        """Serve's RUNNING is not enough: only a passed probe brings this link back."""
        return self.awaiting_recovery or self.breaker is not BreakerState.CLOSED

    @property
    def troubled(self) -> bool:
        """Down, recovering or tripped (and not parked or asleep, its pool not down): worth a
        health check soon."""
        if self.parked or self.asleep or self.pool_down:
            return False
        return not self.running or self.needs_probe

    @property
    def reads_kv(self) -> bool:
        return self.kv_observable and self.reads_engine

    @property
    def reads_engine(self) -> bool:
        """A reading of its engine may be asked for: a running replica, not one put to sleep
        (a call would wake it)."""
        return self.running and not self.asleep

    def view(self) -> LinkView:
        # A parked link only drains; one on a dead pool takes nothing new; one asleep takes
        # work that will wait for it to wake, where its model says so.
        running = (self.waits_when_asleep and self.breaker_passes) if self.asleep else self.running
        return LinkView(
            running=running and not self.parked and not self.pool_down,
            breaker_passes=self.breaker_passes,
            kv_pressured=self.kv_pressured and not self.asleep,
        )


def link_status(
    facts: LinkFacts,
    breaker: CircuitBreaker,
    kv: KvPressure,
    now: float,
    waits_when_asleep: bool = True,
    routable_replicas: int | None = None,
) -> LinkStatus:
    """`routable_replicas`: the replicas Serve's handle would send to at this instant (None:
    it cannot tell). At 0 the link is down whatever the last health reading said: a request
    sent there would wait for a replacement replica to start."""
    awaiting = facts.replica_died_at is not None
    return LinkStatus(
        # A failed probe of a link only tripped (not dead) leaves it running: its breaker
        # keeps work away until the cooldown lets a request probe it.
        running=(not awaiting and facts.health is not Health.NO_REPLICA and routable_replicas != 0),
        awaiting_recovery=awaiting,
        parked=facts.parked,
        asleep=facts.asleep,
        waits_when_asleep=waits_when_asleep,
        pool_down=facts.pool_down,
        breaker=breaker.state,
        breaker_passes=breaker.can_pass(),
        kv_pressured=kv.pressured(now),
        kv_observable=facts.kv_observable,
    )
