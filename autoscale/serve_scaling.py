"""The Serve autoscaling policy that carries out placement and load decisions.

Every `model@pool` deployment is built with `ReplicaPolicy`. A model with neither placement
nor load keeps the count it starts with, until a reload removes it: `retire` then takes it to
zero for good (cluster/reload.py). Otherwise placement decides the pool (the count the
placement actor last asked for there, read from Ray's internal key-value store, GCS: zero
means not here), and where the model has
`autoscaling`, load decides the count on it (policy/load_scaling.py) from what the router
replicas report there once a second. Serve applies a policy's answer to that deployment alone,
without touching `ray_actor_options`, so no other replica restarts. With nothing asked yet, a
deployment keeps the count it has.

A deployment at zero is parked by placement (asked 0, or nothing asked from the start) or
asleep by load (`scale_to_zero_after_s`): the policy remembers which, and the routers learn it
from the decision it publishes (`ScalingNews`, direction "sleep"), which also tells a
restarted controller that the zero is its own. The sleep is announced while the replicas are
still up and carried out once the routers report they hold the backend asleep
(policy/load_scaling.py says why).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from core.config import ModelConfig
from core.wire import ScalingNews
from policy.load_scaling import (
    LoadReport,
    LoadScalingPolicy,
    ScalingDecision,
    ScalingTimers,
    decide_replicas,
    sum_reports,
)

logger = logging.getLogger("ray.serve")

KV_NAMESPACE = "gps_placement"
REFRESH_S = 1.0  # Serve asks every control-loop tick (~0.1 s); the store is read once a second
PRUNE_AFTER_S = 600.0  # a router's post this old is from a replica that is gone


def replicas_key(app: str, deployment: str) -> bytes:
    return f"replicas/{app}/{deployment}".encode()


def set_replicas(app: str, deployment: str, replicas: int) -> None:
    """Ask for `replicas` of a deployment (from any Ray worker or driver)."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(
        replicas_key(app, deployment),
        str(replicas).encode(),
        overwrite=True,
        namespace=KV_NAMESPACE,
    )


def asked_replicas(app: str, deployment: str) -> int | None:
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(replicas_key(app, deployment), namespace=KV_NAMESPACE)
    return None if raw is None else int(raw)


@dataclass(frozen=True)
class KvReplicaScaler:
    """The placer's `ReplicaScaler` port for one app's deployments."""

    app: str

    def set_replicas(self, deployment: str, replicas: int) -> None:
        set_replicas(self.app, deployment, replicas)

    def asked_replicas(self, deployment: str) -> int | None:
        return asked_replicas(self.app, deployment)


def retired_key(app: str, deployment: str) -> bytes:
    return f"retired/{app}/{deployment}".encode()


def retire(app: str, deployment: str, build: str) -> None:
    """Take a deployment of `build` (a model a reload removed or replaced) to zero replicas for
    good: its policy answers 0 whatever placement or load ask. A later build of the app (a new
    `make run`) carries another token, so the mark never reaches its deployments."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(
        retired_key(app, deployment), build.encode(), overwrite=True, namespace=KV_NAMESPACE
    )


def retired_by(app: str, deployment: str) -> str | None:
    """The build whose deployment of this name was retired, if any."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(retired_key(app, deployment), namespace=KV_NAMESPACE)
    return None if raw is None else raw.decode()


def load_key(app: str, router: str) -> bytes:
    return f"load/{app}/{router}".encode()


def publish_load(app: str, router: str, at: float, backends: Mapping[str, LoadReport]) -> None:
    """A router replica's view of each backend deployment's load at `at` (wall clock)."""
    from ray.experimental.internal_kv import _internal_kv_put

    body = {
        "at": at,
        "backends": {
            n: [r.at, r.waiting, r.running, r.kv_usage, r.asleep] for n, r in backends.items()
        },
    }
    _internal_kv_put(
        load_key(app, router), json.dumps(body).encode(), overwrite=True, namespace=KV_NAMESPACE
    )


