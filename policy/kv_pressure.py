"""The KV-cache-pressure breaker for one vLLM backend (pure, readings and time passed in).

Above `high` KV-cache usage the backend gets no new work; it resumes only below
`resume_factor * high` (hysteresis, so it does not flap at the line). A reading older than
`stale_after_s` counts as pressure: an engine too busy to report is not one to load further.
Until the first reading arrives the backend is trusted (it has just started, its cache is empty).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KvPolicy", "KvPressure"]


@dataclass(frozen=True)
class KvPolicy:
    high: float = 0.88
    resume_factor: float = 0.9
    stale_after_s: float = 10.0

    @property
    def resume_below(self) -> float:
        return self.high * self.resume_factor


@dataclass
class KvPressure:
    policy: KvPolicy
    usage: float | None = None
    read_at: float | None = None
    _over: bool = False

    def observe(self, usage: float, now: float) -> None:
        self.usage = usage
        self.read_at = now
        if usage > self.policy.high:
            self._over = True
        elif usage < self.policy.resume_below:
            self._over = False

    def forget(self) -> None:
        """A replaced engine starts empty: old readings say nothing about it."""
        self.usage = None
        self.read_at = None
        self._over = False

    def stale(self, now: float) -> bool:
        return self.read_at is not None and now - self.read_at > self.policy.stale_after_s

    def pressured(self, now: float) -> bool:
        return self._over or self.stale(now)
