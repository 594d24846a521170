"""Turn our config into model deployments: a `ray.serve.llm` LLMServer per `model@pool` backend
(with its LoRA adapters), and the CPU fallback replica."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.deployment import Application
from ray.serve.llm import LLMConfig, LLMServer, build_llm_deployment

from autoscale.placer import placement_matters
from autoscale.serve_scaling import ReplicaPolicy, policy_kwargs
from core.config import ClusterConfig, ModelConfig
from core.topology import RESOURCE_SLIVER, Backend, fallback_mmproj
from core.types import DEPLOYMENT_PREFIX
from deployments.engine.adapters import ADAPTERS_ENV
from deployments.engine.llm_server import ObservedLLMServer
from deployments.engine.node_init import node_init_config
from deployments.engine.parent_death import ENV as PARENT_DEATH_ENV
from deployments.engine.shm_spin import CPU_ENGINE_S as CPU_ENGINE_SPIN_S
from deployments.engine.shm_spin import ENV as SHM_SPIN_ENV
from deployments.fallback.replica import CpuFallback, FallbackSettings
from deployments.light_process import light_process_env
from deployments.log_options import serve_logging
from deployments.router.adapters.replica_choice import ROUTER_PATH
from policy.cpu_dtype import CPU_DTYPE_ENV

# A sliver of the pool resource pins a replica to the pool's nodes without limiting how many
# replicas a node takes (docs/design.md, pools and placement).
POOL_RESOURCE_SLIVER = RESOURCE_SLIVER


def llm_config_for(
    config: ClusterConfig, backend: Backend, placed: bool = True, build: str = ""
) -> LLMConfig:
    """The backend's LLMConfig. Its replica count follows `ReplicaPolicy`
    (autoscale/serve_scaling.py): where `placed` (and some model may use more than one pool),
    the placement actor's, home backends starting with the model's replicas and the others at
    zero; where the model autoscales, load's; otherwise the model's replicas, until a reload of
    `build` (the app build's token) retires it."""
    model = config.model_named(backend.model)
    pool_resource = {config.pool(backend.pool).resource: POOL_RESOURCE_SLIVER}
    options: dict[str, Any] = {
        "name": backend.name,
        # The replica actor itself needs no CPU of its own: the engine's bundle carries it.
        "ray_actor_options": {"num_cpus": 0, "resources": pool_resource},
        # Serve learns of a dead replica only from its health check: until then its handles
        # may route to it and hold requests there.
        "health_check_period_s": config.router.replica_health_check_period_s,
        "logging_config": serve_logging(config),
    }
    placement = placed and placement_matters(config)
    home = backend.pool == model.home_pool or not placement
    scaling = model.autoscaling
    options["autoscaling_config"] = {
        # Zero: placement parks a model's backends on the pools it left; load puts an idle
        # one to sleep (scale_to_zero_after_s); a reload retires a removed model's.
        "min_replicas": (
            scaling.min_replicas
            if scaling is not None and scaling.scale_to_zero_after_s is None and not placement
            else 0
        ),
        "max_replicas": model.max_replicas,
        "initial_replicas": model.replicas if home else 0,
        # Serve's delays would hold a decision back; placement and load keep their own.
        "upscale_delay_s": 0,
        "downscale_delay_s": 0,
        # Serve's cold start brings a replica, without asking the policy, when a deployment at
        # zero has requests over the look-back window (30 s) by its handles' samples. The
        # routers send nothing to a backend at zero (requests wait in their queues and the
        # policy wakes it), but a KV reading sampled in flight before a sleep or a park would
        # count under the default mean and wake it for nothing (it did, under make test's
        # load). The window's least sample counts only what waited all of it.
        "aggregation_function": "min",
        "policy": {"policy_function": ReplicaPolicy, "policy_kwargs": policy_kwargs(model, build)},
    }
    if config.router.prefix_routing and model.generates and model.max_replicas > 1:
        slack = config.router.prefix_imbalance
        options["request_router_config"] = {
            "request_router_class": ROUTER_PATH,
            "request_router_kwargs": {
                "imbalanced_threshold": slack,
                "session_slack": slack,
                "do_eviction": True,  # the tree's oldest text goes past ~400k characters
            },
        }
    llm_config: dict[str, Any] = {
        "model_loading_config": {
            # The id vLLM answers to (the model's name); the router rewrites `model` to it.
            "model_id": model.name,
            "model_source": config.resolve_path(model.source),
        },
        "engine_kwargs": {
            "max_model_len": model.context_window,
            # An embedding model runs vLLM's pooling runner (which turns a *ForCausalLM into
            # an embedding model with last-token pooling).
            **({"runner": "pooling"} if not model.generates else {}),
            # Requests carry their class's number (router.engine_priorities); a model's own
            # engine_kwargs may still say otherwise.
            **({"scheduling_policy": "priority"} if config.router.engine_priority else {}),
            **lora_engine_kwargs(config, model),
            **model.engine_kwargs,
            # The gateway sends media inline (it fetches a URL itself, gateway.media): an engine
            # fetches from no host, whatever a request carries (vLLM's allowed_media_domains; a
            # `.invalid` name never resolves), and reads no local file (allowed_local_media_path
            # stays unset). The config refuses either in engine_kwargs.
            "allowed_media_domains": [NO_MEDIA_DOMAIN],
            **image_engine_kwargs(config, model),  # merged with engine_kwargs' own limits
            **tool_engine_kwargs(config, model),
        },
        "deployment_config": options,
        **node_init_config(config.resolve_path(model.source)),
        # The engine's processes die with the replica (deployments/engine/parent_death.py).
        "runtime_env": {
            "env_vars": {
                # A CPU engine's processes sleep between steps instead of spinning on the cores
                # it computes on (deployments/engine/shm_spin.py); env_vars may say otherwise.
                **({SHM_SPIN_ENV: CPU_ENGINE_SPIN_S} if model.device == "cpu" else {}),
                **model.env_vars,
                PARENT_DEATH_ENV: "1",
                **_adapter_env(config, model),
                # The replica picks a CPU engine's dtype on its node (policy/cpu_dtype.py).
                **({CPU_DTYPE_ENV: model.cpu_dtype} if model.device == "cpu" else {}),
            }
        },
    }
    if model.adapters:  # Ray Serve LLM's multiplexing loads them (deployments/engine/adapters)
        llm_config["lora_config"] = {"max_num_adapters_per_replica": len(model.adapters)}
    if model.device == "cpu":
        llm_config["placement_group_config"] = {"bundles": [{"CPU": model.cpus_per_replica}]}
    return LLMConfig(**llm_config)


def image_engine_kwargs(config: ClusterConfig, model: ModelConfig) -> dict[str, Any]:
    """An image-reading engine takes as many images a prompt as the gateway lets through
    (gateway.media.max_images_per_request), beside engine_kwargs' own limits for other media;
    engine_kwargs may set more images, never fewer (the config's check)."""
    if not config.reads_images(model):
        return {}
    limits = {"image": config.gateway.media.max_images_per_request}
    own = model.engine_kwargs.get("limit_mm_per_prompt")
    return {"limit_mm_per_prompt": {**limits, **own} if isinstance(own, dict) else limits}


NO_MEDIA_DOMAIN = "images-come-inline.invalid"  # RFC 2606: a name that never resolves

# vLLM's accepted max_lora_rank values (vllm/config/lora.py, MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_kwargs(config: ClusterConfig, model: ModelConfig) -> dict[str, Any]:
    """vLLM's multi-LoRA for a model with adapters: a slot per adapter, and a rank that holds
    the largest local adapter's (remote ones are not read before start: 16, vLLM's default,
    unless engine_kwargs says more)."""
    if not model.adapters:
        return {}
    ranks = [_adapter_rank(config.adapter_source(a)) for a in model.adapters if not a.remote]
    largest = max(ranks, default=16)
    rank = next((r for r in LORA_RANKS if r >= largest), LORA_RANKS[-1])
    return {"enable_lora": True, "max_loras": len(model.adapters), "max_lora_rank": rank}


def _adapter_rank(folder: str) -> int:
    settings = json.loads((Path(folder) / "adapter_config.json").read_text())
    return int(settings.get("r", 16))


def _adapter_env(config: ClusterConfig, model: ModelConfig) -> dict[str, str]:
    if not model.adapters:
        return {}
    sources = {a.name: config.adapter_source(a) for a in model.adapters}
    return {ADAPTERS_ENV: json.dumps(sources)}


def tool_engine_kwargs(config: ClusterConfig, model: ModelConfig) -> dict[str, Any]:
    """`models[].tools` as vLLM's frontend options (ray.serve.llm passes them to vLLM's
    OpenAI serving layer as `vllm serve` would)."""
    tools = model.tools
    if tools is None:
        return {}
    kwargs: dict[str, Any] = {
        "tool_call_parser": tools.parser,
        "enable_auto_tool_choice": tools.auto_choice,
        "tool_strict_level": "parameter" if tools.strict else "auto",
    }
    if tools.chat_template is not None:
        kwargs["chat_template"] = str(config.tools_template(tools))
    return kwargs


def build_backend(
    config: ClusterConfig,
    backend: Backend,
    server_cls: type[LLMServer] = ObservedLLMServer,
    build: str = "",
    placed: bool = True,
) -> Application:
    return build_llm_deployment(
        llm_config_for(config, backend, placed, build),
        name_prefix=DEPLOYMENT_PREFIX,
        deployment_cls=server_cls,
    )


def fallback_settings(config: ClusterConfig) -> FallbackSettings:
    fallback = config.fallback
    return FallbackSettings(
        engine=fallback.engine,
        source=config.fallback_source,
        mmproj=fallback_mmproj(config),
        model_id=config.fallback_target.model_id,
        context_window=fallback.context_window,
        threads=fallback.threads,
        ollama_model=fallback.ollama_model,
        keep_alive=fallback.keep_alive,
        ollama_models_dir=fallback.ollama_models_dir,
        n_gpu_layers=fallback.n_gpu_layers,
        parallel=fallback.parallel,
        prompt_cache_mib=fallback.prompt_cache_mib,
        chat_template=config.fallback_target.chat_template,
        router=config.router,  # the turns' rules as built; a reload retunes them
    )


FALLBACK_HEALTH_CHECK_PERIOD_S = 10


def build_fallback(config: ClusterConfig, build: str = "") -> Application:
    """The CPU replica every chain ends on: no GPU, on its pool or (with none) beside the
    gateway. It follows `make reload`s of `build` (the app build's token) for its turns."""
    fallback = config.fallback
    actor_options: dict[str, Any] = {
        "num_cpus": fallback.num_cpus,
        "num_gpus": 0,
        "runtime_env": {"env_vars": light_process_env()},
    }
    if fallback.pool is not None:
        actor_options["resources"] = {config.pool(fallback.pool).resource: POOL_RESOURCE_SLIVER}
    else:  # beside the gateway: the last link must not die with a pool's node
        actor_options["resources"] = config.gateway_resources
    deployment = serve.deployment(CpuFallback).options(
        name=config.fallback_target.deployment_name,
        num_replicas=1,
        # The router holds the cap; room above it keeps cancelled requests from blocking Serve.
        max_ongoing_requests=2 * fallback.max_concurrency,
        ray_actor_options=actor_options,
        # Its check fails while its engine child restarts (seconds, with backoff), and three
        # failed checks in a row stop the replica: Serve's default period leaves that room.
        health_check_period_s=FALLBACK_HEALTH_CHECK_PERIOD_S,
        logging_config=serve_logging(config),
    )
    return deployment.bind(fallback_settings(config), build=build)
