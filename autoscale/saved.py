"""Where the placement actor last put each model, kept in Ray's internal key-value store (GCS).

The actor is detached and restartable; Serve keeps running the replica counts it asked for
(`policy.py`) whatever happens to it. A restarted actor, or one started again by a new router
replica, must carry on from those placements, not send every model home at once: that would
scale the serving deployments to zero before their home pools are up. The record is tied to the
config it was made under; a different config starts from the home pools.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoscale.policy import KV_NAMESPACE

if TYPE_CHECKING:
    from cluster.config import ClusterConfig


def config_fingerprint(config: ClusterConfig) -> str:
    """The same for equal configs in any process (sorted keys, no hash-seeded order)."""
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _key(app: str) -> bytes:
    return f"placements/{app}".encode()


def save_placements(
    app: str, fingerprint: str, pools: dict[str, str], moves: Sequence[dict[str, Any]] = ()
) -> None:
    """Record each role's pool (role -> pool name), and the moves' records, under the config's
    fingerprint."""
    from ray.experimental.internal_kv import _internal_kv_put

    record = json.dumps({"config": fingerprint, "pools": pools, "moves": list(moves)}).encode()
    _internal_kv_put(_key(app), record, overwrite=True, namespace=KV_NAMESPACE)


def saved_placements(
    app: str, fingerprint: str
) -> tuple[dict[str, str], list[dict[str, Any]]] | None:
    """The recorded placements and moves, if recorded under this config."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(_key(app), namespace=KV_NAMESPACE)
    if raw is None:
        return None
    record = json.loads(raw)
    if record.get("config") != fingerprint:
        return None
    return dict(record["pools"]), list(record.get("moves", []))
