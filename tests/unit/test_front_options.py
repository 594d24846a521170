"""The front replicas' Serve options: Serve's throughput settings in their runtime env, and the
access-log buffer the operator sets where the app is built winning over ours, and the hook that
keeps the libraries Serve loads for others out of them (deployments/light_process.py)."""

from __future__ import annotations

from pathlib import Path

from cluster.backends import build_fallback
from core.config import load_config
from deployments.ingress.front_options import FRONT_ENV_VARS, LOG_BUFFER, front_actor_options
from deployments.light_process import light_process_env


def test_the_front_buffers_a_thousand_access_lines_unless_told_otherwise() -> None:
    options = front_actor_options({"gateway": 0.001}, environ={})
    assert options["runtime_env"]["env_vars"] == {**FRONT_ENV_VARS, **light_process_env()}
    assert options["runtime_env"]["env_vars"][LOG_BUFFER] == "1000"
    assert (options["num_cpus"], options["resources"]) == (0, {"gateway": 0.001})


def test_the_operators_buffer_size_reaches_the_front_replicas() -> None:
    env_vars = front_actor_options({}, environ={LOG_BUFFER: "1"})["runtime_env"]["env_vars"]
    assert env_vars[LOG_BUFFER] == "1"
    assert {k: v for k, v in env_vars.items() if k != LOG_BUFFER} == {
        k: v for k, v in {**FRONT_ENV_VARS, **light_process_env()}.items() if k != LOG_BUFFER
    }


def test_the_fallback_replica_starts_without_the_libraries_serve_loads_for_others() -> None:
    config = load_config(Path(__file__).parents[1] / "e2e" / "gateway.yaml", environ={})
    fallback = build_fallback(config)._bound_deployment  # Serve's: no public accessor
    assert fallback.ray_actor_options["runtime_env"]["env_vars"] == light_process_env()
