"""Per-key limits: requests and tokens per minute, parallel requests, a token budget per period.

One `KeyMeter` per API key holds what the key has used; `admit` decides a request at admission
and `settle` books the engine's real usage when it ends. Windows are sliding logs of the last 60 s
(exact, and bounded by the limit itself); budgets run per calendar day, ISO week or month in UTC.
A request is admitted while the key is under each limit, so one long answer may carry a key past
its TPM or budget: the next request is the one refused (LiteLLM and OpenAI behave the same).

Admitted requests hold a lease until settled; a lease not settled by its deadline (the ingress
holding it died) is dropped, so `max_parallel` never leaks.

Spares: an ingress replica busy with a key may ask for more than its own request (`want`). Far
from every count limit (`rpm`, `max_parallel`) the meter admits up to a quarter of what is left in
one decision; the extra leases are spares the replica hands out itself, each counted at once as a
request of the minute and a parallel slot, so no other replica can be admitted past a limit on
their account. A spare the replica uses is `taken` (its lease then lasts as long as a request's);
one it did not use is given back and uncounted; one never heard of again (its replica died)
expires after `SPARE_HOLD_S`. Near a limit every decision is one request, exact.

Pure: facts and a clock in, decisions out. The shared store that keeps the meters is
deployments/keys/ledger.py.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from core.errors import ErrorCode

__all__ = [
    "GRANT_SHARE",
    "MAX_GRANT",
    "SPARE_HOLD_S",
    "WINDOW_S",
    "BudgetPeriod",
    "KeyLimits",
    "KeyMeter",
    "Settlement",
    "SettlementKind",
    "Verdict",
    "period_bounds",
    "reset_text",
    "spare_headers",
    "spare_lease",
]

WINDOW_S = 60.0
# An unused spare lease whose replica never gives it back (it died) is dropped after this.
SPARE_HOLD_S = 30.0
# At most this many leases in one decision; and at most this share of what a count limit has left.
MAX_GRANT = 64
GRANT_SHARE = 4
BudgetPeriod = Literal["day", "week", "month"]
SettlementKind = Literal["done", "taken", "unused"]


@dataclass(frozen=True)
class KeyLimits:
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget_tokens: int | None = None
    budget_period: BudgetPeriod = "month"

    @property
    def any(self) -> bool:
        return any(
            v is not None for v in (self.rpm, self.tpm, self.max_parallel, self.budget_tokens)
        )


def period_bounds(now: float, period: BudgetPeriod) -> tuple[float, float]:
    """The UTC calendar period holding `now`: [start, end) as epoch seconds."""
    moment = datetime.fromtimestamp(now, UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + timedelta(days=1)
    elif period == "week":  # ISO weeks start on Monday
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    return start.timestamp(), end.timestamp()


def reset_text(seconds: float) -> str:
    """OpenAI's `x-ratelimit-reset-*` format: `1s`, `6m0s`, `1h2m3s`, `120ms`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass(frozen=True)
