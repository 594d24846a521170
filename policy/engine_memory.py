"""What an engine's memory will hold, from the model's own config and ours (pure arithmetic).

vLLM's KV cache stores, per token, a key and a value vector for every layer and KV head:
2 x layers x kv_heads x head_dim x bytes per element. The cache gets what its memory setting
says: on a CPU engine `VLLM_CPU_KVCACHE_SPACE` GiB (or `kv_cache_memory_bytes`); on a GPU
`gpu_memory_utilization` of the GPU less the weights (and less activations, which only a live
engine knows: the figure here is an upper bound, so a refusal from it is certain). vLLM hands it
out in blocks of `block_size` tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.config import ModelConfig

__all__ = [
    "CHECKPOINT_QUANTIZATIONS",
    "DTYPE_BYTES",
    "KV_SPACE_ENV",
    "ONLINE_QUANTIZATIONS",
    "EngineMemory",
    "GiB",
    "ModelGeometry",
    "geometry_from_hf_config",
    "plan_engine",
]

GiB = 1 << 30
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "int8": 1,
}
# Quantized weights read from a checkpoint made for them (config.json's quantization_config).
CHECKPOINT_QUANTIZATIONS = frozenset(
    {"awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors"}
)
# Weights quantized by the engine as it loads a 16-bit checkpoint: one byte per parameter.
ONLINE_QUANTIZATIONS = frozenset({"fp8"})
# vLLM 0.32's defaults: block size 128 on CPU, 16 on GPU; max_num_seqs for an API server 128 on
# CPU, 256 on a GPU, 1024 on a GPU of 70 GiB or more (vllm/engine/arg_utils.py).
CPU_BLOCK, GPU_BLOCK = 128, 16
DEFAULT_GPU_UTILIZATION = 0.92


@dataclass(frozen=True)
class ModelGeometry:
    """What the model's config.json and weight files say about its size."""

    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int  # the longest context the model was built for
    checkpoint_dtype: str  # the weights' dtype on disk
    weight_bytes_on_disk: int
    checkpoint_quantization: str | None = None  # config.json's quantization_config.quant_method

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes


def geometry_from_hf_config(config: Mapping[str, Any], weight_bytes: int) -> ModelGeometry:
    """Read a Hugging Face config.json (a multimodal model's language part under `text_config`).
    Raises ValueError naming what is missing."""
    text = config.get("text_config") or config
    layers = _int(text, "num_hidden_layers")
    heads = _int(text, "num_attention_heads")
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or _int(text, "hidden_size") // heads)
    positions = _int(text, "max_position_embeddings")
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    # Linear, dynamic and YaRN scaling stretch the window by `factor` (vLLM derives its
    # max_model_len the same way); llama3-style scaling is already in max_position_embeddings.
    if rope.get("rope_type", rope.get("type")) in {"linear", "dynamic", "yarn"}:
        positions = int(positions * float(rope.get("factor", 1.0)))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or text.get("dtype") or "float16")
    quantization = (config.get("quantization_config") or {}).get("quant_method")
    return ModelGeometry(
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        max_positions=positions,
        checkpoint_dtype=dtype,
        weight_bytes_on_disk=weight_bytes,
        checkpoint_quantization=str(quantization) if quantization else None,
    )


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json has no positive integer {key!r}")
    return value


@dataclass(frozen=True)
class EngineMemory:
    """One replica's engine as its config will start it."""

    weight_bytes: int
    kv_bytes_per_token: int
    block_size: int
    max_num_seqs: int
    # None where it cannot be known before start (a CPU engine sizing itself from free memory,
    # a GPU whose size the pool does not declare).
    kv_cache_bytes: int | None
    # Where kv_cache_bytes came from, in the user's words, for the arithmetic in messages.
    kv_source: str
    # On a GPU: the memory the engine may use (gpu_memory_utilization x GPU x tensor parallel).
    usable_bytes: int | None = None

    @property
    def kv_tokens(self) -> int | None:
        """Tokens the KV cache holds for requests: whole blocks, less the one null block vLLM's
        block pool holds back for good."""
        if self.kv_cache_bytes is None:
            return None
        blocks = max(self.kv_cache_bytes, 0) // (self.kv_bytes_per_token * self.block_size)
        return max(blocks - 1, 0) * self.block_size


