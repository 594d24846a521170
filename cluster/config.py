"""The cluster's configuration: typed, validated, immutable, loaded from YAML.

Everything the gateway needs is here: pools, models (one per role), the CPU fallback, failover
chains, API keys, admission classes and placement thresholds. Backends are derived (`role@pool`),
never written by hand. Cross-field checks name the field and the fix, so a broken file fails at
start with a readable message (`ConfigError`), not a stack trace.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

API_KEYS_ENV = "GPU_POOL_SERVE_API_KEYS"
EMBEDDED_CONFIG = Path(__file__).resolve().parent.parent / "ray_configs" / "local.yaml"
AUTO_MODEL = "auto"
FALLBACK_BACKEND = "cpu-fallback"
DEPLOYMENT_PREFIX = "model:"


class FrozenDict(dict[Any, Any]):
    """A dict that refuses changes, so a validated config stays validated; pickles for Ray."""

    def _read_only(self, *_: Any, **__: Any) -> None:
        raise TypeError("the cluster config is read-only; change the YAML file instead")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


def _frozen_dict(value: dict[Any, Any]) -> FrozenDict:
    return FrozenDict(value)


Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=40)]
# Client-visible model names look like `qwen2.5-7b`, `llama3:8b` or `org/model`.
ModelName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", max_length=100)]
EngineKwargs = Annotated[dict[str, Any], AfterValidator(_frozen_dict)]
EnvVars = Annotated[dict[str, str], AfterValidator(_frozen_dict)]
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which field and how to fix it."""


class Role(StrEnum):
    ORCHESTRATOR = "orchestrator"
    REASONING = "reasoning"
    VISION = "vision"
    CODING = "coding"


class PoolKind(StrEnum):
    LOCAL = "local"
    MESH = "mesh"
    CLOUD = "cloud"


class PriorityClass(StrEnum):
    """Admission classes, most important first (see `rank`)."""

    USER = "user"
    AGENT = "agent"
    BACKGROUND = "background"

    @property
    def rank(self) -> int:
        return list(PriorityClass).index(self)


