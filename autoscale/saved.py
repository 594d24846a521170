"""Where the placement actor last put each model, kept in Ray's internal key-value store (GCS).

The actor is detached and restartable; Serve keeps running the replica counts it asked for
(`policy.py`) whatever happens to it. A restarted actor, or one started again by a new router
replica, must carry on from those placements, not send every model home at once: that would
scale the serving deployments to zero before their home pools are up. The placements are tied to
the config they were made under (a different config starts from the home pools); the view's
version is kept whatever the config, so a new incarnation never publishes a version a router
replica has already applied.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autoscale.serve_scaling import KV_NAMESPACE

if TYPE_CHECKING:
    from core.config import ClusterConfig


def config_fingerprint(config: ClusterConfig) -> str:
    """The same for equal configs in any process (sorted keys, no hash-seeded order)."""
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SavedPlacements:
    config: str  # the fingerprint of the config the placements were made under
    pools: dict[str, str]  # model name -> the pool it serves on
    version: int  # the latest view version published
    moves: list[dict[str, Any]] = field(default_factory=list)


def _key(app: str) -> bytes:
    return f"placements/{app}".encode()


def save_placements(app: str, saved: SavedPlacements) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    record = json.dumps(asdict(saved)).encode()
    _internal_kv_put(_key(app), record, overwrite=True, namespace=KV_NAMESPACE)


def saved_placements(app: str) -> SavedPlacements | None:
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(_key(app), namespace=KV_NAMESPACE)
    return None if raw is None else SavedPlacements(**json.loads(raw))


@dataclass(frozen=True)
class KvPlacementStore:
    """The placer's `PlacementStore` port for one app."""

    app: str

    def load(self) -> SavedPlacements | None:
        return saved_placements(self.app)

    def save(self, saved: SavedPlacements) -> None:
        save_placements(self.app, saved)
