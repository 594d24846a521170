"""How requests flow: client keys and their limits, the front door, the router's admission,
breakers and failover, the depth router for `model: auto`, and the Batch API. Each section is
validated on its own (cross-section checks: checks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, field_validator, model_validator

from core.config.base import SHA256_HEX, Frozen, FrozenDict, Name, frozen_dict
from core.types import Depth, PriorityClass, Role

__all__ = [
    "DEFAULT_CLASS_SHARES",
    "DEFAULT_DEPTH_ROUTES",
    "ApiKeyConfig",
    "BatchConfig",
    "DepthConfig",
    "DepthRoute",
    "GatewayConfig",
    "KeyFields",
    "RouterConfig",
]


# A model name or an fnmatch glob over model names (`*`, `?`, `[...]`).
ModelPattern = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9*?\[][A-Za-z0-9._:/*?\[\]-]*$", max_length=100)
]


class KeyFields(Frozen):
    """What a key may do and how much: the fields a config key and a run-time key share
    (`POST /v1/keys` takes these)."""

    name: Name = Field(description="Who holds the key (logs and usage name it so).")
    priority: PriorityClass = Field(
        PriorityClass.USER, description="The class of its requests without X-Priority."
    )
    max_priority: PriorityClass = Field(
        PriorityClass.USER, description="The highest class X-Priority may claim with it."
    )
    # Limits are enforced at admission across every ingress replica (policy/key_limits.py).
    rpm: int | None = Field(None, ge=1, description="Requests per sliding minute (None: no limit).")
    tpm: int | None = Field(
        None, ge=1, description="Tokens (prompt + completion) per sliding minute."
    )
    max_parallel: int | None = Field(None, ge=1, description="Requests in progress at once.")
    budget_tokens: int | None = Field(None, ge=1, description="Tokens per budget_period.")
    budget_period: Literal["day", "week", "month"] = Field(
        "month", description="The calendar period of budget_tokens, in UTC."
    )
    models: tuple[ModelPattern, ...] | None = Field(
        None,
        description="The models it may use: names or globs (`coder-*`), matched against the "
        "name asked for and the model it reaches (an alias, a role's name); `auto` must be "
        "listed to be used, and its choice must be allowed too. Any other name is a 403 "
        "model_not_allowed, whether or not it exists. None: every model.",
    )

    @model_validator(mode="after")
    def _priority_within_cap(self) -> Self:
        if self.priority.rank < self.max_priority.rank:
            raise ValueError(
                f"priority {self.priority.value!r} is above max_priority "
                f"{self.max_priority.value!r}; lower priority or raise max_priority"
            )
        return self


class ApiKeyConfig(KeyFields):
    """A client key, stored only as its SHA-256 (`python -m cluster.keys hash`: key on stdin)."""

    sha256: str = Field(
        description="The key's SHA-256, 64 hex digits, never the key itself "
        "(`python -m cluster.keys hash`, which reads the key from stdin or a prompt, or `... new`)."
    )
    admin: bool = Field(
        False,
        description="May read every key's usage (GET /v1/keys/usage) and create, list, change "
        "and revoke run-time keys (/v1/keys). Only config keys can be admin keys.",
    )

    @field_validator("sha256", mode="before")
    @classmethod
    def _digest_is_hex(cls, value: Any) -> Any:
        if isinstance(value, int):
            raise ValueError("quote the digest in YAML: an all-digit value reads as a number")
        if not isinstance(value, str) or not SHA256_HEX.match(value):
            raise ValueError(
                "must be the 64-hex-digit SHA-256 of the key, never the key itself: "
                "run `python -m cluster.keys hash` (it reads the key from stdin or a prompt)"
            )
        return value


class DepthRoute(Frozen):
    """Where one depth goes: a role, and the share of that role's window it may use."""

    role: Role = Field(description="The role this depth goes to.")
    context_share: float = Field(
        1.0, gt=0, le=1, description="The share of that role's window a request may use."
    )


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
        default_factory=lambda: _all_depth_routes({}),
        description="Each depth's route (quick, balanced, deep, exhaustive); those not given "
        "keep theirs: quick and balanced to the orchestrator (quick with a quarter of its "
        "window), deep and exhaustive to reasoning.",
    )
    quick_max_words: int = Field(25, ge=0, description="At most this many words: quick.")
    deep_min_words: int = Field(250, ge=1, description="At least this many words: deep.")
    deep_min_questions: int = Field(3, ge=1, description="At least this many questions: deep.")
    exhaustive_min_words: int = Field(
        1500, ge=1, description="At least this many words: exhaustive."
    )

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
    """The front door: request limits, default class, replicas, where it runs."""

    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="The largest request body (413 past it)."
    )
    # A chat request nests about 6 deep (body, messages, message, content, part, image_url) and a
    # tool's JSON schema a few more; past 64 it is an attack or a bug. The bound keeps parsing,
    # pydantic, pickling and chat templates far from Python's recursion limit (about 1000).
    max_json_depth: int = Field(
        64, ge=8, le=512, description="The deepest nesting a request body may have (400 past it)."
    )
    # Each message costs fitting and template work before an engine sees it; a body limit alone
    # lets 8 MiB of empty messages through. 10k is far past any real conversation.
    max_messages: int = Field(
        10_000, ge=1, description="The most messages a request may hold (400 past it)."
    )
    default_priority: PriorityClass = Field(
        PriorityClass.USER, description="The class of a request with no key and no X-Priority."
    )
    ingress_replicas: int = Field(1, ge=1, description="Ingress replicas (each runs a router).")
    router_replicas: int = Field(
        1,
        ge=1,
        description="Router replicas when the router has a deployment of its own "
        "(router_in_ingress: false); they share each backend's slots (shared_slots).",
    )
    # One Serve hop fewer per request is what keeps the gateway within 10% of bare
    # ray.serve.llm at 32 clients (bench/overhead.py).
    router_in_ingress: bool = Field(
        True,
        description="The router in each ingress replica's process; false gives the router a "
        "deployment of its own.",
    )
    shared_slots: bool = Field(
        True,
        description="With several routers (ingress_replicas, or router_replicas), one set of "
        "slots per backend for all: each router admits under a lease the app's slot broker "
        "moves to where users wait; false: each router keeps cap // routers.",
    )
    log_encoding: Literal["TEXT", "JSON"] = Field(
        "TEXT",
        description="How every deployment of the app writes its log lines (Serve's logging "
        "encoding): JSON is one object a line, with the request's id, the deployment and the "
        "replica as fields, for a fleet's log pipeline.",
    )
    keys_db: Path = Field(
        Path(".keys/keys.sqlite3"),
        description="The SQLite file of the run-time keys (/v1/keys), relative to the config "
        "file: they outlive the app, a redeploy and a GCS restart. On a multi-node gateway: "
        "storage every gateway node mounts, as batches.directory. Used only where api_keys "
        "are configured.",
    )
    resource: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The Ray resource of the nodes the ingress, router, placement actor, "
        "cluster manager and (without fallback.pool) the CPU fallback run on; none means the "
        "head node. Never a pool's resource: a node that can die must not take the front door "
        "with it.",
    )

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

    max_queue: int = Field(64, ge=0, description="Waiting requests per backend.")
    # What a class leaves of the cap is headroom for the classes above it, so interactive work
    # never waits behind a full load of batch work.
    class_shares: Annotated[
        dict[PriorityClass, Annotated[float, Field(gt=0, le=1)]],
        AfterValidator(_all_class_shares),
    ] = Field(
        default_factory=lambda: _all_class_shares({}),
        description="The share of each backend's cap a class may fill (user 1.0, agent 0.75, "
        "background 0.5; at least one slot each); user must be 1.0 and shares may not grow "
        "down the classes.",
    )
    queue_timeout_s: float = Field(30.0, gt=0, description="The longest wait for a slot (429).")
    aging_s: float = Field(10.0, gt=0, description="A waiter gains one class per aging_s.")
    retry_after_s: int = Field(2, ge=1, description="Retry-After on a 429 for load.")
    breaker_failures: int = Field(3, ge=1, description="Consecutive faults that open a breaker.")
    breaker_cooldown_s: float = Field(
        10.0, gt=0, description="Open this long before a probe request may pass (half-open)."
    )
    half_open_probes: int = Field(1, ge=1, description="Requests let through while half-open.")
    kv_cache_high: float = Field(
        0.88, gt=0, le=1, description="KV cache usage above which a backend gets no new work."
    )
    kv_cache_resume_factor: float = Field(
        0.9, gt=0, lt=1, description="It takes work again below kv_cache_high times this."
    )
    kv_poll_interval_s: float = Field(1.0, gt=0, description="Between KV usage readings.")
    kv_stale_after_s: float = Field(
        10.0, gt=0, description="A reading older than this counts as pressure."
    )
    # Serve's status costs the controller and us ~0.2 s of CPU a read: read it often only while
    # some backend is in trouble (tripped, down, recovering), seldom while all are well.
    health_interval_s: float = Field(
        5.0, gt=0, description="Between health reads while some backend is in trouble."
    )
    health_idle_interval_s: float = Field(
        30.0, gt=0, description="Between health reads while all are well."
    )
    first_token_timeout_s: float = Field(
        120.0, gt=0, description="A backend with no first token for this long has failed."
    )
    stream_idle_timeout_s: float = Field(
        120.0, gt=0, description="A stream silent for this long has failed."
    )
    # How often Serve's controller checks each vLLM replica: the check is what tells it a
    # replica died (a SIGKILL, an OOM kill). Until then Serve's handles may still route to the
    # dead replica and hold requests; Serve's default is 10 s. A check is an in-memory look at
    # the engine (vLLM's check_health): cheap at 2 s. Three failed checks in a row stop a
    # replica (6 s at 2 s).
    replica_health_check_period_s: float = Field(
        2.0,
        gt=0,
        description="How often Serve checks each vLLM replica (its own default is 10 s, which "
        "the CPU fallback keeps): the check is how Serve learns a replica died, and until then "
        "its handles may still route there. Three failed checks in a row stop a replica.",
    )
    engine_priority: bool = Field(
        True,
        description="The class reaches the engine: vLLM's priority scheduler on every vLLM "
        "backend, each request at its class's number (engine_priorities; lower runs first, and "
        "where the KV cache runs out the highest is preempted first); the CPU fallback serves "
        "the lowest first too. Off: FCFS, every request at 0.",
    )
    prefix_routing: bool = Field(
        True,
        description="A backend that may run more than one replica picks one per request by "
        "session and prefix (over Ray Serve LLM's PrefixCacheAffinityRouter). Off: Serve's "
        "power-of-two choice.",
    )
    prefix_imbalance: int = Field(
        2,
        ge=0,
        description="How many requests busier than the least loaded replica a conversation's "
        "or prefix's replica may be before the request goes elsewhere.",
    )
    engine_priorities: Annotated[
        dict[PriorityClass, Annotated[int, Field(ge=-(2**31), lt=2**31)]],
        AfterValidator(_all_engine_priorities),
    ] = Field(
        default_factory=lambda: _all_engine_priorities({}),
        description="Each class's number at the engine (user 0, agent 1, background 2); never "
        "falling down the classes.",
    )

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

    directory: Path = Field(
        Path(".batches"),
        description="Batch state (SQLite) and files, relative to the config file. On a "
        "multi-node gateway: storage every gateway node mounts (NFS, EFS), with "
        "shared_storage, so the service restarted on another node finds it.",
    )
    # SQLite's WAL keeps its index in memory shared by processes on one host, which a network
    # filesystem cannot give: there the rollback journal (one writer, as here, is all it needs).
    shared_storage: bool = Field(
        False,
        description="The directory is on a network filesystem: SQLite's rollback journal "
        "instead of WAL.",
    )
    max_file_bytes: int = Field(
        200 * 1024 * 1024, ge=1024, description="The largest input file (OpenAI's limit)."
    )
    max_lines: int = Field(50_000, ge=1, description="The most lines a file may hold (OpenAI's).")
    max_line_bytes: int = Field(1024 * 1024, ge=1024, description="The longest line.")
    # A chunk's last lines run with slots idle (the next chunk waits for its commit): about
    # 1/(2 x rounds) of the throughput, 12% at 4 rounds (bench/batch.py measured 0.83 of the
    # anchor), 3% at 16.
    chunk_rounds: int = Field(
        16,
        ge=1,
        description="A committed chunk is this many rounds of what the role's backends run at "
        "background priority at once: the most a crash can make the service run again.",
    )
    max_chunk: int = Field(256, ge=1, description="The most lines in one chunk.")
    retry_pause_s: float = Field(
        2.0,
        gt=0,
        description="Before trying again a line the gateway refused for its load (429, 503) or "
        "could not be reached for, when the answer names no Retry-After.",
    )
    completion_windows: tuple[Annotated[str, Field(pattern=r"^[1-9][0-9]*[hd]$")], ...] = Field(
        ("24h",),
        description="What completion_window may be, in hours or days (24h is OpenAI's only).",
    )
