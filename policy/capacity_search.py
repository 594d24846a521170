"""The capacity command's decisions (pure): which size to try next, and what to recommend.

Each search looks for the largest size that still runs cleanly (no preemption, no error), on
the assumption that what fails at n fails at every larger n. The upper bound is tried first:
where the arithmetic already says it fits, one real run confirms it; otherwise a binary search
with real runs finds the edge.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EdgeSearch", "with_margin"]


@dataclass
class EdgeSearch:
    """The largest n in [low, high], in multiples of `step` above `low`, that passes."""

    low: int
    high: int
    step: int = 1
    best: int | None = None  # the largest size seen to pass
    _failed_above: int | None = None  # the smallest size seen to fail
    probes: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high or self.step < 1:
            raise ValueError(f"bad range: {self.low}..{self.high} step {self.step}")

    def next(self) -> int | None:
        """The next size to run, or None when the edge is found."""
        if self.probes == 0:
            return self.high
        floor = self.low if self.best is None else self.best + self.step
        ceiling = (self._failed_above if self._failed_above is not None else self.high + 1) - 1
        if self.best is None and self._failed_above == self.low:
            return None  # even the smallest size failed
        if floor > ceiling:
            return None
        middle = floor + ((ceiling - floor) // 2 // self.step) * self.step
        return min(max(middle, floor), ceiling)

    def record(self, size: int, passed: bool) -> None:
        self.probes += 1
        if passed:
            self.best = size if self.best is None else max(self.best, size)
        elif self._failed_above is None or size < self._failed_above:
            self._failed_above = size

    @property
    def max_probes(self) -> int:
        """The most runs this search can take (for a progress bar)."""
        return 1 + max(1, ((self.high - self.low) // self.step + 1).bit_length())


def with_margin(measured: int, margin: float, floor: int = 1) -> int:
    """What to configure from what was measured: `margin` of it, never below `floor`."""
    return max(floor, int(measured * margin))
