"""What serves: pools of Ray nodes, the models on them (tools, autoscaling), the CPU fallback
every chain ends on (how models move between pools: placement.py). Each section is validated on
its own (cross-section checks: checks.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from core.config.base import EngineKwargs, EnvVars, Frozen, FrozenDict, ModelName, Name
from core.config.recovery import NoProvisioner, ProvisionerConfig
from core.types import PoolKind, Role

__all__ = [
    "DEFAULT_CAPS",
    "SHM_SPIN_ENV",
    "AdapterConfig",
    "AutoscalingConfig",
    "FallbackConfig",
    "ModelConfig",
    "PoolConfig",
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
UNTAGGED_CAP = 8  # a model with no role
# vLLM's step queues' spin window (deployments/engine/shm_spin.py sets it in the engine's
# processes; cluster/backends.py gives CPU engines 2 ms).
SHM_SPIN_ENV = "GPS_ENGINE_SHM_SPIN_S"


class PoolConfig(Frozen):
    """A set of Ray nodes carrying the custom resource `pool_<name>`."""

    name: Name = Field(description="The pool's name; its nodes carry the Ray resource pool_<name>.")
    kind: PoolKind = Field(
        description="local (this site's GPUs), mesh (nodes joined by hand) or cloud."
    )
    priority: int = Field(0, ge=0, description="Lower is preferred; local pools usually 0.")
    gpu_memory_gb: float | None = Field(
        None,
        gt=0,
        description="Memory of one GPU on the pool's nodes: lets the config guard check GPU "
        "models' weights and KV cache before they start. None: not checked.",
    )
    provisioner: ProvisionerConfig = Field(
        default_factory=NoProvisioner,
        description="What replaces the pool's nodes when they die: none (drained and reported "
        "only), ray_autoscaler, {type: command, ...} or {type: terraform, ...}.",
    )

    @property
    def resource(self) -> str:
        return f"pool_{self.name}"


class ToolsConfig(Frozen):
    """Tool calling for one model, mapped onto vLLM's own options (`tool_call_parser`,
    `enable_auto_tool_choice`, `chat_template`)."""

    parser: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_]*$",
        max_length=40,
        description="vLLM's name for the format the model writes tool calls in (its "
        "tool_call_parser): hermes, llama3_json, mistral, qwen3_xml, pythonic, ... Setting "
        "vLLM's own tool options in engine_kwargs instead is refused.",
    )
    auto_choice: bool = Field(
        True,
        description="Allow `tool_choice: auto` (the model decides; what IDE agents send on "
        "nearly every call): vLLM's enable_auto_tool_choice.",
    )
    strict: bool = Field(
        False,
        description="Hold every call's arguments to its tool's JSON schema while decoding, as "
        "if each tool said strict: true; off, only tools that say so are held, and a forced "
        "call fixes its name but not its arguments.",
    )
    chat_template: str | None = Field(
        None,
        description="A chat template file (relative to the config) that renders tools and tool "
        "results, for a model whose own ignores them; used for every request of the model.",
    )


class AutoscalingConfig(Frozen):
    """Replica counts from load (policy/load_scaling.py), on the pool placement chose: the
    router's queue and the engines' KV cache, read once a second, in the same Serve autoscaling
    policy that carries out placement."""

    min_replicas: int = Field(1, ge=1, description="The fewest replicas while awake.")
    max_replicas: int = Field(ge=1, description="The most replicas load may bring.")
    target_queue_per_replica: float = Field(
        2.0,
        gt=0,
        description="Waiting requests per replica the router may hold before one more "
        "replica is worth it.",
    )
    kv_high: float = Field(
        0.85,
        gt=0,
        le=1,
        description="KV cache usage (0..1, the highest any replica reports) that adds a "
        "replica while requests wait, however short the queue.",
    )
    upscale_delay_s: float = Field(10.0, ge=0, description="Load must call for more this long.")
    downscale_delay_s: float = Field(120.0, ge=0, description="Load must call for fewer this long.")
    # At least 10 s: routers post their load every second and a post stays fresh 10 s.
    scale_to_zero_after_s: float | None = Field(
        None,
        ge=10,
        description="Idle this long (nothing waiting or running): zero replicas, the GPU given "
        "back. None: never below min_replicas.",
    )
    when_asleep: Literal["wait", "next_link"] = Field(
        "wait",
        description="A request for a backend at zero: wait in its queue while one replica "
        "starts (up to wake_timeout_s, then 503), or go to the next link of its chain (the "
        "replica still wakes).",
    )
    wake_timeout_s: float = Field(
        300.0, gt=0, description="The longest a request waits for a wake."
    )

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


# Where Ray Serve LLM's LoRA loader fetches remote adapters from (its dynamic LoRA loading).
REMOTE_ADAPTER_SCHEMES = ("s3://", "gs://", "abfss://", "azure://")


class AdapterConfig(Frozen):
    """A LoRA adapter of its model: a model name of its own, served by the base model's
    replicas (vLLM's multi-LoRA, loaded on a replica when first asked for)."""

    name: ModelName = Field(description="The name clients send for it (unique in the catalog).")
    source: str = Field(
        min_length=1,
        description="A folder in PEFT's format (adapter_config.json and the weights; relative "
        "to the config file), or an s3://, gs://, abfss:// or azure:// folder Ray Serve LLM "
        "downloads it from.",
    )

    @property
    def remote(self) -> bool:
        return self.source.startswith(REMOTE_ADAPTER_SCHEMES)


class ModelConfig(Frozen):
    """One named model, deployable on the listed pools (the first is its home), tagged with the
    role it may stand in for."""

    # Filled in from the role before validation (`_named_by_role`): never empty once loaded.
    name: ModelName = Field(
        "",
        description="The name clients send (unique). Default: the role, so a config with one "
        "model per role needs no names.",
    )
    role: Role | None = Field(
        None,
        description="What `model: <role>`, `model: auto` and the default chains choose it for: "
        "orchestrator, reasoning, vision, coding or embedding; several models may share one. "
        "An embedding model runs vLLM's pooling runner (a *ForCausalLM model with last-token "
        "pooling); for `dimensions` on a Matryoshka model whose config does not say so, set "
        "engine_kwargs.hf_overrides: {is_matryoshka: true}. None: reached by name only.",
    )
    default: bool = Field(
        False,
        description="The model `model: <role>` reaches among several of its role. None marked: "
        "the first listed.",
    )
    fallbacks: tuple[ModelName, ...] = Field(
        (),
        description="Models (by name) its requests fail over to, in order; cpu-fallback ends "
        "every text chain whether listed or not. Empty: the other models of its role in config "
        "order (none for an embedding model: another model's vectors would not compare).",
    )
    source: str = Field(
        min_length=1,
        description="A local path (./, ../, /, ~; relative to the config file) or a hub id.",
    )
    aliases: tuple[ModelName, ...] = Field(
        (),
        description="More names clients may send; each names one model and may not shadow a "
        "role or auto.",
    )
    context_window: int = Field(
        ge=256,
        description="vLLM's max_model_len; the config guard checks it against the model's "
        "maximum position and the KV cache.",
    )
    engine_kwargs: EngineKwargs = Field(
        default_factory=FrozenDict,
        description="vLLM engine arguments, passed through ray.serve.llm (the config guard "
        "reads dtype, kv_cache_dtype, quantization, gpu_memory_utilization, "
        "tensor_parallel_size, max_num_seqs, block_size, num_gpu_blocks_override, "
        "kv_cache_memory_bytes).",
    )
    device: Literal["cpu", "gpu"] = Field("gpu", description="Which vLLM engine runs it.")
    cpu_dtype: Literal["auto", "as_configured"] = Field(
        "auto",
        description="CPU engines: auto serves a 16-bit dtype (engine_kwargs.dtype bfloat16, "
        "float16 or auto) in float32 on a node whose CPU has neither AVX512-BF16 nor AMX, where "
        "vLLM would emulate it (4x slower to prefill there, 1.7x faster to decode; twice the "
        "bytes for weights and KV, which the config guard reckons with). float16 is judged by "
        "the same flags, so a CPU with AVX512-BF16 but no AVX512-FP16 keeps it, converted. "
        "as_configured: engine_kwargs.dtype on every node.",
    )
    cpus_per_replica: float = Field(
        1.0,
        gt=0,
        description="CPU engines: logical CPUs one replica reserves (its engine runs "
        "OMP_NUM_THREADS threads).",
    )
    env_vars: EnvVars = Field(
        default_factory=FrozenDict,
        description="The replica's environment (e.g. VLLM_CPU_KVCACHE_SPACE; "
        "GPS_ENGINE_SHM_SPIN_S: seconds vLLM's engine processes spin for their next step, 0.002 "
        "on CPU engines unless set here, vLLM's 1 s on GPU engines).",
    )
    placement_priority: Literal["P0", "P1", "P2", "P3"] = Field(
        "P1", description="P0 is never offloaded from its home pool; P3 is offloaded first."
    )
    pools: tuple[Name, ...] = Field(
        min_length=1,
        description="Pools it may run on, preferred first; it is deployed on the first (its home).",
    )
    replicas: int = Field(
        1, ge=1, description="Replicas per backend (with autoscaling: the count it starts with)."
    )
    max_concurrency: int | None = Field(
        None,
        description="The router's cap on the backend at `replicas` replicas. None: orchestrator "
        "24, reasoning 8, vision 4, coding 6, embedding 16, no role 8.",
    )
    tools: ToolsConfig | None = Field(
        None,
        description="Tool calling. None: a request that may call a tool is a 400 "
        "tools_not_supported.",
    )
    images: bool | None = Field(
        None,
        description="Whether its engine reads images: requests with images go only to models "
        "that do. None: settled when the config is loaded, from the model's config.json (a "
        "`vision_config` says yes; a hub id from the local Hugging Face cache only), else its "
        "role (vision: yes).",
    )
    autoscaling: AutoscalingConfig | None = Field(
        None,
        description="Replica counts from load. None: `replicas` is the count (placement still "
        "moves them between pools).",
    )
    adapters: tuple[AdapterConfig, ...] = Field(
        (),
        description="LoRA adapters of this model, each a model name of its own served by this "
        "model's replicas (vLLM's enable_lora, max_loras = their count, max_lora_rank from the "
        "local adapters' rank; engine_kwargs may set these). Each fails over along this "
        "model's chain.",
    )

    @model_validator(mode="before")
    @classmethod
    def _named_by_role(cls, data: Any) -> Any:
        """A model without a name is named by its role (the configs of one model per role)."""
        if isinstance(data, dict) and not data.get("name"):
            if data.get("role") is None:
                raise ValueError(
                    "a model needs a name (what clients send) or a role (its name then)"
                )
            return {**data, "name": data["role"]}
        return data

    @property
    def generates(self) -> bool:
        """Whether it answers chats and completions (every model but an embedding one)."""
        return self.role is None or self.role.generates

    @property
    def cap(self) -> int:
        """The router's cap on the backend at `replicas` replicas."""
        if self.max_concurrency is not None:
            return self.max_concurrency
        return DEFAULT_CAPS[self.role] if self.role is not None else UNTAGGED_CAP

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

    @model_validator(mode="after")
    def _spin_window_in_seconds(self) -> Self:
        value = self.env_vars.get(SHM_SPIN_ENV)
        if value is None:
            return self
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"env_vars.{SHM_SPIN_ENV} is how long the engine's processes spin for their "
                f"next step: seconds, 0 or more (got {value!r})"
            )
        return self

    @property
    def home_pool(self) -> str:
        return self.pools[0]


