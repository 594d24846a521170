"""Serve options for the replicas in front of the engines (ingress and router).

They only parse, decide and relay, so per-request Serve machinery is most of what they cost, and
on a machine where the engines need every core that is throughput lost (bench/overhead.py). Ray
Serve's throughput-optimized settings, applied to these two deployments only through their
runtime env: handles they open call the next replica over Serve's direct gRPC data plane
instead of a Ray actor task; user code runs on the replica's own event loop and handle routing
on it too (no thread hop per call and per item; our code never blocks its loop: fitting runs on
a worker thread); access-log lines are buffered instead of flushed one by one.
"""

from __future__ import annotations

from typing import Any

FRONT_ENV_VARS = {
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
}


def front_actor_options(resources: dict[str, float]) -> dict[str, Any]:
    """No CPU reserved: they must schedule beside the engines on a small machine. `resources`
    keep them on the gateway's nodes (`ClusterConfig.gateway_resources`), never on a pool's."""
    return {
        "num_cpus": 0,
        "resources": dict(resources),
        "runtime_env": {"env_vars": dict(FRONT_ENV_VARS)},
    }