class Verdict:
    """Admission of one request: the lease to settle, or why not and when to come back."""

    admitted: bool
    headers: dict[str, str]
    code: str | None = None
    message: str | None = None
    retry_after_s: int | None = None
    # Parallel slots the key had left once this request took one, of its max_parallel
    # (None: no such limit).
    parallel_left: int | None = None
    limit_parallel: int | None = None
    # Leases admitted: this request's, then `granted - 1` spares named `spare_lease(lease, i)`.
    granted: int = 1
    at: float = 0.0  # the ledger's clock at the decision (a spare given back names it)

    @property
    def release_at_once(self) -> bool:
        """Whether this request's slot must be freed as soon as it ends: the key is within a
        quarter of its `max_parallel` (or one slot of it), where a release held back by an
        ingress replica that batches its bookings could refuse a request the limit allows."""
        if self.parallel_left is None or self.limit_parallel is None:
            return False
        return self.parallel_left <= max(1, self.limit_parallel // 4)


def spare_lease(lease: str, index: int) -> str:
    """The name of a decision's `index`-th spare lease (1 and up)."""
    return f"{lease}.{index}"


@dataclass(frozen=True)
class Settlement:
    """What a replica tells a key's meter about one lease: `done`, an ended request's real
    usage (`KeyMeter.settle`); `taken`, a spare now serving a request (`KeyMeter.take`);
    `unused`, a spare given back (`KeyMeter.give_back`)."""

    key: str
    lease: str
    prompt_tokens: int
    completion_tokens: int
    period: BudgetPeriod
    admitted: bool = True  # False: a key without limits, never admitted, counted here
    kind: SettlementKind = "done"
    at: float = 0.0  # unused: the decision that granted it (Verdict.at)
    hold_s: float = 0.0  # taken: how long its lease may now last


def spare_headers(headers: dict[str, str], unused_spares: int, tokens_used: int) -> dict[str, str]:
    """The rate-limit headers of a decision as they stand for one of its spares: spares not
    used yet are not requests of the key's minute, and tokens this replica booked since count."""
    shown = dict(headers)
    if "x-ratelimit-remaining-requests" in shown:
        left = int(shown["x-ratelimit-remaining-requests"]) + unused_spares
        shown["x-ratelimit-remaining-requests"] = str(left)
    for name in ("x-ratelimit-remaining-tokens", "x-budget-remaining-tokens"):
        if name in shown:
            shown[name] = str(max(0, int(shown[name]) - tokens_used))
    return shown


@dataclass
class KeyMeter:
    """What one key used: the last minute's requests and tokens, leases, the period's tokens."""

    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    window_tokens: int = 0
    leases: dict[str, float] = field(default_factory=dict)  # lease id -> deadline
    spares: dict[str, float] = field(default_factory=dict)  # granted, not taken yet -> deadline
    period_start: float = 0.0
    period_tokens: int = 0
    # Lifetime totals, for `GET /v1/keys/usage`.
    total_requests: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def admit(
        self, limits: KeyLimits, now: float, lease: str, lease_s: float, want: int = 1
    ) -> Verdict:
        """Admit one request (its lease `lease`) or refuse it; with `want` > 1, far from the
        count limits, also grant spares (module docstring)."""
        self._expire(now, limits.budget_period)
        refusal = self._refusal(limits, now)
        if refusal is not None:
            self.refused += 1
            return refusal
        granted = max(1, min(want, MAX_GRANT, self._room(limits) // GRANT_SHARE))
        self.requests.extend([now] * granted)
        self.leases[lease] = now + lease_s
        for index in range(1, granted):
            self.spares[spare_lease(lease, index)] = now + SPARE_HOLD_S
        self.total_requests += 1
        left = None if limits.max_parallel is None else limits.max_parallel - self.in_parallel
        return Verdict(
            True,
            self.headers(limits, now),
            parallel_left=left,
            limit_parallel=limits.max_parallel,
            granted=granted,
            at=now,
        )

    @property
    def in_parallel(self) -> int:
        """Parallel slots held: requests in progress and spares not given back."""
        return len(self.leases) + len(self.spares)

    def take(self, lease: str, now: float, hold_s: float) -> None:
        """A spare now serves a request: a request of the key's, its lease as long as one's."""
        if self.spares.pop(lease, None) is not None:
            self.leases[lease] = now + hold_s
            self.total_requests += 1

    def give_back(self, lease: str, granted_at: float) -> None:
        """A spare its replica did not use: its parallel slot and its request of the minute
        (booked at `granted_at`) are free again."""
        if self.spares.pop(lease, None) is None:
            return
        for index in range(len(self.requests) - 1, -1, -1):  # it is among the newest
            if self.requests[index] == granted_at:
                del self.requests[index]
                return
            if self.requests[index] < granted_at:
                return

    def settle(
        self,
        lease: str,
        now: float,
        prompt_tokens: int,
        completion_tokens: int,
        period: BudgetPeriod,
        admitted: bool = True,
    ) -> None:
        """Book an ended request's real usage and free its lease (unknown leases too: the
        usage happened whether or not the lease had run out). `admitted` False: a key with no
        limits skips admission, so its request is counted here."""
        self._expire(now, period)
        self.leases.pop(lease, None)
        if self.spares.pop(lease, None) is not None:  # its `taken` never came: it still ran
            self.total_requests += 1
        if not admitted:
            self.requests.append(now)
            self.total_requests += 1
        used = max(0, prompt_tokens) + max(0, completion_tokens)
        self.prompt_tokens += max(0, prompt_tokens)
        self.completion_tokens += max(0, completion_tokens)
        if used:
            self.tokens.append((now, used))
            self.window_tokens += used
            self.period_tokens += used

    def headers(self, limits: KeyLimits, now: float) -> dict[str, str]:
        """OpenAI's rate-limit headers for the limits the key has (after this request)."""
        headers: dict[str, str] = {}
        if limits.rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(limits.rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, limits.rpm - len(self.requests)))
            newest = self.requests[-1] if self.requests else now - WINDOW_S
            headers["x-ratelimit-reset-requests"] = reset_text(newest + WINDOW_S - now)
        if limits.tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(limits.tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, limits.tpm - self.window_tokens))
            newest = self.tokens[-1][0] if self.tokens else now - WINDOW_S
            headers["x-ratelimit-reset-tokens"] = reset_text(newest + WINDOW_S - now)
        if limits.budget_tokens is not None:
            _, end = period_bounds(now, limits.budget_period)
            left = max(0, limits.budget_tokens - self.period_tokens)
            headers["x-budget-limit-tokens"] = str(limits.budget_tokens)
            headers["x-budget-remaining-tokens"] = str(left)
            headers["x-budget-reset"] = reset_text(end - now)
        return headers

    def usage(self, limits: KeyLimits, now: float) -> dict[str, Any]:
        self._expire(now, limits.budget_period)
        start, end = period_bounds(now, limits.budget_period)
        return {
            "requests": self.total_requests,
            "refused": self.refused,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "in_flight": len(self.leases),
            "spare": len(self.spares),
            "last_minute": {"requests": len(self.requests), "tokens": self.window_tokens},
            "period": {
                "kind": limits.budget_period,
                "start": start,
                "end": end,
                "tokens": self.period_tokens,
            },
        }

    def _refusal(self, limits: KeyLimits, now: float) -> Verdict | None:
        if limits.budget_tokens is not None and self.period_tokens >= limits.budget_tokens:
            _, end = period_bounds(now, limits.budget_period)
            return self._refuse(
                limits,
                now,
                ErrorCode.BUDGET_EXCEEDED,
                f"This key has used its budget of {limits.budget_tokens} tokens for this "
                f"{limits.budget_period}; it renews at the start of the next one (UTC).",
                end - now,
            )
        if limits.rpm is not None and len(self.requests) >= limits.rpm:
            return self._refuse(
                limits,
                now,
                ErrorCode.RATE_LIMITED,
                f"This key's limit of {limits.rpm} requests per minute is reached.",
                # Spares a replica holds unused come back within a second (SPARE_TTL_S).
                1.0 if self.spares else self.requests[0] + WINDOW_S - now,
            )
        if limits.tpm is not None and self.window_tokens >= limits.tpm:
            return self._refuse(
                limits,
                now,
                ErrorCode.RATE_LIMITED,
                f"This key's limit of {limits.tpm} tokens per minute is reached.",
                self._tokens_free_at(limits.tpm) - now,
            )
        if limits.max_parallel is not None and self.in_parallel >= limits.max_parallel:
            return self._refuse(
                limits,
                now,
                ErrorCode.RATE_LIMITED,
                f"This key already has {self.in_parallel} requests in progress, its limit "
                f"(max_parallel {limits.max_parallel}).",
                1.0,
            )
        return None

    def _room(self, limits: KeyLimits) -> int:
        """What the tightest count limit has left (MAX_GRANT * GRANT_SHARE if none binds)."""
        room = MAX_GRANT * GRANT_SHARE
        if limits.rpm is not None:
            room = min(room, limits.rpm - len(self.requests))
        if limits.max_parallel is not None:
            room = min(room, limits.max_parallel - self.in_parallel)
        return room

    def _refuse(
        self, limits: KeyLimits, now: float, code: str, message: str, wait_s: float
    ) -> Verdict:
        return Verdict(False, self.headers(limits, now), code, message, max(1, math.ceil(wait_s)))

    def _tokens_free_at(self, tpm: int) -> float:
        """When enough of the window's tokens have aged out to be under `tpm` again."""
        left = self.window_tokens
        for at, used in self.tokens:
            left -= used
            if left < tpm:
                return at + WINDOW_S
        return self.tokens[-1][0] + WINDOW_S if self.tokens else 0.0

    def _expire(self, now: float, period: BudgetPeriod) -> None:
        cutoff = now - WINDOW_S
        while self.requests and self.requests[0] <= cutoff:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= cutoff:
            self.window_tokens -= self.tokens.popleft()[1]
        for held in (self.leases, self.spares):
            for lease in [lease for lease, deadline in held.items() if deadline <= now]:
                del held[lease]
        start, _ = period_bounds(now, period)
        if start != self.period_start:
            self.period_start, self.period_tokens = start, 0