# Per-backend concurrency caps from the design, used when a model sets none.
DEFAULT_CAPS: Mapping[Role, int] = {
    Role.ORCHESTRATOR: 24,
    Role.REASONING: 8,
    Role.VISION: 4,
    Role.CODING: 6,
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolConfig(_Frozen):
    """A set of Ray nodes carrying the custom resource `pool_<name>`."""

    name: Name
    kind: PoolKind
    priority: int = Field(0, ge=0, description="Lower is preferred; local pools usually 0.")

    @property
    def resource(self) -> str:
        return f"pool_{self.name}"


class ModelConfig(_Frozen):
    """One model serving one role, deployable on the listed pools (the first is its home)."""

    role: Role
    source: str = Field(min_length=1, description="Local path (./, ../, /, ~) or hub id.")
    aliases: tuple[ModelName, ...] = ()
    context_window: int = Field(ge=256)
    engine_kwargs: EngineKwargs = Field(default_factory=FrozenDict)
    device: Literal["cpu", "gpu"] = "gpu"
    # CPU engines: logical CPUs one replica reserves (its engine runs OMP_NUM_THREADS threads).
    cpus_per_replica: float = Field(1.0, gt=0)
    env_vars: EnvVars = Field(default_factory=FrozenDict)
    placement_priority: Literal["P0", "P1", "P2", "P3"] = "P1"
    pools: tuple[Name, ...] = Field(min_length=1)
    replicas: int = Field(1, ge=1)
    max_concurrency: int | None = None

    @property
    def cap(self) -> int:
        return self.max_concurrency if self.max_concurrency is not None else DEFAULT_CAPS[self.role]

    @property
    def home_pool(self) -> str:
        return self.pools[0]


class FallbackConfig(_Frozen):
    """The CPU replica every chain ends on: it has no GPU memory to run out of."""

    engine: Literal["ollama", "llama_cpp", "auto"] = "auto"
    source: str = Field(min_length=1, description="GGUF path, or an Ollama model name to pull.")
    context_window: int = Field(2048, ge=256)
    max_concurrency: int = 8
    pool: Name | None = Field(None, description="CPU pool to run on; none means the head node.")
    # Exact counts need the model's own tokenizer: a Hugging Face path or hub id. By default the
    # GGUF's embedded tokenizer and chat template; an Ollama model name is counted by estimate.
    tokenizer: str | None = None
    threads: int = Field(2, ge=1, description="CPU threads the engine computes with")
    # Memory tiering (llama.cpp): layers offloaded to the node's GPU, the rest stay in RAM, for
    # a model too big for the VRAM left. 0 on CPU nodes; -1 offloads all. Needs a CUDA build of
    # llama-cpp-python on that node; the CPU build ignores it.
    n_gpu_layers: int = Field(0, ge=-1)
    num_cpus: float = Field(1.0, ge=0, description="CPUs the replica reserves from Ray")
    # Ollama: the model created from the GGUF (or pulled, when source is a model name), how
    # long Ollama keeps it loaded after a request, and where it stores models.
    ollama_model: ModelName = "gps-fallback"
    keep_alive: str = Field("1h", pattern=r"^-?[0-9]+(ms|s|m|h)?$")
    ollama_models_dir: str | None = None

    @property
    def is_gguf_file(self) -> bool:
        return self.source.endswith(".gguf")

    @model_validator(mode="after")
    def _engine_has_a_model(self) -> Self:
        if self.engine == "llama_cpp" and not self.is_gguf_file:
            raise ValueError(
                f"source {self.source!r}: the llama_cpp engine serves a GGUF file; give the path "
                "of a .gguf file, or use engine ollama to pull a model by name"
            )
        return self


class ApiKeyConfig(_Frozen):
    """A client key, stored only as its SHA-256 (`python -m cluster.keys hash KEY`)."""

    name: Name
    sha256: str
    priority: PriorityClass = PriorityClass.USER
    max_priority: PriorityClass = PriorityClass.USER

    @field_validator("sha256", mode="before")
    @classmethod
    def _digest_is_hex(cls, value: Any) -> Any:
        if isinstance(value, int):
            raise ValueError("quote the digest in YAML: an all-digit value reads as a number")
        if not isinstance(value, str) or not SHA256_HEX.match(value):
            raise ValueError(
                "must be the 64-hex-digit SHA-256 of the key, never the key itself: "
                "run `python -m cluster.keys hash KEY`"
            )
        return value

    @model_validator(mode="after")
    def _priority_within_cap(self) -> Self:
        if self.priority.rank < self.max_priority.rank:
            raise ValueError(
                f"priority {self.priority.value!r} is above max_priority "
                f"{self.max_priority.value!r}; lower priority or raise max_priority"
            )
        return self


class PlacementConfig(_Frozen):
    """VRAM thresholds for the placement actor (hysteresis: restore_above > offload_below)."""

    interval_s: float = Field(15.0, gt=0)
    offload_below_gb: float = Field(6.0, ge=0)
    restore_above_gb: float = Field(12.0, ge=0)
    cooldown_s: float = Field(120.0, ge=0)
    min_away_s: float = Field(60.0, ge=0)
    # A move's target must be running and healthy within this long, or the move is abandoned
    # (the source keeps serving); the source's in-flight requests get this long to finish.
    move_timeout_s: float = Field(600.0, gt=0)
    drain_timeout_s: float = Field(120.0, gt=0)

    @model_validator(mode="after")
    def _hysteresis(self) -> Self:
        if self.restore_above_gb <= self.offload_below_gb:
            raise ValueError(
                f"restore_above_gb ({self.restore_above_gb}) must be greater than "
                f"offload_below_gb ({self.offload_below_gb}), or models would flap between pools"
            )
        return self


class Depth(StrEnum):
    """How much thought (and context) a `model: auto` request deserves."""

    QUICK = "quick"
    BALANCED = "balanced"
    DEEP = "deep"
    EXHAUSTIVE = "exhaustive"


class DepthRoute(_Frozen):
    """Where one depth goes: a role, and the share of that role's window it may use."""

    role: Role
    context_share: float = Field(1.0, gt=0, le=1)


DEFAULT_DEPTH_ROUTES = {
    Depth.QUICK: DepthRoute(role=Role.ORCHESTRATOR, context_share=0.25),
    Depth.BALANCED: DepthRoute(role=Role.ORCHESTRATOR, context_share=1.0),
    Depth.DEEP: DepthRoute(role=Role.REASONING, context_share=1.0),
    Depth.EXHAUSTIVE: DepthRoute(role=Role.REASONING, context_share=1.0),
}


def _all_depth_routes(value: dict[Depth, DepthRoute]) -> FrozenDict:
    return _frozen_dict({**DEFAULT_DEPTH_ROUTES, **value})


class DepthConfig(_Frozen):
    """The depth router for `model: auto`: rules' thresholds and each depth's route.

    A route whose role is not served falls back to the orchestrator (or the first role served).
    """

    routes: Annotated[dict[Depth, DepthRoute], AfterValidator(_all_depth_routes)] = Field(
        default_factory=lambda: _all_depth_routes({})
    )
    quick_max_words: int = Field(25, ge=0)
    deep_min_words: int = Field(250, ge=1)
    deep_min_questions: int = Field(3, ge=1)
    exhaustive_min_words: int = Field(1500, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.quick_max_words < self.deep_min_words < self.exhaustive_min_words:
            raise ValueError(
                "quick_max_words < deep_min_words < exhaustive_min_words must hold "
                f"(got {self.quick_max_words}, {self.deep_min_words}, "
                f"{self.exhaustive_min_words}); raise the larger ones"
            )
        return self


class GatewayConfig(_Frozen):
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    # A chat request nests about 6 deep (body, messages, message, content, part, image_url) and a
    # tool's JSON schema a few more; past 64 it is an attack or a bug. The bound keeps parsing,
    # pydantic, pickling and chat templates far from Python's recursion limit (about 1000).
    max_json_depth: int = Field(64, ge=8, le=512)
    # Each message costs fitting and template work before an engine sees it; a body limit alone
    # lets 8 MiB of empty messages through. 10k is far past any real conversation.
    max_messages: int = Field(10_000, ge=1)
    default_priority: PriorityClass = PriorityClass.USER
    ingress_replicas: int = Field(1, ge=1)
    # Each router replica enforces its share of every cap (cap // replicas), so the sum holds
    # without shared state; one replica keeps queues globally ordered (see README).
    router_replicas: int = Field(1, ge=1)


# Every request in an engine's batch slows the others (on CPU engines almost linearly): half the
# cap for batch work bounds what users feel of it (bench/overload.py); aged waiters get more.
DEFAULT_CLASS_SHARES = {
    PriorityClass.USER: 1.0,
    PriorityClass.AGENT: 0.75,
    PriorityClass.BACKGROUND: 0.5,
}


def _all_class_shares(value: dict[PriorityClass, float]) -> FrozenDict:
    return _frozen_dict({**DEFAULT_CLASS_SHARES, **value})


class RouterConfig(_Frozen):
    """Admission, breakers and failover in the router deployment."""

    max_queue: int = Field(64, ge=0, description="waiting requests per backend")
    # The share of each backend's cap a class may fill; what is left is headroom for the
    # classes above it, so interactive work never waits behind a full load of batch work.
    class_shares: Annotated[
        dict[PriorityClass, Annotated[float, Field(gt=0, le=1)]],
        AfterValidator(_all_class_shares),
    ] = Field(default_factory=lambda: _all_class_shares({}))
    queue_timeout_s: float = Field(30.0, gt=0)
    aging_s: float = Field(10.0, gt=0, description="a waiter gains one class per aging_s")
    retry_after_s: int = Field(2, ge=1)
    breaker_failures: int = Field(3, ge=1)
    breaker_cooldown_s: float = Field(10.0, gt=0)
    half_open_probes: int = Field(1, ge=1)
    kv_cache_high: float = Field(0.88, gt=0, le=1)
    kv_cache_resume_factor: float = Field(0.9, gt=0, lt=1)
    kv_poll_interval_s: float = Field(1.0, gt=0)
    kv_stale_after_s: float = Field(10.0, gt=0)
    # Serve's status costs the controller and us ~0.2 s of CPU a read: read it often only while
    # some backend is in trouble (tripped, down, recovering), seldom while all are well.
    health_interval_s: float = Field(5.0, gt=0)
    health_idle_interval_s: float = Field(30.0, gt=0)
    first_token_timeout_s: float = Field(120.0, gt=0)
    stream_idle_timeout_s: float = Field(120.0, gt=0)

    @model_validator(mode="after")
    def _shares_descend(self) -> Self:
        shares = [self.class_shares[c] for c in PriorityClass]
        if shares[0] != 1.0:
            raise ValueError(
                "class_shares.user must be 1.0: the top class may always fill the whole cap"
            )
        if shares != sorted(shares, reverse=True):
            raise ValueError(
                f"class_shares must not grow down the classes (user >= agent >= background), got "
                f"{dict(zip([c.value for c in PriorityClass], shares, strict=True))}; lower the "
                "share of the lower class"
            )
        return self


class Backend(_Frozen):
    """A deployable target: one model on one pool, named `role@pool`."""

    role: Role
    pool: str

    @property
    def name(self) -> str:
        return f"{self.role.value}@{self.pool}"

    @property
    def deployment_name(self) -> str:
        """The Serve deployment serving this backend."""
        return f"{DEPLOYMENT_PREFIX}{self.name}"


class Target(_Frozen):
    """What a chain link names: a model backend `role@pool`, or the CPU fallback."""

    name: str
    deployment_name: str
    model_id: str = Field(description="The model name its engine answers to.")
    context_window: int
    cap: int
    replicas: int
    tokenizer: str = Field(description="Where its token counter loads from.")
    role: Role | None = Field(None, description="None for the fallback, which serves any role.")
    pool: str | None = None


class ClusterConfig(_Frozen):
    pools: tuple[PoolConfig, ...] = Field(min_length=1)
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    fallback: FallbackConfig
    chains: Annotated[dict[Role, tuple[str, ...]], AfterValidator(_frozen_dict)] = Field(
        default_factory=FrozenDict
    )
    api_keys: tuple[ApiKeyConfig, ...] = ()
    placement: PlacementConfig = PlacementConfig()
    gateway: GatewayConfig = GatewayConfig()
    router: RouterConfig = RouterConfig()
    depth: DepthConfig = DepthConfig()
    # Set by the loader: where relative model paths are resolved from.
    base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        problems = [
            *self._check_unique_names(),
            *self._check_model_pools(),
            *self._check_caps(),
            *self._check_aliases(),
            *self._check_chains(),
            *self._check_keys(),
        ]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _check_unique_names(self) -> list[str]:
        problems = []
        pool_names = [p.name for p in self.pools]
        for name in sorted({n for n in pool_names if pool_names.count(n) > 1}):
            problems.append(f"pools: pool {name!r} is defined twice; give each pool its own name")
        roles = [m.role for m in self.models]
        for role in sorted({r for r in roles if roles.count(r) > 1}):
            problems.append(
                f"models: role {role.value!r} is served by two models; keep one model per role "
                "and list several pools on it instead"
            )
        return problems

    def _check_model_pools(self) -> list[str]:
        known = {p.name for p in self.pools}
        problems = []
        for i, model in enumerate(self.models):
            for pool in model.pools:
                if pool not in known:
                    problems.append(
                        f"models[{i}].pools: pool {pool!r} does not exist; define it under pools "
                        f"or use one of {sorted(known)}"
                    )
            if "max_model_len" in model.engine_kwargs:
                problems.append(
                    f"models[{i}].engine_kwargs.max_model_len: set context_window instead; the "
                    "router fits requests to context_window and passes it to vLLM"
                )
            if len(set(model.pools)) != len(model.pools):
                problems.append(f"models[{i}].pools: a pool is listed twice; list each once")
        if self.fallback.pool is not None and self.fallback.pool not in known:
            problems.append(
                f"fallback.pool: pool {self.fallback.pool!r} does not exist; define it under "
                "pools or leave fallback.pool empty to run on the head node"
            )
        return problems

    def _check_caps(self) -> list[str]:
        fix = "must be at least 1 (a cap of 0 would refuse every request); raise it or remove it"
        problems = [
            f"models[{i}].max_concurrency {fix}"
            for i, m in enumerate(self.models)
            if m.max_concurrency is not None and m.max_concurrency < 1
        ]
        if self.fallback.max_concurrency < 1:
            problems.append(f"fallback.max_concurrency {fix}")
        replicas = self.gateway.router_replicas
        if replicas > 1:
            share = (
                f"must be at least gateway.router_replicas ({replicas}): each router replica "
                "enforces cap // replicas; raise the cap or lower router_replicas"
            )
            problems.extend(
                f"models[{i}].max_concurrency ({m.cap}) {share}"
                for i, m in enumerate(self.models)
                if m.cap < replicas
            )
            fallback_cap = self.fallback.max_concurrency
            if fallback_cap < replicas:
                problems.append(f"fallback.max_concurrency ({fallback_cap}) {share}")
        return problems

    def _check_aliases(self) -> list[str]:
        reserved = {r.value for r in Role} | {AUTO_MODEL, FALLBACK_BACKEND}
        seen: dict[str, int] = {}
        problems = []
        for i, model in enumerate(self.models):
            for alias in model.aliases:
                if alias in reserved:
                    problems.append(
                        f"models[{i}].aliases: {alias!r} is a reserved model name; pick another"
                    )
                elif alias in seen:
                    problems.append(
                        f"models[{i}].aliases: {alias!r} is already an alias of models"
                        f"[{seen[alias]}]; each alias must name exactly one model"
                    )
                else:
                    seen[alias] = i
        return problems

    def _check_chains(self) -> list[str]:
        served = {m.role for m in self.models}
        known = {b.name for b in self.backends} | {FALLBACK_BACKEND}
        problems = []
        for role, links in self.chains.items():
            where = f"chains.{role.value}"
            if role not in served:
                problems.append(f"{where}: no model serves role {role.value!r}; add one or drop it")
            unknown = [link for link in links if link not in known]
            for link in unknown:
                problems.append(
                    f"{where}: {link!r} is not a backend; use role@pool for a configured model "
                    f"and pool, or {FALLBACK_BACKEND!r}"
                )
            repeated = sorted({link for link in links if links.count(link) > 1})
            if repeated:
                problems.append(
                    f"{where}: {', '.join(repeated)} appears more than once, which would loop; "
                    "list each backend once"
                )
            if not links or links[-1] != FALLBACK_BACKEND:
                problems.append(
                    f"{where}: the chain must end on {FALLBACK_BACKEND!r}, the CPU replica that "
                    "cannot run out of GPU memory; append it"
                )
            elif FALLBACK_BACKEND in links[:-1]:
                problems.append(f"{where}: {FALLBACK_BACKEND!r} may only be the last link")
        return problems

    def _check_keys(self) -> list[str]:
        names = [k.name for k in self.api_keys]
        hashes = [k.sha256 for k in self.api_keys]
        problems = [
            f"api_keys: key name {n!r} is used twice; name each key once"
            for n in sorted({n for n in names if names.count(n) > 1})
        ]
        if len(set(hashes)) != len(hashes):
            problems.append("api_keys: the same key is listed twice; remove the duplicate")
        return problems

    @property
    def backends(self) -> tuple[Backend, ...]:
        """Every `role@pool` a model may run on, in its pool preference order."""
        return tuple(Backend(role=m.role, pool=p) for m in self.models for p in m.pools)

    @property
    def home_backends(self) -> tuple[Backend, ...]:
        """The backends deployed at start: each model on its first pool."""
        return tuple(Backend(role=m.role, pool=m.home_pool) for m in self.models)

    @property
    def fallback_target(self) -> Target:
        fallback = self.fallback
        source = self.fallback_source
        return Target(
            name=FALLBACK_BACKEND,
            deployment_name=f"{DEPLOYMENT_PREFIX}{FALLBACK_BACKEND}",
            model_id=FALLBACK_BACKEND,
            context_window=fallback.context_window,
            cap=fallback.max_concurrency,
            replicas=1,
            tokenizer=self.resolve_path(fallback.tokenizer) if fallback.tokenizer else source,
            pool=fallback.pool,
        )

    @property
    def fallback_source(self) -> str:
        """The fallback's GGUF as an absolute path (relative to the config), or a model name."""
        source = self.fallback.source
        if self.fallback.is_gguf_file:
            return str((self.base_dir / Path(source).expanduser()).resolve())
        return source

    def backend_target(self, backend: Backend) -> Target:
        model = self.model_for(backend.role)
        return Target(
            name=backend.name,
            deployment_name=backend.deployment_name,
            model_id=backend.role.value,
            context_window=model.context_window,
            cap=model.cap,
            replicas=model.replicas,
            tokenizer=self.resolve_path(model.source),
            role=backend.role,
            pool=backend.pool,
        )

    @property
    def targets(self) -> dict[str, Target]:
        """Every link a chain may name: each `role@pool`, and `cpu-fallback`."""
        targets = {b.name: self.backend_target(b) for b in self.backends}
        targets[FALLBACK_BACKEND] = self.fallback_target
        return targets

    @property
    def home_targets(self) -> tuple[Target, ...]:
        """What the app deploys at start: each model on its home pool, and the fallback."""
        return (*(self.backend_target(b) for b in self.home_backends), self.fallback_target)

    def model_for(self, role: Role) -> ModelConfig:
        return next(m for m in self.models if m.role == role)

    @property
    def default_role(self) -> Role:
        """Where a request with no better place goes: the orchestrator, else the first role."""
        roles = [m.role for m in self.models]
        return Role.ORCHESTRATOR if Role.ORCHESTRATOR in roles else roles[0]

    def depth_route(self, depth: Depth) -> DepthRoute:
        """The route for a depth, on a served role (the default role if its own is not served)."""
        route = self.depth.routes[depth]
        if any(m.role == route.role for m in self.models):
            return route
        return DepthRoute(role=self.default_role, context_share=route.context_share)

    def pool(self, name: str) -> PoolConfig:
        return next(p for p in self.pools if p.name == name)

    def chain(self, role: Role) -> tuple[str, ...]:
        """The failover chain for a role: configured, or each of its pools then the fallback."""
        if role in self.chains:
            return self.chains[role]
        return (*(f"{role.value}@{p}" for p in self.model_for(role).pools), FALLBACK_BACKEND)

    @property
    def served_names(self) -> dict[str, Role | None]:
        """Client-visible model names and the role each selects (`auto`: chosen per request)."""
        names: dict[str, Role | None] = {m.role.value: m.role for m in self.models}
        names.update({alias: m.role for m in self.models for alias in m.aliases})
        names[AUTO_MODEL] = None
        return names

    def resolve_path(self, source: str) -> str:
        """Absolute path for a local model source; hub ids and model names pass through."""
        if source.startswith(("./", "../", "/", "~")):
            return str((self.base_dir / Path(source).expanduser()).resolve())
        return source


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_from_env(value: str) -> list[dict[str, str]]:
    """`key[:class]` entries, comma separated; the class is both default and cap."""
    entries = []
    for i, item in enumerate(filter(None, (part.strip() for part in value.split(",")))):
        # The class follows the last colon, so a key containing ':' needs an explicit class.
        key, colon, priority = item.rpartition(":")
        if not colon:
            key, priority = item, PriorityClass.USER.value
        if not key:
            raise ConfigError(f"{API_KEYS_ENV}: entry {i} has an empty key; remove it")
        entries.append(
            {
                "name": f"env-{i}",
                "sha256": hash_key(key),
                "priority": priority,
                "max_priority": priority,
            }
        )
    return entries


def parse_config(
    data: Any, *, base_dir: Path, environ: Mapping[str, str] | None = None
) -> ClusterConfig:
    """Validate a config mapping; keys from the environment are added, hashed, here."""
    if not isinstance(data, dict):
        raise ConfigError("config: the file must hold a mapping (pools:, models:, fallback:, ...)")
    environ = os.environ if environ is None else environ
    data = {**data, "base_dir": base_dir}
    env_keys = environ.get(API_KEYS_ENV, "")
    if env_keys.strip():
        data["api_keys"] = [*(data.get("api_keys") or ()), *keys_from_env(env_keys)]
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None


def load_config(
    path: str | Path | None = None, *, environ: Mapping[str, str] | None = None
) -> ClusterConfig:
    """Load and validate a YAML config; with no path, the embedded local default."""
    file = Path(path).expanduser() if path else EMBEDDED_CONFIG
    try:
        text = file.read_text()
    except OSError as error:
        raise ConfigError(f"config: cannot read {file}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"config: {file} is not valid YAML: {error}") from None
    try:
        return parse_config(data, base_dir=file.resolve().parent, environ=environ)
    except ConfigError as error:
        raise ConfigError(f"invalid config {file}:\n{error}") from None


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        message = re.sub(r"^(Value error|Assertion failed), ", "", item["msg"])
        if item["type"] == "extra_forbidden":
            message = "is not a known key; check its spelling (README lists every key)"
        for line in message.splitlines():
            lines.append(f"  {where}: {line}" if where else f"  {line}")
    return "\n".join(lines)
