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
    "DEFAULT_DEPTH_ROUTES",
    "IMAGE_FORMATS",
    "ApiKeyConfig",
    "BatchConfig",
    "DepthConfig",
    "DepthRoute",
    "GatewayConfig",
    "KeyFields",
    "MediaConfig",
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


ImageFormat = Literal["png", "jpeg", "webp", "gif", "bmp", "tiff"]
IMAGE_FORMATS: tuple[ImageFormat, ...] = ("png", "jpeg", "webp", "gif")
# A host name of two labels or more whose last is not a number (so never an address), lower
# case, or `*.` and one: its subdomains.
DomainPattern = Annotated[
    str,
    Field(
        pattern=r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"
    ),
]


class MediaConfig(Frozen):
    """What an image a request carries may be. Checked at the edge from the image's own header,
    before an engine decodes it: an image that would take an engine's memory with it (a
    decompression bomb) or that it cannot read is the client's 400, never a dead replica."""

    # The engines are started with the same limit (vLLM's limit_mm_per_prompt), unless a
    # model's engine_kwargs set a higher one.
    max_images_per_request: int = Field(
        8,
        ge=0,
        description="The most images one request may carry (0: none). Image-reading engines "
        "are started with it as vLLM's limit_mm_per_prompt; a model's engine_kwargs may not "
        "set a lower one.",
    )
    # Anthropic's limit too; in base64 it is 6.7 MiB, within max_body_bytes' default 8.
    max_image_bytes: int = Field(
        5 * 1024 * 1024, ge=1024, description="The largest image, in bytes once decoded."
    )
    # 8K by 4K: past any screenshot; an engine resizes it down to its tiles anyway. Pillow
    # refuses to open past twice its own bomb limit (178,956,970): the most ours can be.
    max_image_pixels: int = Field(
        33_177_600,
        ge=1,
        le=178_956_970,
        description="The most pixels (width x height) an image may have.",
    )
    image_formats: tuple[ImageFormat, ...] = Field(
        IMAGE_FORMATS,
        min_length=1,
        description="The image formats taken, by what the image's bytes are (not what the "
        "data URL claims).",
    )
    # Off by default: an image URL is a request to fetch from wherever the fetcher runs.
    allowed_domains: tuple[DomainPattern, ...] = Field(
        (),
        description="Hosts the gateway fetches images by URL from (http or https), once, itself, "
        "before routing: a name (`images.example.com`) or its subdomains (`*.example.com`), "
        "never an address. Whatever DNS answers, an address that is not public (loopback, "
        "private, link-local and cloud metadata, unique-local, IPv4 forms inside IPv6) is "
        "refused, at every redirect. Empty: an image must come inline, as a data URL.",
    )
    fetch_timeout_s: float = Field(
        10.0, gt=0, le=120, description="The longest an image's fetch may take, redirects and all."
    )
    max_redirects: int = Field(
        3, ge=0, le=10, description="Redirects a fetch follows, each checked as the first URL."
    )


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
    media: MediaConfig = Field(
        default_factory=MediaConfig, description="What images a request may carry."
    )
    default_priority: PriorityClass = Field(
        PriorityClass.USER, description="The class of a request with no key and no X-Priority."
    )
    # Claude Code sends claude-* names unless told otherwise, Codex gpt-*: a pattern lets an
    # agent that cannot be told work unchanged.
    model_patterns: Annotated[dict[str, str], AfterValidator(frozen_dict)] = Field(
        default_factory=FrozenDict,
        description="Model names no model, alias or role has, by glob (fnmatch, the first "
        "that matches in order) to the name they reach, e.g. {'claude-*haiku*': "
        "orchestrator, 'claude-*': coding}: an agent that sends its vendor's names works "
        "unchanged. A key's `models` are checked against both names.",
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
    responses_db: Path = Field(
        Path(".responses/responses.sqlite3"),
        description="The SQLite file of the Responses API's stored responses (store: true, "
        "the default; previous_response_id and GET /v1/responses/{id} read them), relative to "
        "the config file. On a multi-node gateway: storage every gateway node mounts, as "
        "keys_db.",
    )
    responses_retention_s: float = Field(
        30 * 24 * 3600.0,
        gt=0,
        description="How long a stored response is kept from its creation (OpenAI's 30 days); "
        "an expired one is gone for GET, DELETE and previous_response_id alike.",
    )
    resource: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The Ray resource of the nodes the ingress, router, placement actor, "
        "cluster manager and (without fallback.pool) the CPU fallback run on; none means the "
        "head node. Never a pool's resource: a node that can die must not take the front door "
        "with it.",
    )
    # Serve's HTTP proxies are the front door's first hop. HeadOnly: a pool node that dies never
    # takes client connections with it, but the head does. EveryNode: one more on every node
    # that runs a replica, gateway nodes (`resource`) included, so a load balancer in front of
    # those keeps answering while the head is replaced (GCS fault tolerance, docs/operations.md).
    proxy_location: Literal["HeadOnly", "EveryNode"] = Field(
        "HeadOnly",
        description="Where Serve runs its HTTP proxies when `serve run` starts Serve: HeadOnly, "
        "or EveryNode (every node with a replica; with `resource` and GCS fault tolerance, "
        "clients behind a load balancer on the gateway nodes outlive the head). Where Serve "
        "is started elsewhere (`serve start`, a RayService's serveConfigV2), say the same "
        "there.",
    )

    @property
    def router_shares(self) -> int:
        """How many routers split every cap: router replicas, or ingress replicas when each
        runs its own."""
        return self.ingress_replicas if self.router_in_ingress else self.router_replicas


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