def read_load(app: str, deployment: str, now: float) -> list[LoadReport]:
    """Every router replica's last report on one deployment (stale ones included); the posts
    of routers gone for PRUNE_AFTER_S (restarted, scaled down) are deleted."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_list

    reports = []
    for key in _internal_kv_list(f"load/{app}/".encode(), namespace=KV_NAMESPACE):
        raw = _internal_kv_get(key, namespace=KV_NAMESPACE)
        body = json.loads(raw) if raw else {}
        if now - float(body.get("at", 0)) > PRUNE_AFTER_S:
            _internal_kv_del(key, namespace=KV_NAMESPACE)
            continue
        entry = body.get("backends", {}).get(deployment)
        if entry is not None:
            at, waiting, running, kv, *asleep = entry  # no `asleep` from an older router
            reports.append(LoadReport(at, waiting, running, kv, bool(asleep and asleep[0])))
    return reports


def scaled_key(app: str, deployment: str) -> bytes:
    return f"scaled/{app}/{deployment}".encode()


def publish_scaled(app: str, deployment: str, news: ScalingNews) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(
        scaled_key(app, deployment),
        json.dumps(asdict(news)).encode(),
        overwrite=True,
        namespace=KV_NAMESPACE,
    )


def read_scaled(app: str, deployment: str) -> ScalingNews | None:
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(scaled_key(app, deployment), namespace=KV_NAMESPACE)
    return None if raw is None else ScalingNews(**json.loads(raw))


class ReplicaPolicy:
    """Serve's custom autoscaling policy (`AutoscalingConfig.policy`, a class: Serve makes one
    per deployment with `policy_kwargs` and calls it every control-loop tick).

    `load`: the model's LoadScalingPolicy fields, or None for placement alone; `build`: the
    app build's token (cluster/app.py), which a reload's `retire` names."""

    def __init__(self, load: Mapping[str, Any] | None = None, build: str = "") -> None:
        self._load = LoadScalingPolicy(**load) if load else None
        self._build = build
        self._retired = False
        self._timers = ScalingTimers()
        self._asked: int | None = None
        self._reports: list[LoadReport] = []
        self._read_at = float("-inf")
        self._decisions: int | None = None  # the last published number, once known
        # At zero by our own decision (load's sleep), not placement's: None until the first read
        # of the store, which recovers it after a controller restart.
        self._asleep: bool | None = None

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        now = ctx.current_time if ctx.current_time is not None else time.time()
        app, deployment = ctx.app_name or "", ctx.deployment_name
        if now - self._read_at >= REFRESH_S:
            self._read_at = now
            self._read(app, deployment, now)
        current = int(ctx.target_num_replicas)
        if self._retired:  # removed from the app by a reload: the routers send it nothing
            return 0, {}
        asked = self._asked
        asleep = bool(self._asleep) and current == 0
        # Placement alone; placed elsewhere; or parked since the start, before placement's
        # first word: placement's count (or the one it has), whatever the load.
        if self._load is None or asked == 0 or (asked is None and current == 0 and not asleep):
            self._timers = ScalingTimers()
            self._placed(app, deployment, asked if asked is not None else current)
            return (asked if asked is not None else current), {}
        if current == 0 and asked is not None and not asleep:  # placement brought the role
            return asked, {}
        if self._asleep and current:
            self._woken_by_serve(app, deployment, current)
        load = sum_reports(self._reports, now, self._load.stale_after_s)
        starting = int(ctx.current_num_replicas) < current
        decision = decide_replicas(self._load, current, load, self._timers, now, starting)
        self._timers = decision.timers
        self._asleep = decision.replicas == 0
        if decision.replicas != current or decision.reason:
            self._announce(app, deployment, current, decision)
        return decision.replicas, {}

    def _read(self, app: str, deployment: str, now: float) -> None:
        """Placement's count and the routers' load; on a failed read, the last ones (this runs
        in Serve's controller: an exception here would stall every app's control loop)."""
        try:
            if self._build:
                self._retired = retired_by(app, deployment) == self._build
            self._asked = asked_replicas(app, deployment)
            if self._load is not None:
                self._reports = read_load(app, deployment, now)
            if self._asleep is None and self._load is not None and self._load.sleeps:
                news = read_scaled(app, deployment)
                self._asleep = news is not None and news.direction == "sleep"
        except Exception as error:  # noqa: BLE001 - GCS busy or a malformed post: next second
            logger.warning("autoscaling %s: reading the store failed: %r", deployment, error)

    def _placed(self, app: str, deployment: str, replicas: int) -> None:
        """Placement's count rules now: a sleep of ours is over, and the routers (and a
        restarted controller) must not take the last published sleep for the state of things."""
        if self._asleep:
            reason = f"placed: {replicas} asked by placement"
            self._publish(app, deployment, ScalingDecision(replicas, ScalingTimers(), reason))
        self._asleep = False

    def _woken_by_serve(self, app: str, deployment: str, current: int) -> None:
        """Asleep by our decision, yet replicas asked: Serve's cold start (a call reached the
        deployment's handle while it slept: Serve brings a replica without asking the policy),
        or a sleep announced before a controller restart. Either way it is awake now, and the
        routers, who hold it asleep while the last news says so, must hear it."""
        self._asleep = False
        self._timers = ScalingTimers()
        reason = f"wake: {current} replicas asked without this policy (Serve's cold start)"
        self._announce(app, deployment, 0, ScalingDecision(current, ScalingTimers(), reason))

    def _announce(self, app: str, deployment: str, current: int, decision: ScalingDecision) -> None:
        """Log a change of count; publish what the routers must hear (a step to zero after a
        sleep's notice has nothing new: the routers hold the backend asleep already)."""
        logger.info("autoscaling %s: %d -> %d (%s)", deployment, current, decision.replicas,
                    decision.reason or "the routers hold it asleep")  # fmt: skip
        if decision.reason:
            self._publish(app, deployment, decision)

    def _publish(self, app: str, deployment: str, decision: ScalingDecision) -> None:
        try:
            if self._decisions is None:
                # Serve makes a new policy when its controller restarts: go on from the last
                # published number, or a router that saw it would take the next for old news.
                last = read_scaled(app, deployment)
                self._decisions = last.seq if last is not None else 0
            self._decisions += 1
            news = ScalingNews(
                self._decisions, decision.replicas, decision.direction, decision.reason
            )
            publish_scaled(app, deployment, news)
        except Exception as error:  # noqa: BLE001 - only the routers' count misses it
            logger.warning("autoscaling %s: publishing the decision failed: %r", deployment, error)


def policy_kwargs(model: ModelConfig, build: str = "") -> dict[str, Any]:
    """`ReplicaPolicy`'s kwargs for a model's backends (JSON, as Serve requires)."""
    built = {"build": build} if build else {}
    scaling = model.autoscaling
    if scaling is None:
        return built
    # The config's keys are the policy's fields (but for what the router alone does with a
    # request for a backend asleep); the cap per replica comes from the model.
    fields = scaling.model_dump(exclude={"when_asleep", "wake_timeout_s"})
    load = LoadScalingPolicy(**fields, per_replica_cap=model.per_replica_cap)
    return {"load": asdict(load), **built}
