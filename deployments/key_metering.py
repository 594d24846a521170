"""The ingress's side of per-key limits: admit through the shared ledger, settle real usage.

Every request of a key with limits is admitted by the app's key ledger (deployments/key_ledger.py)
after its body passed the schema checks (a malformed request costs no quota); a key without
limits needs no decision and skips that round trip. Every keyed request is settled with
the engine's own `usage` when it ends: the whole answer's, or a stream's last chunk. Streams are
always asked for that chunk (`stream_options.include_usage`); a client that did not ask for it
does not get it. Settlements are held and ride on this replica's next admission (booked before
its decision), or go in one batch after `FLUSH_S`: one actor call per request, not two.

If the ledger cannot be reached within `ADMIT_TIMEOUT_S` the request is admitted unmetered and
logged: the limits exist to share the service, never to take it down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.config import ApiKeyConfig
from core.errors import ApiError, ErrorCode
from deployments.key_ledger import LedgerClient
from policy.key_limits import BudgetPeriod, KeyLimits, Settlement

logger = logging.getLogger("ray.serve")

# A request holds a parallel slot until settled or until this long (its ingress died).
LEASE_S = 3600.0
ADMIT_TIMEOUT_S = 2.0
# Held usage waits at most this long for an admission to carry it.
FLUSH_S = 0.25
# Usage held while the ledger cannot be reached at all; past this the oldest is dropped.
MAX_HELD = 10_000


def key_limits(key: ApiKeyConfig) -> KeyLimits:
    return KeyLimits(
        rpm=key.rpm,
        tpm=key.tpm,
        max_parallel=key.max_parallel,
        budget_tokens=key.budget_tokens,
        budget_period=key.budget_period,
    )


@dataclass
class Admission:
    """One admitted request: its lease and the rate-limit headers every answer carries."""

    key: str | None  # None: not metered (auth off, or the ledger was unreachable)
    lease: str
    period: BudgetPeriod
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False
    admitted: bool = True  # False: a key with no limits, counted only when settled
    release_at_once: bool = False  # its key is near its max_parallel (Verdict.release_at_once)


UNMETERED = Admission(None, "", "month")


class KeyMetering:
    def __init__(self, keys: Sequence[ApiKeyConfig], ledger: Callable[[], LedgerClient]) -> None:
        self._limits = {key.name: key_limits(key) for key in keys}
        self._connect = ledger
        self._ledger: LedgerClient | None = None
        self._held: list[Settlement] = []
        self._flusher: asyncio.Task[None] | None = None
        if self.enabled:  # start the actor now: its first start must not be a request's wait
            try:
                self._client()
            except Exception as error:  # noqa: BLE001 - tried again on the first request
                logger.warning("key ledger not reachable yet: %r", error)

    @property
    def enabled(self) -> bool:
        return bool(self._limits)

    async def admit(self, key: str) -> Admission:
        limits = self._limits.get(key)
        if limits is None:
            return UNMETERED
        lease = uuid.uuid4().hex
        if not limits.any:  # nothing to decide: no round trip, the usage is booked at the end
            return Admission(key, lease, limits.budget_period, admitted=False)
        try:
            client = self._client()
            held, self._held = self._held, []  # sent with the call from here on: never twice
            verdict = await asyncio.wait_for(
                client.admit(key, limits, lease, LEASE_S, held), ADMIT_TIMEOUT_S
            )
        except Exception as error:  # noqa: BLE001 - any ledger failure: serve unmetered
            logger.warning("key ledger unreachable, %r admitted unmetered: %r", key, error)
            return UNMETERED
        if not verdict.admitted:
            headers = {**verdict.headers, "Retry-After": str(verdict.retry_after_s)}
            code = verdict.code or ErrorCode.RATE_LIMITED
            raise ApiError(429, code, verdict.message or "Over this key's limits.", headers=headers)
        return Admission(
            key,
            lease,
            limits.budget_period,
            verdict.headers,
            release_at_once=verdict.release_at_once,
        )

    def settle(self, admission: Admission, prompt_tokens: int, completion_tokens: int) -> None:
        """Hold the usage for the ledger (once; never awaited: the answer is already the
        client's)."""
        if admission.key is None or admission.settled:
            return
        admission.settled = True
        self._held.append(
            Settlement(
                admission.key,
                admission.lease,
                prompt_tokens,
                completion_tokens,
                admission.period,
                admission.admitted,
            )
        )
        if admission.release_at_once:
            self._flush()  # its lease holds a parallel slot on every replica until booked
        elif self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def usage(self) -> dict[str, Any]:
        self._flush()  # this replica's own usage, booked before it is read
        return await self._client().usage(self._limits)

    async def metrics_text(self) -> bytes:
        if not self.enabled:
            return b""
        self._flush()
        return await self._client().metrics_text()

    async def _flush_soon(self) -> None:
        await asyncio.sleep(FLUSH_S)
        self._flush()

    def _flush(self) -> None:
        if not self._held:
            return
        try:
            client = self._client()
        except Exception as error:  # noqa: BLE001 - kept for the next try, within a bound
            dropped = max(0, len(self._held) - MAX_HELD)
            del self._held[:dropped]
            logger.warning("key ledger not reachable, usage held (%d dropped): %r", dropped, error)
            return
        held, self._held = self._held, []
        try:
            client.settle(held)
        except Exception as error:  # noqa: BLE001 - usage lost is better than an error shown
            logger.warning("key ledger: usage of %d requests not booked: %r", len(held), error)

    def _client(self) -> LedgerClient:
        if self._ledger is None:
            self._ledger = self._connect()
        return self._ledger


class StreamUsage:
    """Watches a stream's SSE lines for the engine's usage chunk, and hides it when the client
    did not ask for it; counts content chunks in case the stream ends without one."""

    def __init__(self, client_wants_usage: bool) -> None:
        self._show = client_wants_usage
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.chunks = 0

    def filter(self, part: str) -> str:
        if not part.startswith("data: {"):
            return part
        if '"usage"' not in part:
            self.chunks += 1
            return part
        usage, has_choices = _usage_of(part)
        if usage is None:
            self.chunks += 1
            return part
        self.prompt_tokens = usage.get("prompt_tokens", 0)
        self.completion_tokens = usage.get("completion_tokens", 0)
        if has_choices:
            self.chunks += 1
            return part
        return part if self._show else ""

    def totals(self, prompt_estimate: int) -> tuple[int, int]:
        if self.completion_tokens is None:
            return prompt_estimate, self.chunks
        return self.prompt_tokens or 0, self.completion_tokens


def _usage_of(part: str) -> tuple[dict[str, Any] | None, bool]:
    try:
        chunk = json.loads(part[len("data: ") :])
    except ValueError:
        return None, False
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(usage, dict):
        return None, False
    return usage, bool(chunk.get("choices"))


__all__ = [
    "FLUSH_S",
    "LEASE_S",
    "UNMETERED",
    "Admission",
    "KeyMetering",
    "StreamUsage",
    "key_limits",
]
