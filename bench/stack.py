"""The benchmarks' stage: one Ray Serve instance with the anchor and our gateway side by side.

The anchor is bare `ray.serve.llm` (`build_openai_app`) at /anchor; our gateway (Ingress ->
Router) at / reaches the anchor's own LLMServer replicas by deployment handle, so engines, caches
and placement are shared and only the path in front of them differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.serve.llm import LLMServer, build_openai_app

from cluster.app import build_gateway
from cluster.backends import llm_config_for
from cluster.ray_runtime import SERVE_NAMESPACE, local_pool_resources
from core.config import ClusterConfig, load_config
from deployments.engine.llm_server import ObservedLLMServer

# Logical CPUs for the local head: the engines' placement bundles and the front replicas must
# all schedule on this 2-core machine (they share the real cores either way).
LOGICAL_CPUS = 8
ANCHOR_APP = "anchor"
GATEWAY_APP = "gateway"


@dataclass(frozen=True)
class Stage:
    config: ClusterConfig
    base_url: str
    # The anchor's replicas by backend name, where `stage` deployed them.
    anchor: Mapping[str, DeploymentHandle] = field(default_factory=dict)

    @property
    def anchor_url(self) -> str:
        return f"{self.base_url}/{ANCHOR_APP}/v1/chat/completions"

    @property
    def gateway_url(self) -> str:
        return f"{self.base_url}/v1/chat/completions"


def load(config_path: Path, overrides: Mapping[str, Any] | None = None) -> ClusterConfig:
    """The bench's config, with `overrides` (nested keys) laid over the file's."""
    return load_config(config_path, environ={}, overrides=overrides)


def start(
    config_path: Path, port: int, overrides: Mapping[str, Any] | None = None
) -> ClusterConfig:
    config = load(config_path, overrides)
    ray.init(
        address="local",  # our own cluster, whatever a dead one left in /tmp/ray
        namespace=SERVE_NAMESPACE,
        num_cpus=LOGICAL_CPUS,
        resources=local_pool_resources(config),
    )
    # The proxy must be up before the engines load (docs/design.md, environment facts).
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return config


def deploy_anchor(
    config: ClusterConfig,
    names: tuple[str, ...] = (),
    server_cls: type[LLMServer] = ObservedLLMServer,
) -> dict[str, DeploymentHandle]:
    """Bare ray.serve.llm over the home backends (or those named); their replica handles.
    `server_cls` is ours by default: the gateway's backends speak its wire types
    (core/requests.py, core/answers.py), and it answers the anchor's own OpenAiIngress in vLLM's
    objects, as ray.serve.llm's LLMServer does (deployments/engine/llm_server.py)."""
    backends = [b for b in config.home_backends if not names or b.name in names]
    llm_configs = [
        llm_config_for(config, b, placed=False).model_copy(update={"server_cls": server_cls})
        for b in backends
    ]
    serve.run(
        build_openai_app({"llm_configs": llm_configs}),
        name=ANCHOR_APP,
        route_prefix=f"/{ANCHOR_APP}",
    )
    # build_llm_deployment names each deployment after the server class + our name.
    return {
        b.name: serve.get_deployment_handle(f"{server_cls.__name__}:{b.name}", app_name=ANCHOR_APP)
        for b in backends
    }


def deploy_gateway(
    config: ClusterConfig, backends: Mapping[str, Any], name: str = GATEWAY_APP
) -> None:
    """Our gateway over `backends` (handles to running replicas, or bound deployments), at `/`
    or, under another `name`, at `/<name>`."""
    prefix = "/" if name == GATEWAY_APP else f"/{name}"
    serve.run(build_gateway(config, backends), name=name, route_prefix=prefix)


def stage(
    config_path: Path,
    port: int,
    overrides: Mapping[str, Any] | None = None,
    server_cls: type[LLMServer] = ObservedLLMServer,
) -> Stage:
    """Anchor and gateway over the same replicas of every home backend."""
    config = start(config_path, port, overrides)
    anchor = deploy_anchor(config, server_cls=server_cls)
    deploy_gateway(config, anchor)
    return Stage(config, f"http://127.0.0.1:{port}", anchor)


def stop() -> None:
    serve.shutdown()
    ray.shutdown()