def serving_dtype_bytes(model: ModelConfig, geometry: ModelGeometry) -> int:
    """Bytes per element of the weights and activations as the engine runs them."""
    dtype = str(model.engine_kwargs.get("dtype", "auto"))
    if dtype != "auto":
        return DTYPE_BYTES.get(dtype, 2)
    # vLLM's "auto": a float32 checkpoint runs in 16 bits, others as stored.
    return min(DTYPE_BYTES.get(geometry.checkpoint_dtype, 2), 2)


def kv_element_bytes(model: ModelConfig, geometry: ModelGeometry) -> int:
    kv_dtype = str(model.engine_kwargs.get("kv_cache_dtype", "auto"))
    if kv_dtype == "auto":
        return serving_dtype_bytes(model, geometry)
    return DTYPE_BYTES.get(kv_dtype, 2)


def weight_bytes(model: ModelConfig, geometry: ModelGeometry) -> int:
    """The weights in memory. Quantized checkpoints load as stored; fp8 quantized at load keeps
    one byte per parameter; a 16-bit or 32-bit checkpoint loads in the serving dtype."""
    on_disk = geometry.weight_bytes_on_disk
    if geometry.checkpoint_quantization is not None:
        return on_disk
    stored = DTYPE_BYTES.get(geometry.checkpoint_dtype, 2)
    if model.engine_kwargs.get("quantization") in ONLINE_QUANTIZATIONS:
        return on_disk // stored
    return on_disk * serving_dtype_bytes(model, geometry) // stored


def plan_engine(
    model: ModelConfig, geometry: ModelGeometry, gpu_bytes: int | None = None
) -> EngineMemory:
    """The memory one replica's engine will have; `gpu_bytes` is one GPU of the model's home
    pool (None where the pool does not say)."""
    kwargs = model.engine_kwargs
    weights = weight_bytes(model, geometry)
    per_token = geometry.kv_bytes_per_token(kv_element_bytes(model, geometry))
    gpu = model.device == "gpu"
    block = int(kwargs.get("block_size") or (GPU_BLOCK if gpu else CPU_BLOCK))
    usable = None
    if gpu and gpu_bytes is not None:
        utilization = float(kwargs.get("gpu_memory_utilization", DEFAULT_GPU_UTILIZATION))
        usable = int(utilization * gpu_bytes * int(kwargs.get("tensor_parallel_size", 1)))
    kv_bytes, source = _kv_cache_bytes(model, weights, usable)
    override = kwargs.get("num_gpu_blocks_override")
    if override is not None and kv_bytes is not None:
        blocks_bytes = int(override) * block * per_token
        if blocks_bytes < kv_bytes:
            kv_bytes, source = blocks_bytes, f"num_gpu_blocks_override {override} x {block}"
    return EngineMemory(
        weight_bytes=weights,
        kv_bytes_per_token=per_token,
        block_size=block,
        max_num_seqs=int(kwargs.get("max_num_seqs") or _default_max_num_seqs(gpu, gpu_bytes)),
        kv_cache_bytes=kv_bytes,
        kv_source=source,
        usable_bytes=usable,
    )


def _kv_cache_bytes(model: ModelConfig, weights: int, usable: int | None) -> tuple[int | None, str]:
    explicit = model.engine_kwargs.get("kv_cache_memory_bytes")
    if explicit is not None:
        return int(explicit), f"kv_cache_memory_bytes {int(explicit)}"
    if model.device == "cpu":
        space = model.env_vars.get(KV_SPACE_ENV)
        if space:
            return int(space) * GiB, f"{KV_SPACE_ENV}={space} GiB"
        return None, f"no {KV_SPACE_ENV} (the engine sizes its cache from free memory)"
    if usable is None:
        return None, "no pools[].gpu_memory_gb on the model's home pool"
    return (
        usable - weights,
        "gpu_memory_utilization x GPU memory - weights (activations not counted)",
    )


def _default_max_num_seqs(gpu: bool, gpu_bytes: int | None) -> int:
    if not gpu:
        return 128
    return 1024 if gpu_bytes is not None and gpu_bytes >= 70 * GiB else 256
