"""Serve handles for a driver: code that calls `.remote().result()` outside any event loop
(`make reload`, a test).

Serve's throughput mode (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`) runs a handle's router in the
caller's own event loop unless told otherwise, which a replica has and a driver does not: there
the first call fails with "No event loop running". Such a driver's handle keeps Serve's default
(its router on a loop of its own); the replicas' handles keep the mode's."""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle


def for_driver(handle: DeploymentHandle[Any]) -> DeploymentHandle[Any]:
    # `_init` is Serve's one per-handle way to choose (the environment variable would change
    # every process the driver starts too); it must come before the first `.remote()`. Serve
    # hands a driver the same handle again for the same deployment: that one is set already.
    if not handle.is_initialized:
        handle._init(_run_router_in_separate_loop=True)
    elif not handle.init_options._run_router_in_separate_loop:
        raise RuntimeError(
            f"{handle.deployment_name}'s handle was used before cluster.driver_handles set it up, "
            "with its router on the caller's loop: make it with driver_handles first"
        )
    return handle


def deployment_handle(deployment: str, app: str) -> DeploymentHandle[Any]:
    return for_driver(serve.get_deployment_handle(deployment, app_name=app))


def app_handle(app: str) -> DeploymentHandle[Any]:
    return for_driver(serve.get_app_handle(app))
