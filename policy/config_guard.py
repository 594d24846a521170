"""The config guard (pure): what cannot start or will crash is refused, what will degrade is
warned about, each with its arithmetic and the key to change.

Refused: a window above what the model was built for, `gpu_memory_utilization` above 0.95 (the
rest of the GPU is CUDA's context and other processes'), weights that do not fit the memory the
engine may use, a KV cache that cannot hold one sequence of the window (vLLM refuses to start),
a checkpoint quantization the weights are not in, a CPU engine's block size its attention cannot
take. Warned: a router cap that lets more
full-window sequences run than the KV cache holds (vLLM then preempts and recomputes), a cap
above `max_num_seqs` (the rest would queue inside the engine, out of our priority order), prefix
caching where prompts share nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from core.config import ClusterConfig, ModelConfig
from core.types import Role
from policy.cpu_dtype import served_model
from policy.engine_memory import (
    CHECKPOINT_QUANTIZATIONS,
    DTYPE_BYTES,
    ONLINE_QUANTIZATIONS,
    EngineMemory,
    GiB,
    ModelGeometry,
    plan_engine,
)

__all__ = ["MAX_GPU_UTILIZATION", "Finding", "guard_config", "guard_model", "guarded_plan"]

MAX_GPU_UTILIZATION = 0.95
# vLLM's CPU attention backend takes KV blocks of a multiple of this many tokens.
CPU_BLOCK_MULTIPLE = 32
KV_DTYPES = frozenset({"auto", *(d for d, size in DTYPE_BYTES.items() if size <= 2)})


@dataclass(frozen=True)
class Finding:
    level: Literal["refuse", "warn", "note"]
    where: str  # the config key, e.g. models[0].context_window
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper()} {self.where}: {self.message}"


def guard_config(
    config: ClusterConfig, geometries: Mapping[int, ModelGeometry | str]
) -> list[Finding]:
    """Every model's findings; `geometries[i]` is models[i]'s geometry, or why it was not read."""
    findings = []
    for i, model in enumerate(config.models):
        geometry = geometries.get(i, "not read")
        if isinstance(geometry, str):
            findings.append(Finding("note", f"models[{i}].source", f"not checked: {geometry}"))
            findings += _without_geometry(i, model)
            continue
        pool = config.pool(model.home_pool)
        gpu_bytes = None if pool.gpu_memory_gb is None else int(pool.gpu_memory_gb * GiB)
        findings += guard_model(i, model, geometry, gpu_bytes)
    return findings


def guard_model(
    i: int, model: ModelConfig, geometry: ModelGeometry, gpu_bytes: int | None
) -> list[Finding]:
    at = f"models[{i}]"
    findings = _without_geometry(i, model)
    if any(f.level == "refuse" for f in findings):
        return findings  # the arithmetic below would rest on a setting vLLM refuses
    findings += _quantization(at, model, geometry)
    if model.context_window > geometry.max_positions:
        findings.append(
            Finding(
                "refuse",
                f"{at}.context_window",
                f"{model.context_window} is above the model's own maximum position "
                f"({geometry.max_positions}, config.json max_position_embeddings); lower it "
                f"to {geometry.max_positions} or less",
            )
        )
    findings += _memory(at, model, guarded_plan(model, geometry, gpu_bytes))
    return findings


def guarded_plan(
    model: ModelConfig, geometry: ModelGeometry, gpu_bytes: int | None
) -> EngineMemory:
    """The engine the guard reckons with: a CPU engine as a node without bf16 math serves it
    (policy/cpu_dtype.py), since the pool's nodes are not known here and there its weights and
    KV tokens take the most bytes."""
    return plan_engine(served_model(model, native_bf16=False), geometry, gpu_bytes)


def _without_geometry(i: int, model: ModelConfig) -> list[Finding]:
    at = f"models[{i}].engine_kwargs"
    kwargs = model.engine_kwargs
    findings = []
    utilization = kwargs.get("gpu_memory_utilization")
    if (
        model.device == "gpu"
        and utilization is not None
        and float(utilization) > MAX_GPU_UTILIZATION
    ):
        findings.append(
            Finding(
                "refuse",
                f"{at}.gpu_memory_utilization",
                f"{utilization} leaves less than {1 - MAX_GPU_UTILIZATION:.0%} of the GPU for "
                f"CUDA's context, NCCL and other processes; the engine dies with out-of-memory "
                f"errors under load. Use {MAX_GPU_UTILIZATION} or less",
            )
        )
    block_size = kwargs.get("block_size")
    if model.device == "cpu" and block_size is not None and int(block_size) % CPU_BLOCK_MULTIPLE:
        fixed = max(1, int(block_size) // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE
        findings.append(
            Finding(
                "refuse",
                f"{at}.block_size",
                f"{block_size} is not a multiple of {CPU_BLOCK_MULTIPLE}, the block size vLLM's "
                f"CPU attention takes (its engine fails to start: 'No common block size'); use "
                f"{fixed}",
            )
        )
    kv_dtype = str(kwargs.get("kv_cache_dtype", "auto"))
    if kv_dtype not in KV_DTYPES:
        findings.append(
            Finding(
                "refuse",
                f"{at}.kv_cache_dtype",
                f"{kv_dtype!r} is not a KV cache dtype; use one of {sorted(KV_DTYPES)}",
            )
        )
    if model.role is Role.EMBEDDING and kwargs.get("enable_prefix_caching") is True:
        findings.append(
            Finding(
                "warn",
                f"{at}.enable_prefix_caching",
                "embedding inputs share no prefix, so the cache only costs lookups and "
                "memory; remove it",
            )
        )
    return findings


def _quantization(at: str, model: ModelConfig, geometry: ModelGeometry) -> list[Finding]:
    method = model.engine_kwargs.get("quantization")
    if method is None:
        return []
    stored = geometry.checkpoint_quantization
    if method in ONLINE_QUANTIZATIONS or (stored is not None and str(method).startswith(stored)):
        return []
    if method in CHECKPOINT_QUANTIZATIONS:
        found = f"quantized with {stored!r}" if stored else "not quantized (no quantization_config)"
        return [
            Finding(
                "refuse",
                f"{at}.engine_kwargs.quantization",
                f"{method!r} loads weights saved in that format, and {model.source} is "
                f"{found}; point source at a {method} checkpoint, or use fp8 (quantized as it "
                "loads)",
            )
        ]
    return [
        Finding(
            "note",
            f"{at}.engine_kwargs.quantization",
            f"{method!r}: weights counted at their size on disk",
        )
    ]


def _memory(at: str, model: ModelConfig, plan: EngineMemory) -> list[Finding]:
    findings = []
    weights_gib = plan.weight_bytes / GiB
    if plan.usable_bytes is not None and plan.weight_bytes >= plan.usable_bytes:
        findings.append(
            Finding(
                "refuse",
                f"{at}.engine_kwargs.gpu_memory_utilization",
                f"the weights ({weights_gib:.2f} GiB) do not fit the {plan.usable_bytes / GiB:.2f}"
                " GiB the engine may use (gpu_memory_utilization x the pool's gpu_memory_gb x "
                "tensor_parallel_size); quantize them, add tensor parallelism or use a larger GPU",
            )
        )
        return findings
    tokens = plan.kv_tokens
    if tokens is None or plan.kv_cache_bytes is None:
        findings.append(
            Finding("note", f"{at}", f"KV cache size unknown before start: {plan.kv_source}")
        )
        return findings
    arithmetic = (
        f"KV cache {plan.kv_cache_bytes / GiB:.2f} GiB ({plan.kv_source}) / "
        f"{plan.kv_bytes_per_token} bytes per token = {tokens} tokens in whole blocks of "
        f"{plan.block_size}, less the one vLLM holds back"
    )
    if tokens < model.context_window:
        findings.append(
            Finding(
                "refuse",
                f"{at}.context_window",
                f"one sequence of {model.context_window} tokens does not fit: {arithmetic}. "
                f"Lower context_window to {tokens} or give the engine more KV cache memory",
            )
        )
        return findings
    per_replica = math.ceil(model.cap / model.replicas)
    full = tokens // model.context_window
    if per_replica > full:
        findings.append(
            Finding(
                "warn",
                f"{at}.max_concurrency",
                f"the router lets {per_replica} requests run on each replica (cap {model.cap} "
                f"over {model.replicas}), and {arithmetic}: {full} sequences of the full "
                f"{model.context_window}-token window. Should more grow that long, the engine "
                f"preempts and recomputes them; max_concurrency {full * model.replicas} rules "
                "that out",
            )
        )
    if per_replica > plan.max_num_seqs:
        findings.append(
            Finding(
                "warn",
                f"{at}.max_concurrency",
                f"the router lets {per_replica} requests run on each replica, and the engine "
                f"runs {plan.max_num_seqs} at once (engine_kwargs.max_num_seqs): the rest queue "
                "inside the engine, where a user's request waits for a running sequence to end "
                "whatever its priority (vLLM preempts only for KV memory); lower "
                "max_concurrency or raise max_num_seqs",
            )
        )
    return findings
