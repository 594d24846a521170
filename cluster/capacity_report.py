"""What `python -m cluster.capacity` found, and what it prints: the engine's facts, the
measurement, the table and the config fragment with its safety margin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policy.capacity_search import with_margin

__all__ = ["EngineFacts", "Measurement", "fragment", "table"]


@dataclass(frozen=True)
class EngineFacts:
    memory_bytes: int  # after load, KV cache allocated
    blocks: int
    block_size: int
    engine_bytes_per_token: int  # from the engine's KV cache spec
    max_model_len: int
    max_num_seqs: int
    max_batched_tokens: int  # tokens one engine step takes (prefill chunks and decodes)
    vocab_size: int
    dtype: str = ""  # what the engine computes in (a CPU engine's: by its node, cpu_dtype)

    @property
    def kv_tokens(self) -> int:
        """What requests can use: vLLM's block pool holds one null block back for good."""
        return max(self.blocks - 1, 0) * self.block_size


@dataclass
class Measurement:
    model: str
    device: str
    engine: EngineFacts
    config_bytes_per_token: int  # from config.json (policy/engine_memory.py)
    measured_bytes_per_token: float | None = None
    largest_context: int | None = None
    request_tokens: int = 0
    largest_concurrency: int | None = None
    runs: list[str] = field(default_factory=list)

    @property
    def kv_match(self) -> float | None:
        """Measured over the engine's own bytes per token."""
        if self.measured_bytes_per_token is None:
            return None
        return self.measured_bytes_per_token / self.engine.engine_bytes_per_token


def fragment(result: Measurement, margin: float) -> dict[str, Any]:
    """The config lines to paste, with the safety margin taken off what was measured."""
    entry: dict[str, Any] = {"name": result.model}
    if result.largest_context is not None:
        entry["context_window"] = with_margin(result.largest_context, margin, floor=256)
    if result.largest_concurrency is not None:
        concurrency = with_margin(result.largest_concurrency, margin)
        entry["max_concurrency"] = concurrency
        entry["engine_kwargs"] = {"max_num_seqs": concurrency}
    return {"models": [entry]}


def table(result: Measurement, margin: float) -> list[str]:
    facts = result.engine

    def mib(n: float) -> str:
        return f"{n / (1 << 20):,.1f} MiB"

    measured = result.measured_bytes_per_token
    rows = [
        ("device", result.device),
        ("dtype", facts.dtype),
        ("memory after load", mib(facts.memory_bytes)),
        (
            "KV cache",
            f"{facts.blocks} blocks x {facts.block_size}, one held back: {facts.kv_tokens} tokens",
        ),
        ("KV bytes/token, engine's own", str(facts.engine_bytes_per_token)),
        ("KV bytes/token, from config.json", str(result.config_bytes_per_token)),
        (
            "KV bytes/token, measured",
            "-" if measured is None else f"{measured:,.0f} ({result.kv_match:.3f} x engine)",
        ),
        ("memory per 1k tokens, measured", "-" if measured is None else mib(measured * 1000)),
        ("largest context, no preemption", str(result.largest_context)),
        (
            f"largest concurrency at {result.request_tokens} tokens",
            str(result.largest_concurrency),
        ),
        ("engine max_num_seqs", str(facts.max_num_seqs)),
        (f"recommended ({margin:.0%} margin)", str(fragment(result, margin)["models"][0])),
    ]
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {value}" for name, value in rows]
