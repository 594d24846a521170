"""The config file's sections, each validated on its own (cross-section checks: checks.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, field_validator, model_validator

from core.config.base import (
    SHA256_HEX,
    EngineKwargs,
    EnvVars,
    Frozen,
    FrozenDict,
    ModelName,
    Name,
    frozen_dict,
)
from core.config.recovery import NoProvisioner, ProvisionerConfig
from core.types import Depth, PoolKind, PriorityClass, Role

__all__ = [
    "DEFAULT_CAPS",
    "DEFAULT_CLASS_SHARES",
    "DEFAULT_DEPTH_ROUTES",
    "ApiKeyConfig",
    "AutoscalingConfig",
    "BatchConfig",
    "DepthConfig",
    "DepthRoute",
    "FallbackConfig",
    "GatewayConfig",
    "ModelConfig",
    "PlacementConfig",
    "PoolConfig",
    "RouterConfig",
    "ToolsConfig",
]


# Per-backend concurrency caps from the design, used when a model sets none.
DEFAULT_CAPS: Mapping[Role, int] = {
    Role.ORCHESTRATOR: 24,
    Role.REASONING: 8,
    Role.VISION: 4,
    Role.CODING: 6,
    Role.EMBEDDING: 16,
}


class PoolConfig(Frozen):
    """A set of Ray nodes carrying the custom resource `pool_<name>`."""

    name: Name
    kind: PoolKind
    priority: int = Field(0, ge=0, description="Lower is preferred; local pools usually 0.")
    # Memory of one GPU on the pool's nodes: lets the config guard check GPU models' weights and
    # KV cache before they start (`python -m cluster.config check`). None: not checked.
    gpu_memory_gb: float | None = Field(None, gt=0)
    # What replaces the pool's nodes when they die (core/config/recovery.py).
    provisioner: ProvisionerConfig = NoProvisioner()

    @property
    def resource(self) -> str:
        return f"pool_{self.name}"


class ToolsConfig(Frozen):
    """Tool calling for one model, mapped onto vLLM's own options (`tool_call_parser`,
    `enable_auto_tool_choice`, `chat_template`)."""

    # vLLM's name for the format the model writes tool calls in: hermes, llama3_json, mistral,
    # qwen3_xml, pythonic, ... (`vllm serve --help=tool-call-parser` lists them).
    parser: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$", max_length=40)
    # `tool_choice: auto` (the model decides): what IDE agents send on nearly every call.
    auto_choice: bool = True
    # Every call's arguments held to its tool's JSON schema while decoding, as if each tool
    # said `strict: true` (vLLM's `tool_strict_level: parameter`); off, only a tool that says
    # so is held, and a forced call fixes its name but not its arguments.
    strict: bool = False
    # A chat template that renders `tools` and tool results, for models whose own does not
    # (a path, relative to the config file).
    chat_template: str | None = None


class AutoscalingConfig(Frozen):
    """Replica counts from load (policy/load_scaling.py), on the pool placement chose: the
    router's queue and the engines' KV cache, read once a second, in the same Serve autoscaling
    policy that carries out placement."""

    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(ge=1)
    # Waiting requests per replica the router may hold before one more replica is worth it.
    target_queue_per_replica: float = Field(2.0, gt=0)
    # KV cache usage (0..1, the highest any replica reports) that adds a replica while
    # requests wait, however short the queue.
    kv_high: float = Field(0.85, gt=0, le=1)
    upscale_delay_s: float = Field(10.0, ge=0)
    downscale_delay_s: float = Field(120.0, ge=0)
    # Idle this long (nothing waiting or running): zero replicas, the GPU given back. None:
    # never below min_replicas.
    scale_to_zero_after_s: float | None = Field(None, ge=10)  # routers' posts stay fresh 10 s
    # A request for a backend at zero: "wait" in its queue while one replica starts (up to
    # wake_timeout_s, then 503), or "next_link" of its chain (the replica still wakes).
    when_asleep: Literal["wait", "next_link"] = "wait"
    wake_timeout_s: float = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )
        asleep_keys = self.model_fields_set & {"when_asleep", "wake_timeout_s"}
        if asleep_keys and self.scale_to_zero_after_s is None:
            raise ValueError(
                f"{' and '.join(sorted(asleep_keys))} apply to a backend asleep at zero: set "
                "scale_to_zero_after_s too"
            )
        return self


class ModelConfig(Frozen):
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
    # None: a request with tools is refused with a 400 that names this key.
    tools: ToolsConfig | None = None
    # None: `replicas` is the count (placement still moves them between pools).
    autoscaling: AutoscalingConfig | None = None

    @property
    def cap(self) -> int:
        """The router's cap on the backend at `replicas` replicas."""
        return self.max_concurrency if self.max_concurrency is not None else DEFAULT_CAPS[self.role]

    @property
    def per_replica_cap(self) -> int:
        """What one replica takes at once: the cap over `replicas`, rounded down so the
        starting count never takes more than the cap (autoscaling keeps it per replica)."""
        return max(1, self.cap // self.replicas)

    @property
    def max_replicas(self) -> int:
        return self.autoscaling.max_replicas if self.autoscaling else self.replicas

    @model_validator(mode="after")
    def _replicas_within_autoscaling(self) -> Self:
        scaling = self.autoscaling
        if scaling and not scaling.min_replicas <= self.replicas <= scaling.max_replicas:
            raise ValueError(
                f"replicas ({self.replicas}) is the count a backend starts with: it must be "
                f"within autoscaling's min_replicas ({scaling.min_replicas}) and max_replicas "
                f"({scaling.max_replicas})"
            )
        return self

    @property
    def home_pool(self) -> str:
        return self.pools[0]


class FallbackConfig(Frozen):
    """The CPU replica every chain ends on: it has no GPU memory to run out of."""

    engine: Literal["ollama", "llama_cpp", "auto"] = "auto"
    source: str = Field(min_length=1, description="GGUF path, or an Ollama model name to pull.")
    context_window: int = Field(2048, ge=256)
    max_concurrency: int = 8
    pool: Name | None = Field(None, description="CPU pool to run on; none means the head node.")
    # Exact counts need the model's own tokenizer: a Hugging Face path or hub id. By default the
    # GGUF's embedded tokenizer and chat template; an Ollama model name is counted by estimate.
    tokenizer: str | None = None
    # Tool calling on the fallback. llama.cpp: `parser: hermes` only (the server reads the calls
    # back from its text), with `chat_template` where the GGUF's own ignores `tools`. Ollama reads
    # calls with the template of its model; the parser names no more than the format.
    tools: ToolsConfig | None = None
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
    def _tools_can_be_read_back(self) -> Self:
        if self.tools is not None and self.tools.chat_template is not None:
            if self.engine == "ollama":
                raise ValueError(
                    "tools.chat_template: a Jinja template is for llama.cpp; Ollama renders with "
                    "its model's own template (leave chat_template out, or use engine llama_cpp)"
                )
            if not self.is_gguf_file:
                raise ValueError(
                    "tools.chat_template: llama.cpp renders it and serves a GGUF file; point "
                    "source at a .gguf file or leave chat_template out"
                )
        if self.tools is not None and self.engine != "ollama" and self.tools.parser != "hermes":
            raise ValueError(
                f"tools.parser {self.tools.parser!r}: the llama.cpp fallback reads tool calls "
                "in the Hermes format only (`parser: hermes`, with a template that asks for it)"
            )
        return self

    @model_validator(mode="after")
    def _engine_has_a_model(self) -> Self:
        if self.engine == "llama_cpp" and not self.is_gguf_file:
            raise ValueError(
                f"source {self.source!r}: the llama_cpp engine serves a GGUF file; give the path "
                "of a .gguf file, or use engine ollama to pull a model by name"
            )
        return self


class ApiKeyConfig(Frozen):
    """A client key, stored only as its SHA-256 (`python -m cluster.keys hash KEY`)."""

    name: Name
    sha256: str
    priority: PriorityClass = PriorityClass.USER
    max_priority: PriorityClass = PriorityClass.USER
    # Limits, enforced at admission across every ingress replica (policy/key_limits.py):
    # requests and tokens (prompt + completion) per sliding minute, requests in progress, and
    # tokens per calendar period in UTC. None: no limit.
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    max_parallel: int | None = Field(None, ge=1)
    budget_tokens: int | None = Field(None, ge=1)
    budget_period: Literal["day", "week", "month"] = "month"
    # May read every key's usage (`GET /v1/keys/usage`).
    admin: bool = False

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


class PlacementConfig(Frozen):
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


class DepthRoute(Frozen):
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
    return frozen_dict({**DEFAULT_DEPTH_ROUTES, **value})


class DepthConfig(Frozen):
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


class GatewayConfig(Frozen):
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
    # The router in each ingress replica's process instead of a deployment of its own: one Serve
    # hop fewer per request, which is what keeps the gateway within 10% of bare ray.serve.llm at
    # 32 clients (bench/overhead.py); each ingress replica then enforces cap // ingress_replicas
    # and `router_replicas` is unused. False gives the router its own deployment.
    router_in_ingress: bool = True
    # Where the ingress, router, placement actor and cluster manager run: nodes carrying this
    # Ray resource (start them with `--resources='{"gateway": 1}'`); none means the head node.
    # Never a pool's resource: a node that can die must not take the front door with it.
    resource: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @property
    def router_shares(self) -> int:
        """How many routers split every cap: router replicas, or ingress replicas when each
        runs its own."""
        return self.ingress_replicas if self.router_in_ingress else self.router_replicas


# Every request in an engine's batch slows the others (on CPU engines almost linearly): half the
# cap for batch work bounds what users feel of it (bench/overload.py); aged waiters get more.
DEFAULT_CLASS_SHARES = {
    PriorityClass.USER: 1.0,
    PriorityClass.AGENT: 0.75,
    PriorityClass.BACKGROUND: 0.5,
}


def _all_class_shares(value: dict[PriorityClass, float]) -> FrozenDict:
    return frozen_dict({**DEFAULT_CLASS_SHARES, **value})


# vLLM's priority scheduler runs the lowest number first.
DEFAULT_ENGINE_PRIORITIES = {cls: cls.rank for cls in PriorityClass}


def _all_engine_priorities(value: dict[PriorityClass, int]) -> FrozenDict:
    return frozen_dict({**DEFAULT_ENGINE_PRIORITIES, **value})


class RouterConfig(Frozen):
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
    # How often Serve's controller checks each vLLM replica: the check is what tells it a
    # replica died (a SIGKILL, an OOM kill). Until then Serve's handles may still route to the
    # dead replica and hold requests; Serve's default is 10 s. A check is an in-memory look at
    # the engine (vLLM's check_health): cheap at 2 s. Three failed checks in a row stop a
    # replica (6 s at 2 s).
    replica_health_check_period_s: float = Field(
        2.0, gt=0, description="Serve's health-check period of every vLLM replica"
    )
    # The class reaches the engine: every vLLM backend runs vLLM's priority scheduler, each
    # request carrying its class's number from `engine_priorities` (lower runs first; where
    # the KV cache runs out the engine preempts the highest number, latest arrival, first).
    # The CPU fallback serves the lowest number first too. Off: FCFS, every request at 0.
    engine_priority: bool = True
    # A backend that may run more than one replica picks one per request by prefix and session
    # (deployments/replica_router.py, over Ray Serve LLM's PrefixCacheAffinityRouter): the
    # replica holding the conversation, unless it is `prefix_imbalance` requests busier than
    # the least loaded one. Off: Serve's power-of-two choice.
    prefix_routing: bool = True
    prefix_imbalance: int = Field(2, ge=0)
    engine_priorities: Annotated[
        dict[PriorityClass, Annotated[int, Field(ge=-(2**31), lt=2**31)]],
        AfterValidator(_all_engine_priorities),
    ] = Field(default_factory=lambda: _all_engine_priorities({}))

    def engine_priority_of(self, cls: PriorityClass) -> int:
        """The number a request of `cls` carries to its engine."""
        return int(self.engine_priorities[cls]) if self.engine_priority else 0

    @model_validator(mode="after")
    def _engine_priorities_ascend(self) -> Self:
        numbers = [self.engine_priorities[c] for c in PriorityClass]
        if numbers != sorted(numbers):
            raise ValueError(
                "engine_priorities must not fall down the classes (user <= agent <= "
                f"background: the engine runs the lowest first), got "
                f"{dict(zip([c.value for c in PriorityClass], numbers, strict=True))}"
            )
        return self

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


class BatchConfig(Frozen):
    """The OpenAI Batch API: where its state lives, what a file may hold, how lines run."""

    # Batch state (SQLite) and files, relative to the config file. One service writes it; on a
    # multi-node gateway, put it on storage every gateway node mounts (NFS, EFS) and set
    # `shared_storage`, so the service restarted on another node finds it.
    directory: Path = Path(".batches")
    # SQLite's WAL keeps its index in memory shared by processes on one host, which a network
    # filesystem cannot give: there the rollback journal (one writer, as here, is all it needs).
    shared_storage: bool = False
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1024)  # OpenAI's limit for batch input
    max_lines: int = Field(50_000, ge=1)  # OpenAI's limit
    max_line_bytes: int = Field(1024 * 1024, ge=1024)
    # A chunk is this many rounds of what the role's backends run at background priority at
    # once: committed together, the most a crash can make the service run again. Its last
    # lines run with slots idle (the next chunk waits for its commit): about 1/(2 x rounds)
    # of the throughput, 12% at 4 rounds (bench/batch.py measured 0.83 of the anchor), 3% at 16.
    chunk_rounds: int = Field(16, ge=1)
    max_chunk: int = Field(256, ge=1)
    # Pause before trying again a line the gateway refused for its load (429, 503) or could
    # not be reached for, when the answer names no Retry-After.
    retry_pause_s: float = Field(2.0, gt=0)
    # What `completion_window` may be: hours or days ("24h" is OpenAI's only one).
    completion_windows: tuple[Annotated[str, Field(pattern=r"^[1-9][0-9]*[hd]$")], ...] = ("24h",)
