"""The app's shared actors beside the gateway (key ledger, key registry, slot broker): one of
each per app, by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def gateway_actor(
    cls: type, name: str, namespace: str, resources: Mapping[str, float], *args: Any
) -> Any:
    """The actor named `name`, started by the first replica to ask, on the gateway's nodes
    (`resources`). Detached: it outlives the replicas that use it, and the app. Ray restarts it
    when it dies and retries the calls made meanwhile."""
    import ray

    return (
        ray.remote(num_cpus=0)(cls)
        .options(
            name=name,
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            max_task_retries=-1,
            resources=dict(resources),
        )
        .remote(*args)
    )
