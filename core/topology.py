"""What a config deploys and routes to: backends (`model@pool`), chain targets, chains.

Derived from the config, never written by hand; `ClusterConfig` exposes these as properties.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from core.config.base import Frozen
from core.types import AUTO_MODEL, DEPLOYMENT_PREFIX, FALLBACK_BACKEND, Role

if TYPE_CHECKING:
    from core.config.cluster import ClusterConfig
    from core.config.serving import AutoscalingConfig, ToolsConfig

__all__ = [
    "HEAD_NODE_RESOURCE",
    "RESOURCE_SLIVER",
    "Backend",
    "Target",
    "backend_target",
    "backends",
    "chain",
    "default_model",
    "fallback_mmproj",
    "fallback_models",
    "fallback_source",
    "fallback_target",
    "gateway_resources",
    "home_backends",
    "resolve_path",
    "served_names",
    "targets",
]


class Backend(Frozen):
    """A deployable target: one model on one pool, named `model@pool`."""

    model: str
    pool: str

    @property
    def name(self) -> str:
        return f"{self.model}@{self.pool}"

    @property
    def deployment_name(self) -> str:
        """The Serve deployment serving this backend."""
        return f"{DEPLOYMENT_PREFIX}{self.name}"


class Target(Frozen):
    """What a chain link names: a model backend `model@pool`, or the CPU fallback."""

    name: str
    deployment_name: str
    model_id: str = Field(description="The model name its engine answers to.")
    context_window: int
    cap: int
    replicas: int
    # Autoscaled (models[].autoscaling): the router's cap follows the running replicas at
    # `per_replica_cap` each instead of staying at `cap`.
    autoscaled: bool = False
    per_replica_cap: int = 0
    # Load may put it to sleep at zero replicas (autoscaling.scale_to_zero_after_s); a request
    # then waits up to `wake_timeout_s` for it to wake, or goes on down its chain.
    sleeps: bool = False
    wait_when_asleep: bool = True
    wake_timeout_s: float = 0.0
    tokenizer: str = Field(description="Where its token counter loads from.")
    model: str | None = Field(None, description="The model's name; None for the fallback.")
    role: Role | None = Field(None, description="The model's role tag; None for the fallback.")
    pool: str | None = None
    tools: bool = Field(False, description="Whether its engine takes `tools` (models[].tools).")
    embeds: bool = Field(False, description="Whether it serves embeddings (the embedding role).")
    images: bool = Field(False, description="Whether its engine reads images.")
    chat_template: str | None = Field(
        None, description="The template its engine renders with, where not the tokenizer's own."
    )
    adapters: tuple[str, ...] = Field(
        (), description="The LoRA adapters its engine serves besides the model (by name)."
    )

    @property
    def counter_key(self) -> str:
        """What its token counter is loaded from: targets that agree share one counter."""
        if self.chat_template is None:
            return self.tokenizer
        return f"{self.tokenizer} rendered with {self.chat_template}"


def resolve_path(base_dir: Path, source: str) -> str:
    """Absolute path for a local model source; hub ids and model names pass through."""
    if source.startswith(("./", "../", "/", "~")):
        return str((base_dir / Path(source).expanduser()).resolve())
    return source


def backends(config: ClusterConfig) -> tuple[Backend, ...]:
    """Every `model@pool` a model may run on, in its pool preference order."""
    return tuple(Backend(model=m.name, pool=p) for m in config.models for p in m.pools)


def home_backends(config: ClusterConfig) -> tuple[Backend, ...]:
    """The backends deployed at start: each model on its first pool."""
    return tuple(Backend(model=m.name, pool=m.home_pool) for m in config.models)


# Ray's built-in resource of the node `ray start --head` ran on.
HEAD_NODE_RESOURCE = "node:__internal_head__"
# A sliver pins an actor to the nodes carrying a resource without limiting how many they take.
RESOURCE_SLIVER = 0.001


def gateway_resources(config: ClusterConfig) -> dict[str, float]:
    """Ray resources that keep the ingress, router, placement actor and cluster manager off the
    pools (whose nodes can die): `gateway.resource`'s nodes, or the head node."""
    return {config.gateway.resource or HEAD_NODE_RESOURCE: RESOURCE_SLIVER}


def fallback_source(config: ClusterConfig) -> str:
    """The fallback's GGUF as an absolute path (relative to the config), or a model name."""
    source = config.fallback.source
    if config.fallback.is_gguf_file:
        return str((config.base_dir / Path(source).expanduser()).resolve())
    return source


