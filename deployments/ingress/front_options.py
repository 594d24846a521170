"""Serve options for the replicas in front of the engines (ingress and router).

They only parse, decide and relay, so per-request Serve machinery is most of what they cost, and
on a machine where the engines need every core that is throughput lost (bench/overhead.py). Ray
Serve's throughput-optimized settings, applied to these two deployments only through their
runtime env: handles they open call the next replica over Serve's direct gRPC data plane
instead of a Ray actor task; user code runs on the replica's own event loop and handle routing
on it too (no thread hop per call and per item; our code never blocks its loop: fitting runs on
a worker thread); access-log lines are buffered instead of flushed one by one, unless the
operator set how many (`RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE` where the app is built: 1 writes
each line to the replica's log file as it comes, which the throughput mode, writing none to
stderr, needs for a log read as it grows). And they start without the libraries Serve loads for
others (deployments/light_process.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from deployments.light_process import light_process_env

LOG_BUFFER = "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE"
FRONT_ENV_VARS = {
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    LOG_BUFFER: "1000",
}


def front_actor_options(
    resources: dict[str, float], environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """No CPU reserved: they must schedule beside the engines on a small machine. `resources`
    keep them on the gateway's nodes (`ClusterConfig.gateway_resources`), never on a pool's.
    `environ`: the builder's, whose own log buffer size wins (a runtime env's variables replace
    the node's, so it would never reach these replicas otherwise)."""
    env_vars = {**FRONT_ENV_VARS, **light_process_env()}
    if environ.get(LOG_BUFFER):
        env_vars[LOG_BUFFER] = environ[LOG_BUFFER]
    return {"num_cpus": 0, "resources": dict(resources), "runtime_env": {"env_vars": env_vars}}
