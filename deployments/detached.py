"""The app's shared actors beside the gateway (key ledger, key registry, slot broker): one of
each per app, by name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("ray.serve")


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


def stop_older_protocols(name_of: Callable[[int], str], protocol: int, namespace: str) -> None:
    """Stop the detached actors named `name_of(n)` for every protocol n before `protocol`: one
    outlives an upgrade of the app and would read the new callers' calls wrong."""
    import ray

    for older in range(1, protocol):
        try:
            ray.kill(ray.get_actor(name_of(older), namespace), no_restart=True)
            logger.warning("stopped %s, of protocol %d", name_of(older), older)
        except ValueError:  # none of that protocol
            pass
