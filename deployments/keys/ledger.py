"""The key ledger: every key's meter, shared by all ingress replicas, kept across restarts.

One detached, named actor per app on the gateway's nodes (like the placement actor): each
ingress replica asks it to admit a request and tells it the request's real usage when it ends,
so limits hold however many replicas there are, and an ingress or router restart loses nothing.
The meters are snapshotted to Ray's internal key-value store (the GCS) at most every
`SNAPSHOT_S`, so a restarted ledger carries on from them (losing at most that much usage).

Cost: one actor call per admission decision, awaited. A replica busy with a key asks for spares
with its decision (policy/key_limits.py), so far from the limits one call admits many requests;
near them, one each. Usage is not sent when a request ends: each ingress replica holds it and
sends it with its next admission, or after `FLUSH_S` in one batch (keys without limits never ask
for admission). A replica that dies loses at most that much usage. bench/overhead.py measures it
with limits on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from deployments.detached import gateway_actor, stop_older_protocols
from policy.key_limits import KeyLimits, KeyMeter, Settlement, Verdict

logger = logging.getLogger("ray.serve")

KV_NAMESPACE = "gps_keys"
SNAPSHOT_S = 2.0


# The actor outlives deploys (detached): its name carries the call protocol, so new ingress
# replicas never call an older ledger with arguments it does not take (limits would be off).
PROTOCOL = 2


def ledger_actor_name(app: str, protocol: int = PROTOCOL) -> str:
    suffix = "" if protocol == 1 else f"-v{protocol}"
    return f"gps-key-ledger-{app}{suffix}"


class SnapshotStore(Protocol):
    """Where the ledger keeps its meters between incarnations (KvSnapshots; MemorySnapshots)."""

    def load(self) -> dict[str, Any] | None: ...

    def save(self, meters: dict[str, Any]) -> None: ...


class KeyLedger:
    def __init__(
        self,
        app: str,
        clock: Callable[[], float] = time.time,
        store: SnapshotStore | None = None,
    ) -> None:
        self._clock = clock
        self._store: SnapshotStore = store if store is not None else KvSnapshots(app)
        self._meters: dict[str, KeyMeter] = {}
        self._dirty = False
        self._saver: asyncio.Task[None] | None = None
        snapshot = self._store.load()
        for name, saved in (snapshot or {}).items():
            self._meters[name] = _meter_from(saved)
        # Shown with the usage: when this incarnation started, and whether it carried on.
        self._about = {"started_at": clock(), "restored_from_snapshot": snapshot is not None}

    # Async methods: they run one at a time on the actor's event loop (none awaits inside), and
    # the snapshot waits on that loop instead of a write per request.
    async def admit(
        self,
        key: str,
        limits: KeyLimits,
        lease: str,
        lease_s: float,
        settled: Sequence[Settlement] = (),
        want: int = 1,
    ) -> Verdict:
        """Book what the caller held (its earlier requests, its spares: before this decision),
        then decide this request, with up to `want - 1` spares."""
        self.book(settled)
        verdict = self._meter(key).admit(limits, self._clock(), lease, lease_s, want)
        self._changed()
        return verdict

    async def settle(self, settled: Sequence[Settlement]) -> None:
        self.book(settled)

    def book(self, settled: Sequence[Settlement]) -> None:
        if not settled:
            return
        now = self._clock()
        for done in settled:
            meter = self._meter(done.key)
            if done.kind == "taken":
                meter.take(done.lease, now, done.hold_s)
            elif done.kind == "unused":
                meter.give_back(done.lease, done.at)
            else:
                meter.settle(
                    done.lease,
                    now,
                    done.prompt_tokens,
                    done.completion_tokens,
                    done.period,
                    done.admitted,
                )
        self._changed()

    async def usage(self, limits: Mapping[str, KeyLimits]) -> dict[str, Any]:
        """Every configured key's usage and limits (keys not seen yet show zeros), and the
        ledger's own start."""
        now = self._clock()
        keys = {
            name: {**self._meter(name).usage(key_limits, now), "limits": asdict(key_limits)}
            for name, key_limits in limits.items()
        }
        return {"keys": keys, "ledger": dict(self._about)}

    async def metrics_text(self) -> bytes:
        registry = CollectorRegistry()
        registry.register(_TokenTotals(self._meters))
        return generate_latest(registry)

    def snapshot(self) -> None:
        self._store.save(self._record())
        self._dirty = False

    def _record(self) -> dict[str, Any]:
        return {name: _saved(meter) for name, meter in self._meters.items()}

    def _meter(self, key: str) -> KeyMeter:
        return self._meters.setdefault(key, KeyMeter())

    def _changed(self) -> None:
        self._dirty = True
        if self._saver is None or self._saver.done():
            self._saver = asyncio.get_running_loop().create_task(self._save_soon())

    async def _save_soon(self) -> None:
        """Every SNAPSHOT_S while something changed. The write runs off the loop: with the GCS
        away it waits until the GCS is back (a restart, a new head), and admissions waiting
        behind it would time out and be served unmetered (tests/gcs measured 55 of 365 tokens
        lost so). A failed write is tried again, so the state of the outage is saved after it."""
        while self._dirty:
            await asyncio.sleep(SNAPSHOT_S)
            self._dirty = False
            record = self._record()  # taken on the loop: the meters change only there
            try:
                await asyncio.to_thread(self._store.save, record)
            except Exception:  # the GCS away: the next round tries again
                self._dirty = True
                logger.warning("key ledger: snapshot failed", exc_info=True)


