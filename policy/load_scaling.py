"""How many replicas a backend's load asks for (pure: the Serve policy passes signals and time).

The signal is what the router replicas last reported for the backend, summed: requests waiting
in their queues for it, requests running on it, and the highest KV cache usage they read on its
replicas. A backend's replicas each take `per_replica_cap` requests at once (the router's cap
over the model's `replicas`), so

- **up**, when more wait than `target_queue_per_replica` per replica, or the KV cache is past
  `kv_high` while requests wait, without a break for `upscale_delay_s`: enough replicas at once
  to take the excess (a burst of 40 needs one decision, not ten), at most `max_replicas`; never
  while replicas asked for are still starting (the queue waits for them, it is not excess);
- **down** by one, when nothing waits and the running requests fit on one replica fewer with
  room to spare (`DOWN_FILL` of their slots), for `downscale_delay_s`; at least `min_replicas`.

A step restarts both timers, so the next step waits its full delay again. With no fresh report
(no router running, or all silent past `stale_after_s`) nothing changes: a count is never
decided on a guess.

With `scale_to_zero_after_s`, a backend with nothing waiting and nothing running for that long
goes to **zero** (asleep: its GPU given back), whatever its count, in two steps. First the
decision to sleep is announced with the replicas still up; the routers hold the backend asleep
(no new work, no KV reading) and say so in their reports. Only when every fresh report says so
(or after `SLEEP_NOTICE_MAX_S`) does the count go to zero: a call the routers sent to a
deployment with no replica would wait in Serve's handle, and Serve answers such a waiting call
with a replica at once, bypassing this policy (its "cold start"): the sleep would undo itself.
A request reported during the notice calls the sleep off. Asleep, it **wakes** to
`min_replicas` as soon as a router reports a request for it (waiting, or already sent in the
moment before the router heard of the sleep), without the upscale delay (the request is already
waiting for it). Idleness is not counted while replicas start: a woken backend whose requests
went elsewhere meanwhile is not put back to sleep before its replica has run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

__all__ = [
    "DOWN_FILL",
    "SLEEP_NOTICE_MAX_S",
    "LoadReport",
    "LoadScalingPolicy",
    "ScalingDecision",
    "ScalingTimers",
    "decide_replicas",
    "sum_reports",
]

# Down only when what runs would fill at most this share of one replica fewer: hysteresis
# against stepping down into a queue.
DOWN_FILL = 0.5
# Routers that have not said they hold a backend asleep by then (silent, or of an older
# version) are not waited for: they read the decision once a second.
SLEEP_NOTICE_MAX_S = 30.0


@dataclass(frozen=True)
class LoadScalingPolicy:
    min_replicas: int
    max_replicas: int
    per_replica_cap: int
    target_queue_per_replica: float
    kv_high: float
    upscale_delay_s: float
    downscale_delay_s: float
    scale_to_zero_after_s: float | None = None
    stale_after_s: float = 10.0

    @property
    def sleeps(self) -> bool:
        return self.scale_to_zero_after_s is not None


@dataclass(frozen=True)
class LoadReport:
    """One router replica's view of one backend at `at` (wall-clock seconds)."""

    at: float
    waiting: int
    running: int
    kv_usage: float | None = None
    # The router holds the backend asleep: it sends it nothing, not even a KV reading.
    asleep: bool = False


def sum_reports(
    reports: Iterable[LoadReport], now: float, stale_after_s: float
) -> LoadReport | None:
    """The routers' fresh reports as one; None when none is fresh."""
    fresh = [r for r in reports if now - r.at <= stale_after_s]
    if not fresh:
        return None
    usages = [r.kv_usage for r in fresh if r.kv_usage is not None]
    return LoadReport(
        at=min(r.at for r in fresh),
        waiting=sum(r.waiting for r in fresh),
        running=sum(r.running for r in fresh),
        kv_usage=max(usages) if usages else None,
        asleep=all(r.asleep for r in fresh),
    )


@dataclass(frozen=True)
class ScalingTimers:
    """Since when the load has asked, without a break, for more (up) or fewer (down), since
    when nothing has waited or run (idle: counted across steps, for sleep), and since when the
    routers have been told of a sleep while the replicas are still up."""

    up_since: float | None = None
    down_since: float | None = None
    idle_since: float | None = None
    sleep_called: float | None = None


@dataclass(frozen=True)
class ScalingDecision:
    replicas: int
    timers: ScalingTimers
    # Why the count changed, or what the routers must hear (a sleep announced, or called off),
    # for the log and the metrics' direction; "" when there is nothing to tell. The step to
    # zero after a sleep's notice tells nothing: the routers hold the backend asleep already.
    reason: str = ""

    @property
    def direction(self) -> str:
        return self.reason.split(":", 1)[0] if self.reason else ""


