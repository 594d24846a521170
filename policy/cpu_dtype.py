"""The dtype a CPU engine serves in, by what the node's CPU computes natively (pure).

vLLM runs bfloat16 and float16 on any x86 CPU, but only one with AVX512-BF16 or AMX-BF16 does
bf16 math in hardware; elsewhere (AVX2-only CPUs, AVX-512 without BF16) each product is
converted from and to float32 in software. float16 is judged by the same flags (a CPU with
AVX512-BF16 but no AVX512-FP16 keeps it, converted: not measured). Measured on an AVX2-only
node with the demo model (bench/cpu_dtype.py): bfloat16 prefilled 4x slower than float32 and
decoded 1.7x faster, so float32 answers sooner wherever a prompt is longer than about three
times its answer, which is what chat and agent traffic sends. `models[].cpu_dtype: auto` takes
float32 there; the weights and each KV token then take twice the bytes, which the config guard
reckons with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from core.config import ModelConfig
from core.config.base import FrozenDict

__all__ = [
    "CPU_DTYPE_ENV",
    "FLOAT32",
    "NATIVE_BF16_FLAGS",
    "configured_dtype",
    "cpu_serving_dtype",
    "has_native_bf16",
    "served_model",
]

# What the replica is told of models[].cpu_dtype (its runtime environment): it decides on the
# node, where the CPU is known.
CPU_DTYPE_ENV = "GPS_CPU_DTYPE"
FLOAT32 = "float32"
# /proc/cpuinfo's names for the instructions that do bf16 math (Linux, x86).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})
# "auto" is 16 bits on a CPU too: vLLM downcasts a float32 checkpoint to its platform's first
# dtype (bfloat16), float16 for a pooling model.
SIXTEEN_BIT = frozenset({"auto", "bfloat16", "float16", "half"})


def has_native_bf16(machine: str, cpu_flags: Iterable[str]) -> bool:
    """Whether this CPU does 16-bit math in hardware. Only x86 is known to lack it: vLLM's ARM,
    POWER and RISC-V builds have kernels of their own, so those are taken as they are."""
    if machine.lower() not in X86_MACHINES:
        return True
    return not NATIVE_BF16_FLAGS.isdisjoint(cpu_flags)


def configured_dtype(engine_kwargs: Mapping[str, Any]) -> str:
    return str(engine_kwargs.get("dtype", "auto"))


def cpu_serving_dtype(configured: str, choice: str, native_bf16: bool) -> str:
    """The dtype to start a CPU engine with: float32 for a 16-bit dtype the CPU would emulate,
    when `choice` (models[].cpu_dtype) is auto; `configured` otherwise."""
    if choice == "auto" and not native_bf16 and configured in SIXTEEN_BIT:
        return FLOAT32
    return configured


def served_model(model: ModelConfig, native_bf16: bool) -> ModelConfig:
    """The model as a node serves it: a CPU engine's dtype chosen for that node's CPU."""
    if model.device != "cpu":
        return model
    configured = configured_dtype(model.engine_kwargs)
    dtype = cpu_serving_dtype(configured, model.cpu_dtype, native_bf16)
    if dtype == configured:
        return model
    kwargs = FrozenDict({**model.engine_kwargs, "dtype": dtype})
    return model.model_copy(update={"engine_kwargs": kwargs})