class FallbackConfig(Frozen):
    """The CPU replica every chain ends on: it has no GPU memory to run out of."""

    engine: Literal["ollama", "llama_server", "llama_cpp", "auto"] = Field(
        "auto",
        description="auto: Ollama where its binary is on the node, else llama.cpp's own "
        "`llama-server` (make install builds it), else llama_cpp (one request at a time; "
        "`make llama-cpp-python` installs it).",
    )
    parallel: int = Field(
        4,
        ge=1,
        description="Requests the engine decodes at once (llama-server's slots, each with the "
        "whole window; OLLAMA_NUM_PARALLEL); more wait in the replica, users first. llama_cpp "
        "decodes one.",
    )
    prompt_cache_mib: int = Field(
        0,
        ge=0,
        description="llama-server: RAM for its prompt cache (--cache-ram; 0: off, as measured).",
    )
    source: str = Field(
        min_length=1,
        description="A .gguf path (relative to the config), or for Ollama a model name to pull.",
    )
    mmproj: str | None = Field(
        None,
        description="The model's multimodal projector, a .gguf path (relative to the config; "
        "llama.cpp's convert_hf_to_gguf.py --mmproj writes it): llama-server loads it "
        "(--mmproj) and the fallback reads images, so an image chain's last link still answers "
        "one. With it, auto chooses llama-server; Ollama and llama_cpp read no images here.",
    )
    context_window: int = Field(2048, ge=256, description="Its window, in tokens.")
    max_concurrency: int = Field(8, description="The router's cap on it.")
    pool: Name | None = Field(None, description="CPU pool to run on; none means the head node.")
    tokenizer: str | None = Field(
        None,
        description="What to count with exactly (a Hugging Face path or hub id). None: the "
        "GGUF's own tokenizer and chat template; an Ollama model name is counted by estimate.",
    )
    tools: ToolsConfig | None = Field(
        None,
        description="Tool calling: llama.cpp reads hermes calls back from the text (with "
        "chat_template where the GGUF's own ignores tools; with one, auto chooses llama.cpp); "
        "Ollama with its model's template. A forced tool_choice holds the answer to the call's "
        "JSON schema; a stream of a request with tools is sent when the answer is whole.",
    )
    threads: int = Field(2, ge=1, description="CPU threads the engine computes with.")
    n_gpu_layers: int = Field(
        0,
        ge=-1,
        description="Layers offloaded to the node's GPU, the rest in RAM (-1: all). At 0 the "
        "engine does not see the GPU (CUDA_VISIBLE_DEVICES hidden); with layers, the node's "
        "probe keeps the engine's VRAM from placement while it restarts. llama.cpp needs a "
        "CUDA build there; Ollama takes a count as its `num_gpu` (-1: its own choice).",
    )
    num_cpus: float = Field(1.0, ge=0, description="CPUs the replica reserves from Ray.")
    ollama_model: ModelName = Field(
        "gps-fallback",
        description="Ollama: the model created from the GGUF (or pulled, when source is a name).",
    )
    keep_alive: str = Field(
        "1h",
        pattern=r"^-?[0-9]+(ms|s|m|h)?$",
        description="Ollama: how long it keeps the model loaded after a request.",
    )
    ollama_models_dir: str | None = Field(
        None, description="Ollama: where it stores models (None: Ollama's default)."
    )

    @property
    def is_gguf_file(self) -> bool:
        return self.source.endswith(".gguf")

    @model_validator(mode="after")
    def _engine_can_serve(self) -> Self:
        if self.engine in ("llama_cpp", "llama_server") and not self.is_gguf_file:
            raise ValueError(
                f"source {self.source!r}: the {self.engine} engine serves a GGUF file; give the "
                "path of a .gguf file, or use engine ollama to pull a model by name"
            )
        if self.mmproj is not None:
            if not self.mmproj.endswith(".gguf") or not self.is_gguf_file:
                raise ValueError(
                    "mmproj: llama-server reads images with a projector .gguf beside the model's "
                    ".gguf file; give both as .gguf paths"
                )
            if self.engine in ("ollama", "llama_cpp"):
                raise ValueError(
                    f"mmproj: the {self.engine} engine reads no images here; use engine "
                    "llama_server (or auto), or leave mmproj out"
                )
        if self.tools is not None and self.tools.chat_template is not None:
            if self.engine == "ollama":
                raise ValueError(
                    "tools.chat_template: a Jinja template is for llama.cpp; Ollama renders with "
                    "its model's own template (leave chat_template out, or use engine auto)"
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