def decide_replicas(
    policy: LoadScalingPolicy,
    current: int,
    load: LoadReport | None,
    timers: ScalingTimers,
    now: float,
    starting: bool = False,
) -> ScalingDecision:
    """The count for the backend asked to run `current` replicas (zero: asleep, where the
    policy sleeps). `starting`: some of them are not running yet; the queue they will take is
    not excess, so no step up until they run."""
    if current == 0 and policy.sleeps:
        return _asleep(policy, load)
    if timers.sleep_called is not None:
        return _sleep_called(current, load, timers, timers.sleep_called, now)
    bounded = min(max(current, policy.min_replicas), policy.max_replicas)
    if bounded != current:
        return ScalingDecision(bounded, ScalingTimers(), f"bounds: {current} -> {bounded}")
    if load is None:
        return ScalingDecision(current, ScalingTimers())
    idle_since = None if starting else _idle_since(load, timers, now)
    if (
        policy.scale_to_zero_after_s is not None
        and idle_since is not None
        and now - idle_since >= policy.scale_to_zero_after_s
    ):
        why = f"sleep: idle for {now - idle_since:.0f}s"
        return ScalingDecision(current, ScalingTimers(sleep_called=now), why)
    decision = _by_load(policy, current, load, timers, now, starting)
    return replace(decision, timers=replace(decision.timers, idle_since=idle_since))


def _asleep(policy: LoadScalingPolicy, load: LoadReport | None) -> ScalingDecision:
    """At zero: wake when a router holds a request for the backend, else stay asleep."""
    if load is None or not (load.waiting or load.running):
        return ScalingDecision(0, ScalingTimers())
    why = f"wake: {load.waiting} waiting" + (f", {load.running} sent" if load.running else "")
    return ScalingDecision(policy.min_replicas, ScalingTimers(), why)


def _sleep_called(
    current: int, load: LoadReport | None, timers: ScalingTimers, called: float, now: float
) -> ScalingDecision:
    """Announced asleep, replicas still up: zero once every router holds it asleep; a request
    meanwhile calls the sleep off (the replicas are still there to take it)."""
    if load is not None and (load.waiting or load.running):
        why = f"wake: {load.waiting} waiting, {load.running} running (the sleep called off)"
        return ScalingDecision(current, ScalingTimers(), why)
    if (load is not None and load.asleep) or now - called >= SLEEP_NOTICE_MAX_S:
        return ScalingDecision(0, ScalingTimers())
    return ScalingDecision(current, timers)


def _idle_since(load: LoadReport, timers: ScalingTimers, now: float) -> float | None:
    if load.waiting or load.running:
        return None
    return timers.idle_since if timers.idle_since is not None else now


def _by_load(
    policy: LoadScalingPolicy,
    current: int,
    load: LoadReport,
    timers: ScalingTimers,
    now: float,
    starting: bool,
) -> ScalingDecision:
    wanted_up = current if starting else _wanted_up(policy, current, load)
    if wanted_up > current:
        since = timers.up_since if timers.up_since is not None else now
        if now - since >= policy.upscale_delay_s:
            why = f"up: {load.waiting} waiting, {load.running} running on {current}"
            if load.kv_usage is not None and load.kv_usage >= policy.kv_high:
                why += f", KV cache {load.kv_usage:.0%}"
            return ScalingDecision(wanted_up, ScalingTimers(), why)
        return ScalingDecision(current, ScalingTimers(up_since=since))
    if _fits_on_fewer(policy, current, load):
        since = timers.down_since if timers.down_since is not None else now
        if now - since >= policy.downscale_delay_s:
            why = f"down: {load.running} running fit on {current - 1}"
            return ScalingDecision(current - 1, ScalingTimers(), why)
        return ScalingDecision(current, ScalingTimers(down_since=since))
    return ScalingDecision(current, replace(timers, up_since=None, down_since=None))


def _wanted_up(policy: LoadScalingPolicy, current: int, load: LoadReport) -> int:
    if current >= policy.max_replicas or load.waiting == 0:
        return current
    excess = load.waiting - policy.target_queue_per_replica * current
    kv_full = load.kv_usage is not None and load.kv_usage >= policy.kv_high
    if excess <= 0 and not kv_full:
        return current
    more = max(1, math.ceil(max(excess, 0) / policy.per_replica_cap))
    return min(policy.max_replicas, current + more)


def _fits_on_fewer(policy: LoadScalingPolicy, current: int, load: LoadReport) -> bool:
    if current <= policy.min_replicas or load.waiting > 0:
        return False
    return load.running <= DOWN_FILL * policy.per_replica_cap * (current - 1)
