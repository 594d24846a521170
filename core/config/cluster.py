"""The whole configuration: its sections, checked together, and the topology they imply."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Self

from pydantic import AfterValidator, Field, model_validator

from core import topology
from core.config.base import Frozen, FrozenDict, frozen_dict
from core.config.checks import cross_section_problems
from core.config.images import config_reads_images
from core.config.placement import PlacementConfig
from core.config.recovery import ClusterManagerConfig
from core.config.router import RouterConfig
from core.config.serving import (
    AdapterConfig,
    FallbackConfig,
    ModelConfig,
    PoolConfig,
    ToolsConfig,
)
from core.config.traffic import (
    ApiKeyConfig,
    BatchConfig,
    DepthConfig,
    GatewayConfig,
)
from core.topology import Backend, Target
from core.types import Depth, Role

__all__ = ["ClusterConfig"]


class ClusterConfig(Frozen):
    """The whole file: pools, models, the CPU fallback, chains, keys and each part's settings."""

    pools: tuple[PoolConfig, ...] = Field(
        min_length=1, description="Sets of Ray nodes models are placed on."
    )
    models: tuple[ModelConfig, ...] = Field(
        min_length=1, description="The catalog: named models, any number per role."
    )
    fallback: FallbackConfig = Field(description="The CPU replica every chain ends on.")
    chains: Annotated[dict[str, tuple[str, ...]], AfterValidator(frozen_dict)] = Field(
        default_factory=FrozenDict,
        description="A model's failover chain of backends (model@pool), ending on "
        "cpu-fallback, by model name (a role's name: its default model); a link may be "
        "another text model's backend. Default: the model on each of its pools, then its "
        "fallbacks on theirs, then cpu-fallback. An embedding chain lists embedding backends "
        "only.",
    )
    api_keys: tuple[ApiKeyConfig, ...] = Field(
        (), description="Client keys (stored hashed). Empty: auth is off, and the app says so."
    )
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig, description="Moving models between pools by free VRAM."
    )
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="The front door.")
    router: RouterConfig = Field(
        default_factory=RouterConfig, description="Admission, breakers and failover."
    )
    depth: DepthConfig = Field(default_factory=DepthConfig, description="`model: auto`'s router.")
    cluster_manager: ClusterManagerConfig = Field(
        default_factory=ClusterManagerConfig, description="Dead pools drained and replaced."
    )
    batches: BatchConfig = Field(default_factory=BatchConfig, description="The Batch API.")
    # Set by the loader: where relative model paths are resolved from.
    base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        problems = cross_section_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def keys_db(self) -> Path:
        """The run-time keys' SQLite file, absolute (the registry may run elsewhere)."""
        return (self.base_dir / self.gateway.keys_db.expanduser()).resolve()

    @property
    def responses_db(self) -> Path:
        """The stored responses' SQLite file, absolute (the keeper may run elsewhere)."""
        return (self.base_dir / self.gateway.responses_db.expanduser()).resolve()

    @property
    def batch_directory(self) -> Path:
        """Where the Batch API keeps its state, absolute (the service may run elsewhere)."""
        return (self.base_dir / self.batches.directory.expanduser()).resolve()

    # The topology (core/topology.py), read as properties of the config it derives from.

    @property
    def backends(self) -> tuple[Backend, ...]:
        return topology.backends(self)

    @property
    def home_backends(self) -> tuple[Backend, ...]:
        return topology.home_backends(self)

    @property
    def fallback_target(self) -> Target:
        return topology.fallback_target(self)

    @property
    def fallback_source(self) -> str:
        return topology.fallback_source(self)

    @property
    def gateway_resources(self) -> dict[str, float]:
        return topology.gateway_resources(self)

    def backend_target(self, backend: Backend) -> Target:
        return topology.backend_target(self, backend)

    @property
    def targets(self) -> dict[str, Target]:
        return topology.targets(self)

    @property
    def home_targets(self) -> tuple[Target, ...]:
        """What the app deploys at start: each model on its home pool, and the fallback."""
        return (*(self.backend_target(b) for b in self.home_backends), self.fallback_target)

    def chain(self, model: str) -> tuple[str, ...]:
        return topology.chain(self, model)

    @property
    def served_names(self) -> dict[str, str | None]:
        return topology.served_names(self)

    def adapter_source(self, adapter: AdapterConfig) -> str:
        """A remote adapter's URI, or a local one's folder as an absolute path (relative paths
        from the config file's folder)."""
        if adapter.remote:
            return adapter.source
        return str((self.base_dir / Path(adapter.source).expanduser()).resolve())

    def resolve_path(self, source: str) -> str:
        return topology.resolve_path(self.base_dir, source)

    def tools_template(self, tools: ToolsConfig) -> Path | None:
        """The tools chat template's file (relative to the config file), if one is set."""
        if tools.chat_template is None:
            return None
        return (self.base_dir / Path(tools.chat_template).expanduser()).resolve()

    def model_named(self, name: str) -> ModelConfig:
        return next(m for m in self.models if m.name == name)

    def reads_images(self, model: ModelConfig) -> bool:
        """Whether `model`'s engine reads images: `images`, else its config.json where it can
        be read here, else its role (a vision model reads them)."""
        if model.images is not None:
            return model.images
        read = config_reads_images(self.resolve_path(model.source))
        return read if read is not None else model.role == Role.VISION

    def base_model(self, name: str) -> ModelConfig:
        """The model named `name`, or the base model of the adapter named so."""
        return next(
            m for m in self.models if m.name == name or any(a.name == name for a in m.adapters)
        )

    def model_for(self, role: Role) -> ModelConfig:
        """The role's default model (`default: true`, else its first)."""
        name = topology.default_model(self, role)
        if name is None:
            raise KeyError(f"no model has role {role.value!r}")
        return self.model_named(name)

    def pool(self, name: str) -> PoolConfig:
        return next(p for p in self.pools if p.name == name)

    @property
    def default_model(self) -> str:
        """Where a request with no better place goes: the orchestrator's default model, else
        the first model that generates text (else the first model)."""
        orchestrator = topology.default_model(self, Role.ORCHESTRATOR)
        if orchestrator is not None:
            return orchestrator
        return next((m.name for m in self.models if m.generates), self.models[0].name)

    def depth_route(self, depth: Depth) -> tuple[str, float]:
        """The model a depth goes to (its route's role's default model, or the default model
        where that role is not served) and the share of its window a request may use."""
        route = self.depth.routes[depth]
        model = topology.default_model(self, route.role) if route.role.generates else None
        return model or self.default_model, route.context_share
