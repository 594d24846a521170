"""The Serve autoscaling policy that carries out placement decisions.

Every `role@pool` deployment is built with this policy: it runs as many replicas as the
placement actor last asked for, read from Ray's internal key-value store (GCS). Serve applies a
policy's answer to that deployment alone, without touching `ray_actor_options`, so no other
replica restarts. With no answer stored yet, a deployment keeps the count it started with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KV_NAMESPACE = "gps_placement"
REFRESH_S = 1.0  # Serve asks every control-loop tick (~0.1 s); the store is read once a second


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


def placement_policy(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Serve's custom autoscaling policy hook (`AutoscalingConfig.policy`)."""
    state = dict(ctx.policy_state or {})
    now = ctx.current_time
    if now is None or now - state.get("gps_read_at", float("-inf")) >= REFRESH_S:
        asked = asked_replicas(ctx.app_name or "", ctx.deployment_name)
        state["gps_replicas"] = (
            asked if asked is not None else state.get("gps_replicas", ctx.target_num_replicas)
        )
        state["gps_read_at"] = now if now is not None else 0.0
    return int(state["gps_replicas"]), state
