"""The ingress's side of per-key limits: admit through the shared ledger, settle real usage.

Every request of a key with limits is admitted by the app's key ledger (deployments/keys/ledger.py)
after its body passed the schema checks (a malformed request costs no quota); a key without
limits needs no decision and skips that round trip. Every keyed request is settled with
the engine's own `usage` when it ends: the whole answer's, or a stream's last chunk. Streams are
always asked for that chunk (`stream_options.include_usage`); a client that did not ask for it
does not get it. Settlements are held and ride on this replica's next admission (booked before
its decision), or go in one batch after `FLUSH_S`: one actor call per request, not two.

A replica busy with a key asks for spares with its decision (policy/key_limits.py): as many as
twice the key's requests here in the last `SPARE_TTL_S`. The ledger grants at most a quarter of
what the tightest count limit has left, so none once fewer than 8 are left. The replica hands
them out itself for `SPARE_TTL_S`, with the decision's headers brought up to date, then gives
back those left; the ledger hears of each one taken with the next batch. Far from the limits a
busy key thus costs one call per `SPARE_TTL_S`, not one per request; near them every decision is
one request, and such decisions are never made to wait for one another. Spares stop early once
this replica's own answers used the tokens the decision had left (`tpm`, budget); another
replica's usage is seen at the next decision, at most `SPARE_TTL_S` + `FLUSH_S` later.
A decision that ends after its request stopped waiting (a timeout, a client gone) gives back
what it admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.config import ApiKeyConfig
from core.errors import ApiError, ErrorCode
from deployments.keys.ledger import LedgerClient
from policy.key_limits import (
    MAX_GRANT,
    BudgetPeriod,
    KeyLimits,
    Settlement,
    Verdict,
    spare_headers,
    spare_lease,
)

logger = logging.getLogger("ray.serve")

# A request holds a parallel slot until settled or until this long (its ingress died).
LEASE_S = 3600.0
ADMIT_TIMEOUT_S = 2.0
# Held usage waits at most this long for an admission to carry it.
FLUSH_S = 0.25
# Usage held while the ledger cannot be reached at all; past this the oldest is dropped.
MAX_HELD = 10_000
# Spares are handed out this long after their decision, then the rest are given back.
SPARE_TTL_S = FLUSH_S


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


@dataclass
class Spares:
    """The spare leases of one decision, handed out by this replica until `expires`."""

    leases: list[str]
    expires: float  # monotonic
    granted_at: float  # the ledger's clock (Verdict.at): a spare given back names it
    headers: dict[str, str]
    release_at_once: bool
    tokens_used: int = 0  # booked by this replica's answers since the decision

    def usable(self, now: float) -> bool:
        if now >= self.expires or not self.leases:
            return False
        shown = spare_headers(self.headers, 0, self.tokens_used)
        return all(
            int(shown[name]) > 0
            for name in ("x-ratelimit-remaining-tokens", "x-budget-remaining-tokens")
            if name in shown
        )


class KeyMetering:
    def __init__(self, keys: Sequence[ApiKeyConfig], ledger: Callable[[], LedgerClient]) -> None:
        self._config_limits = {key.name: key_limits(key) for key in keys}
        self._limits = dict(self._config_limits)
        self._run_time_limits: dict[str, KeyLimits] = {}
        self._connect = ledger
        self._ledger: LedgerClient | None = None
        self._held: list[Settlement] = []
        self._flusher: asyncio.Task[None] | None = None
        self._spares: dict[str, Spares] = {}
        self._recent: dict[str, deque[float]] = {}  # when this replica admitted each key's
        self._asking: dict[str, asyncio.Future[None]] = {}  # a decision with spares under way
        self._spared: dict[str, bool] = {}  # whether the key's last decision granted spares
        self._tokens_settled: dict[str, int] = {}  # tokens of each key's answers ended here
        if self.enabled:  # start the actor now: its first start must not be a request's wait
            try:
                self._client()
            except Exception as error:  # noqa: BLE001 - tried again on the first request
                logger.warning("key ledger not reachable yet: %r", error)

    @property
    def enabled(self) -> bool:
        return bool(self._limits)

    def use_run_time(self, keys: Sequence[ApiKeyConfig]) -> None:
        """The run-time keys' limits from now on, beside the config's (whose names win)."""
        self._run_time_limits = {key.name: key_limits(key) for key in keys}
        self._limits = {**self._run_time_limits, **self._config_limits}

    def use_config(self, keys: Sequence[ApiKeyConfig]) -> None:
        """A reload's config keys and limits from now on. A key whose limits changed gives
        back the spare admissions its last decision granted under the old ones."""
        before = self._config_limits
        self._config_limits = {key.name: key_limits(key) for key in keys}
        self._limits = {**self._run_time_limits, **self._config_limits}
        for name, limits in before.items():
            if self._config_limits.get(name) != limits:
                self._give_back(name, limits.budget_period)

    async def admit(self, key: str) -> Admission:
        limits = self._limits.get(key)
        if limits is None:
            return UNMETERED
        lease = uuid.uuid4().hex
        if not limits.any:  # nothing to decide: no round trip, the usage is booked at the end
            return Admission(key, lease, limits.budget_period, admitted=False)
        spare = self._take_spare(key, limits.budget_period)
        if spare is not None:
            return spare
        asking = self._asking.get(key)
        if asking is not None:  # a decision with spares is under way: they may serve this one
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(asking), ADMIT_TIMEOUT_S)
            spare = self._take_spare(key, limits.budget_period)
            if spare is not None:
                return spare
        return await self._decide(key, limits, lease)

    async def _decide(self, key: str, limits: KeyLimits, lease: str) -> Admission:
        """The ledger's decision on this request, with spares when the key is busy here.
        Requests that find no spare wait for a decision only while the key's decisions grant
        spares; near a limit (one lease a decision) each asks for itself, at once."""
        want = self._want(key)
        asking = None
        if want > 1 and self._spared.get(key, True) and key not in self._asking:
            asking = self._asking[key] = asyncio.get_running_loop().create_future()
        try:
            verdict = await self._ask(key, limits, lease, want)
        except Exception as error:  # noqa: BLE001 - any ledger failure: serve unmetered
            logger.warning("key ledger unreachable, %r admitted unmetered: %r", key, error)
            return UNMETERED
        finally:
            if asking is not None:
                del self._asking[key]
                asking.set_result(None)
        if not verdict.admitted:
            headers = {**verdict.headers, "Retry-After": str(verdict.retry_after_s)}
            code = verdict.code or ErrorCode.RATE_LIMITED
            raise ApiError(429, code, verdict.message or "Over this key's limits.", headers=headers)
        self._note_admitted(key)
        if want > 1:  # asked for spares: did the ledger find room for them?
            self._spared[key] = verdict.granted > 1
        return Admission(
            key,
            lease,
            limits.budget_period,
            spare_headers(verdict.headers, verdict.granted - 1, 0),  # spares are not requests
            release_at_once=verdict.release_at_once,
        )

    async def _ask(self, key: str, limits: KeyLimits, lease: str, want: int) -> Verdict:
        """One call to the ledger, carrying the usage held. If this request stops waiting for
        it (timeout, client gone) the call still ends: what it admitted is given back then,
        and a batch it failed to deliver is held again."""
        client = self._client()
        held, self._held = self._held, []  # sent with the call from here on: never twice
        tokens_before = self._tokens_settled.get(key, 0)
        call = asyncio.ensure_future(client.admit(key, limits, lease, LEASE_S, held, want))
        try:
            verdict = await asyncio.wait_for(asyncio.shield(call), ADMIT_TIMEOUT_S)
        except BaseException:
            call.add_done_callback(
                functools.partial(self._unwaited, key, lease, held, limits.budget_period)
            )
            raise
        if verdict.admitted and verdict.granted > 1:
            # Answers that ended during the call: their tokens are not in the decision's count.
            since = self._tokens_settled.get(key, 0) - tokens_before
            self._keep_spares(key, lease, verdict, limits.budget_period, since)
        return verdict

    def _unwaited(
        self,
        key: str,
        lease: str,
        held: list[Settlement],
        period: BudgetPeriod,
        call: asyncio.Future[Verdict],
    ) -> None:
        if call.cancelled():
            return
        if call.exception() is not None:  # not booked: it goes with the next call
            self._held[:0] = held
            return
        verdict = call.result()
        if not verdict.admitted:
            return
        self._held.append(Settlement(key, lease, 0, 0, period))  # served unmetered, or not at all
        self._held.extend(
            Settlement(key, spare_lease(lease, index), 0, 0, period, kind="unused", at=verdict.at)
            for index in range(1, verdict.granted)
        )
        self._flush_later()

    def _want(self, key: str) -> int:
        """Leases to ask for: twice this replica's recent requests of the key, and this one."""
        recent = self._recent.get(key)
        if not recent:
            return 1
        cutoff = time.monotonic() - SPARE_TTL_S
        while recent and recent[0] < cutoff:
            recent.popleft()
        return min(MAX_GRANT, 1 + 2 * len(recent))

    def _note_admitted(self, key: str) -> None:
        recent = self._recent.setdefault(key, deque(maxlen=MAX_GRANT))
        recent.append(time.monotonic())

    def _keep_spares(
        self, key: str, lease: str, verdict: Verdict, period: BudgetPeriod, tokens_used: int
    ) -> None:
        self._give_back(key, period)  # an earlier decision's, if any are left
        spares = Spares(
            [spare_lease(lease, index) for index in range(1, verdict.granted)],
            time.monotonic() + SPARE_TTL_S,
            verdict.at,
            verdict.headers,
            verdict.release_at_once,
            tokens_used,
        )
        self._spares[key] = spares
        asyncio.get_running_loop().call_later(SPARE_TTL_S, self._expire, key, spares, period)

    def _take_spare(self, key: str, period: BudgetPeriod) -> Admission | None:
        spares = self._spares.get(key)
        if spares is None:
            return None
        if not spares.usable(time.monotonic()):
            self._give_back(key, period)
            return None
        lease = spares.leases.pop()
        self._note_admitted(key)
        # Its lease must outlive a spare's short hold at the ledger: the ledger hears it is taken.
        self._hold(Settlement(key, lease, 0, 0, period, kind="taken", hold_s=LEASE_S))
        headers = spare_headers(spares.headers, len(spares.leases), spares.tokens_used)
        return Admission(key, lease, period, headers, release_at_once=spares.release_at_once)

    def _expire(self, key: str, spares: Spares, period: BudgetPeriod) -> None:
        if self._spares.get(key) is spares:
            self._give_back(key, period)
            self._flush()  # their slots are other replicas' again

    def _give_back(self, key: str, period: BudgetPeriod) -> None:
        spares = self._spares.pop(key, None)
        if spares is None or not spares.leases:
            return
        for lease in spares.leases:
            self._held.append(
                Settlement(key, lease, 0, 0, period, kind="unused", at=spares.granted_at)
            )
        self._flush_later()

    def settle(self, admission: Admission, prompt_tokens: int, completion_tokens: int) -> None:
        """Hold the usage for the ledger (once; never awaited: the answer is already the
        client's)."""
        if admission.key is None or admission.settled:
            return
        admission.settled = True
        used = max(0, prompt_tokens) + max(0, completion_tokens)
        self._tokens_settled[admission.key] = self._tokens_settled.get(admission.key, 0) + used
        spares = self._spares.get(admission.key)
        if spares is not None:  # the tokens the decision had left are being used
            spares.tokens_used += used
        settlement = Settlement(
            admission.key,
            admission.lease,
            prompt_tokens,
            completion_tokens,
            admission.period,
            admission.admitted,
        )
        if admission.release_at_once:
            self._held.append(settlement)
            self._flush()  # its lease holds a parallel slot on every replica until booked
        else:
            self._hold(settlement)

    def _hold(self, settlement: Settlement) -> None:
        """Keep it for the next admission or the batch after `FLUSH_S`."""
        self._held.append(settlement)
        self._flush_later()

    def _flush_later(self) -> None:
        if self._flusher is None or self._flusher.done():
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


__all__ = [
    "FLUSH_S",
    "LEASE_S",
    "SPARE_TTL_S",
    "UNMETERED",
    "Admission",
    "KeyMetering",
    "key_limits",
]
