"""Ray for a test session on a loaded machine: the patient start (cluster/ray_start.py, which
`make run` uses too), Serve's waits for a busy machine, and a stop that reaps what it started.

Serve's own waits are settings, and `use_loaded_machine_settings` gives the processes a test
session starts (its raylets, and so its Serve controller) the ones in LOADED_MACHINE_SETTINGS.
"""

from __future__ import annotations

import gc
import os
import warnings

import ray
from ray import serve

from cluster.ray_start import start_retrying
from tests.suites import NODES_PER_SESSION

__all__ = [
    "haproxy_ports_of_node",
    "start_retrying",
    "stop_serve_and_ray",
    "use_loaded_machine_settings",
]

# Ray and Serve settings (environment variables every process of a test cluster inherits) for
# a 2-core machine where `make test` runs sessions side by side.
LOADED_MACHINE_SETTINGS = {
    # Serve gives a starting HTTP proxy 5 s to answer its readiness check, and kills it after
    # three misses: CI's recovery suite lost its proxy so, with `serve.start` waiting on it
    # (CI's run of 198867b, 2026-11-29). Serve waits (n+1) times this for the n-th restart.
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    # The Serve controller looks at every deployment 10 times a second (0.1 s): in the main
    # suite it took 219 s of CPU in 40 minutes (run of 3e655a4). Twice a second is enough for
    # tests whose waits are in seconds.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    # Serve's throughput mode buffers 1,000 access lines before it writes them; tests that read
    # which replica answered (tests/placement) read them at once.
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
    # As `make run`: no ray.llm telemetry actor (vLLM and torch in one more process per cluster).
    "RAY_USAGE_STATS_ENABLED": "0",
}


# Under Serve's throughput mode (RAY_SERVE_ENABLE_HA_PROXY=1) each node with a proxy runs an
# HAProxy that binds these ports of its machine (Ray's defaults; tests/suites.py gives each
# session its own, ten apart).
HAPROXY_PORTS = {"RAY_SERVE_HAPROXY_METRICS_PORT": 9101, "RAY_SERVE_HAPROXY_STATS_PORT": 8404}


def haproxy_ports_of_node(index: int) -> dict[str, str]:
    """The environment of a cluster's `index`-th node (the head is 0) on this machine: the
    session's HAProxy ports moved by `index`, or the second node's HAProxy would die binding the
    head's (a gateway on every node, `proxy_location: EveryNode`)."""
    if not 0 <= index < NODES_PER_SESSION:
        raise ValueError(f"node {index}: a session's ports leave room for {NODES_PER_SESSION}")
    return {var: str(int(os.environ.get(var, base)) + index) for var, base in HAPROXY_PORTS.items()}


def use_loaded_machine_settings() -> None:
    """LOADED_MACHINE_SETTINGS in this process's environment, for the Ray processes it starts
    later; a value already set (by whoever runs the tests) stays."""
    for name, value in LOADED_MACHINE_SETTINGS.items():
        os.environ.setdefault(name, value)


def stop_serve_and_ray() -> None:
    """`serve.shutdown()`, then `ray.shutdown()` of the node this process started, each of its
    processes reaped before it returns. Ray kills a process that outlives its SIGTERM by 1 s and
    by default waits 1 s more for it; on a loaded machine it may not have ended by then, and its
    Popen, dropped, warns "still running" in whatever test runs then: four did in the batch
    suite's restart, mid-test (CI's run of e176735, 2026-11-29). `wait_for_processes` waits up to
    30 s for each. One stuck past that (uninterruptible sleep) is Ray's to report, not a leak of
    ours: the suites' own process checks count what is left."""
    serve.shutdown()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        ray.shutdown(wait_for_processes=True)
        gc.collect()  # a Popen in a reference cycle is dropped here, quietly
