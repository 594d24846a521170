"""Turn a `role@pool` backend of our config into a `ray.serve.llm` LLMServer deployment."""

from __future__ import annotations

from typing import Any

from ray.serve.deployment import Application
from ray.serve.llm import LLMConfig, build_llm_deployment

from cluster.config import DEPLOYMENT_PREFIX, Backend, ClusterConfig
from deployments.llm_server import ObservedLLMServer

# A sliver of the pool resource pins a replica to the pool's nodes without limiting how many
# replicas a node takes (DESIGN.md section 5).
POOL_RESOURCE_SLIVER = 0.001


def llm_config_for(config: ClusterConfig, backend: Backend) -> LLMConfig:
    model = config.model_for(backend.role)
    pool_resource = {config.pool(backend.pool).resource: POOL_RESOURCE_SLIVER}
    options: dict[str, Any] = {
        "name": backend.name,
        "num_replicas": model.replicas,
        # The replica actor itself needs no CPU of its own: the engine's bundle carries it.
        "ray_actor_options": {"num_cpus": 0, "resources": pool_resource},
    }
    llm_config: dict[str, Any] = {
        "model_loading_config": {
            # The id vLLM answers to; the router rewrites `model` to it.
            "model_id": backend.role.value,
            "model_source": config.resolve_path(model.source),
        },
        "engine_kwargs": {"max_model_len": model.context_window, **model.engine_kwargs},
        "deployment_config": options,
        "runtime_env": {"env_vars": dict(model.env_vars)},
    }
    if model.device == "cpu":
        llm_config["placement_group_config"] = {"bundles": [{"CPU": model.cpus_per_replica}]}
    return LLMConfig(**llm_config)


def build_backend(config: ClusterConfig, backend: Backend) -> Application:
    return build_llm_deployment(
        llm_config_for(config, backend),
        name_prefix=DEPLOYMENT_PREFIX,
        deployment_cls=ObservedLLMServer,
    )
