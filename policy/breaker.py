"""A circuit breaker per backend: a pure state machine on an injected clock.

CLOSED -> OPEN after `failure_threshold` consecutive faults (5xx, timeouts, dead replicas; never a
client's 4xx) -> HALF_OPEN once `cooldown_s` has passed, letting `half_open_probes` requests
through -> CLOSED when a probe succeeds, back to OPEN (a fresh cooldown) when one fails.
A background health check may `reset()` a breaker whose backend has recovered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from core.clock import Now

__all__ = ["BreakerPolicy", "BreakerState", "CircuitBreaker", "Transition"]


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerPolicy:
    failure_threshold: int = 3
    cooldown_s: float = 10.0
    half_open_probes: int = 1


@dataclass(frozen=True)
class Transition:
    at: float
    source: BreakerState
    target: BreakerState
    reason: str


@dataclass
class CircuitBreaker:
    policy: BreakerPolicy
    clock: Now
    _state: BreakerState = BreakerState.CLOSED
    _consecutive_failures: int = 0
    _opened_at: float = 0.0
    _probes_in_flight: int = 0
    transitions: list[Transition] = field(default_factory=list)

    @property
    def state(self) -> BreakerState:
        if (
            self._state is BreakerState.OPEN
            and self.clock() - self._opened_at >= self.policy.cooldown_s
        ):
            self._move(BreakerState.HALF_OPEN, "cooldown over")
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive_failures

    def can_pass(self) -> bool:
        """Whether a request would be let through now (reserves nothing)."""
        state = self.state
        if state is BreakerState.HALF_OPEN:
            return self._probes_in_flight < self.policy.half_open_probes
        return state is BreakerState.CLOSED

    def try_acquire(self) -> bool:
        """Let one request through if the state allows; in HALF_OPEN it takes a probe slot.

        Every acquired request must end in exactly one of `record_success`, `record_failure` or
        `record_abandoned`, which return the probe slot.
        """
        if not self.can_pass():
            return False
        if self._state is BreakerState.HALF_OPEN:
            self._probes_in_flight += 1
        return True

    def record_success(self) -> None:
        self._consecutive_failures = 0
        if self._state is BreakerState.HALF_OPEN:
            self._release_probe()
            self._move(BreakerState.CLOSED, "probe succeeded")

    def record_failure(self) -> None:
        self._consecutive_failures += 1
        if self._state is BreakerState.HALF_OPEN:
            self._release_probe()
            self._open("probe failed")
        elif (
            self._state is BreakerState.CLOSED
            and self._consecutive_failures >= self.policy.failure_threshold
        ):
            self._open(f"{self._consecutive_failures} consecutive faults")

    def record_abandoned(self) -> None:
        """The request ended without a verdict (client gone, 4xx): it proves nothing."""
        if self._state is BreakerState.HALF_OPEN:
            self._release_probe()

    def reset(self, reason: str = "health check passed") -> None:
        self._consecutive_failures = 0
        self._probes_in_flight = 0
        if self._state is not BreakerState.CLOSED:
            self._move(BreakerState.CLOSED, reason)

    def trip(self, reason: str) -> None:
        """Open at once (a health check found the backend down)."""
        if self._state is not BreakerState.OPEN:
            self._open(reason)

    def _open(self, reason: str) -> None:
        self._opened_at = self.clock()
        self._probes_in_flight = 0
        self._move(BreakerState.OPEN, reason)

    def _release_probe(self) -> None:
        self._probes_in_flight = max(0, self._probes_in_flight - 1)

    def _move(self, target: BreakerState, reason: str) -> None:
        self.transitions.append(Transition(self.clock(), self._state, target, reason))
        self._state = target