def fallback_target(config: ClusterConfig) -> Target:
    fallback = config.fallback
    source = fallback_source(config)
    return Target(
        name=FALLBACK_BACKEND,
        deployment_name=f"{DEPLOYMENT_PREFIX}{FALLBACK_BACKEND}",
        model_id=FALLBACK_BACKEND,
        context_window=fallback.context_window,
        cap=fallback.max_concurrency,
        replicas=1,
        tokenizer=resolve_path(config.base_dir, fallback.tokenizer)
        if fallback.tokenizer
        else source,
        pool=fallback.pool,
        tools=fallback.tools is not None,
        images=fallback.mmproj is not None,
        chat_template=_template(config, fallback.tools),
    )


def fallback_mmproj(config: ClusterConfig) -> str | None:
    """The fallback's projector GGUF as an absolute path, where it reads images."""
    mmproj = config.fallback.mmproj
    return None if mmproj is None else str((config.base_dir / Path(mmproj).expanduser()).resolve())


def backend_target(config: ClusterConfig, backend: Backend) -> Target:
    model = config.model_named(backend.model)
    return Target(
        name=backend.name,
        deployment_name=backend.deployment_name,
        model_id=model.name,
        context_window=model.context_window,
        cap=model.cap,
        replicas=model.replicas,
        autoscaled=model.autoscaling is not None,
        per_replica_cap=model.per_replica_cap,
        **_sleep_fields(model.autoscaling),
        tokenizer=resolve_path(config.base_dir, model.source),
        model=model.name,
        role=model.role,
        pool=backend.pool,
        embeds=not model.generates,
        images=config.reads_images(model),
        tools=model.tools is not None,
        chat_template=_template(config, model.tools),
        adapters=tuple(a.name for a in model.adapters),
    )


def _sleep_fields(scaling: AutoscalingConfig | None) -> dict[str, Any]:
    if scaling is None or scaling.scale_to_zero_after_s is None:
        return {}
    return {
        "sleeps": True,
        "wait_when_asleep": scaling.when_asleep == "wait",
        "wake_timeout_s": scaling.wake_timeout_s,
    }


def _template(config: ClusterConfig, tools: ToolsConfig | None) -> str | None:
    path = config.tools_template(tools) if tools is not None else None
    return None if path is None else str(path)


def targets(config: ClusterConfig) -> dict[str, Target]:
    """Every link a chain may name: each `model@pool`, and `cpu-fallback`."""
    found = {b.name: backend_target(config, b) for b in backends(config)}
    found[FALLBACK_BACKEND] = fallback_target(config)
    return found


def default_model(config: ClusterConfig, role: Role) -> str | None:
    """The model `model: <role>` reaches: the role's model marked default, else its first."""
    tagged = [m for m in config.models if m.role == role]
    return next((m.name for m in tagged if m.default), tagged[0].name if tagged else None)


def fallback_models(config: ClusterConfig, name: str) -> tuple[str, ...]:
    """The models a model's requests fail over to, before the CPU fallback: its `fallbacks`,
    else the other models of its role in config order (none for an embedding model: another
    model's vectors would not compare with those already stored)."""
    model = config.model_named(name)
    if model.fallbacks:
        return tuple(f for f in model.fallbacks if f != FALLBACK_BACKEND)
    if model.role is None or not model.generates:
        return ()
    return tuple(m.name for m in config.models if m.role == model.role and m.name != name)


def chain(config: ClusterConfig, name: str) -> tuple[str, ...]:
    """A model's failover chain: configured under `chains`, or the model on each of its pools,
    then each of its fallback models on each of theirs, then (for text: the fallback serves no
    vectors) the CPU fallback. An adapter's is its base model's (whose backends serve it)."""
    if name in config.chains:
        return config.chains[name]
    base = config.base_model(name)
    if base.name != name:
        return chain(config, base.name)
    model = config.model_named(name)
    # A chain under a role's name is its default model's.
    role = model.role
    if role is not None and role.value in config.chains and default_model(config, role) == name:
        return config.chains[role.value]
    links = [f"{name}@{p}" for p in model.pools]
    for other in fallback_models(config, name):
        links += [f"{other}@{p}" for p in config.model_named(other).pools]
    last = (FALLBACK_BACKEND,) if model.generates else ()
    return (*links, *last)


def served_names(config: ClusterConfig) -> dict[str, str | None]:
    """Client-visible model names and the model each selects: a model's name and aliases, an
    adapter's name, a role (its default model), and `auto` (None: chosen per request)."""
    names: dict[str, str | None] = {}
    for role in Role:
        default = default_model(config, role)
        if default is not None:
            names[role.value] = default
    names.update({m.name: m.name for m in config.models})
    names.update({alias: m.name for m in config.models for alias in m.aliases})
    names.update({a.name: a.name for m in config.models for a in m.adapters})
    names[AUTO_MODEL] = None
    return names