class _TokenTotals(Collector):
    def __init__(self, meters: Mapping[str, KeyMeter]) -> None:
        self._meters = meters

    def collect(self) -> Any:
        tokens = CounterMetricFamily(
            "gps_key_tokens",
            "Tokens used per API key, from the engines' usage.",
            labels=["key", "kind"],
        )
        requests = CounterMetricFamily(
            "gps_key_requests", "Requests per API key, by outcome.", labels=["key", "outcome"]
        )
        for name, meter in self._meters.items():
            tokens.add_metric([name, "prompt"], meter.prompt_tokens)
            tokens.add_metric([name, "completion"], meter.completion_tokens)
            requests.add_metric([name, "admitted"], meter.total_requests)
            requests.add_metric([name, "refused"], meter.refused)
        yield tokens
        yield requests


def _saved(meter: KeyMeter) -> dict[str, Any]:
    """A meter as JSON, without its spares: they live a quarter of a second, and a snapshot
    without them is one every version of the ledger reads."""
    saved = asdict(meter)
    del saved["spares"]
    return {
        **saved,
        "requests": list(meter.requests),
        "tokens": [list(entry) for entry in meter.tokens],
    }


def _meter_from(saved: Mapping[str, Any]) -> KeyMeter:
    known = {f.name for f in fields(KeyMeter)}  # a newer version's extra fields are skipped
    return KeyMeter(
        **{
            **{name: value for name, value in saved.items() if name in known},
            "requests": deque(saved.get("requests", ())),
            "tokens": deque((at, used) for at, used in saved.get("tokens", ())),
            "leases": dict(saved.get("leases", {})),
        }
    )


class KvSnapshots:
    """The ledger's snapshot in Ray's internal key-value store (GCS), one record per app."""

    def __init__(self, app: str) -> None:
        self._key = f"ledger/{app}".encode()

    def load(self) -> dict[str, Any] | None:
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(self._key, namespace=KV_NAMESPACE)
        if raw is None:
            return None
        try:
            loaded: dict[str, Any] = json.loads(raw)
        except ValueError:
            logger.warning("key ledger: unreadable snapshot ignored")
            return None
        return loaded

    def save(self, meters: dict[str, Any]) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(
            self._key, json.dumps(meters).encode(), overwrite=True, namespace=KV_NAMESPACE
        )


class LedgerClient(Protocol):
    """How an ingress reaches the ledger: an actor (RayLedger) or one in process (LocalLedger)."""

    async def admit(
        self,
        key: str,
        limits: KeyLimits,
        lease: str,
        lease_s: float,
        settled: Sequence[Settlement],
        want: int,
    ) -> Verdict: ...

    def settle(self, settled: Sequence[Settlement]) -> None:
        """Book usage; sent, not awaited."""

    async def usage(self, limits: Mapping[str, KeyLimits]) -> dict[str, Any]: ...

    async def metrics_text(self) -> bytes: ...


class RayLedger:
    """The app's ledger actor; `settle` is sent and not awaited."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    async def admit(
        self,
        key: str,
        limits: KeyLimits,
        lease: str,
        lease_s: float,
        settled: Sequence[Settlement],
        want: int,
    ) -> Verdict:
        verdict: Verdict = await self._actor.admit.remote(
            key, limits, lease, lease_s, settled, want
        )
        return verdict

    def settle(self, settled: Sequence[Settlement]) -> None:
        self._actor.settle.remote(settled)

    async def usage(self, limits: Mapping[str, KeyLimits]) -> dict[str, Any]:
        usage: dict[str, Any] = await self._actor.usage.remote(dict(limits))
        return usage

    async def metrics_text(self) -> bytes:
        text: bytes = await self._actor.metrics_text.remote()
        return text


class LocalLedger:
    """A ledger in this process (tests, tools): the same decisions, no sharing."""

    def __init__(self, ledger: KeyLedger) -> None:
        self.ledger = ledger

    async def admit(
        self,
        key: str,
        limits: KeyLimits,
        lease: str,
        lease_s: float,
        settled: Sequence[Settlement],
        want: int,
    ) -> Verdict:
        return await self.ledger.admit(key, limits, lease, lease_s, settled, want)

    def settle(self, settled: Sequence[Settlement]) -> None:
        self.ledger.book(settled)

    async def usage(self, limits: Mapping[str, KeyLimits]) -> dict[str, Any]:
        return await self.ledger.usage(limits)

    async def metrics_text(self) -> bytes:
        return await self.ledger.metrics_text()


class MemorySnapshots:
    """A snapshot store in memory (tests; a ledger that need not survive its process)."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] | None = None

    def load(self) -> dict[str, Any] | None:
        return self.saved

    def save(self, meters: dict[str, Any]) -> None:
        self.saved = json.loads(json.dumps(meters))


def ensure_key_ledger(app: str, namespace: str, resources: Mapping[str, float]) -> RayLedger:
    """The app's ledger, started if absent, on the gateway's nodes; one of an older protocol
    is stopped (its meters carry on from the shared snapshot)."""
    stop_older_protocols(lambda n: ledger_actor_name(app, n), PROTOCOL, namespace)
    return RayLedger(gateway_actor(KeyLedger, ledger_actor_name(app), namespace, resources, app))


__all__ = [
    "PROTOCOL",
    "KeyLedger",
    "KvSnapshots",
    "LedgerClient",
    "LocalLedger",
    "MemorySnapshots",
    "RayLedger",
    "SnapshotStore",
    "ensure_key_ledger",
    "ledger_actor_name",
    "replica_key_ledger",
]


def replica_key_ledger(resources: Mapping[str, float]) -> RayLedger:
    """The key ledger of the app this Serve replica belongs to, started by the first replica
    to need it."""
    import ray
    from ray import serve

    app_name = serve.get_replica_context().app_name
    return ensure_key_ledger(app_name, ray.get_runtime_context().namespace, resources)
