"""Measure what a model's engine really holds: `python -m cluster.capacity MODEL [--config FILE]`.

Starts the model's engine as the config starts it (vLLM, in this process's child), reads its KV
cache geometry (blocks x block size, and the engine's own bytes per token from its KV cache
spec), then measures with real requests:

- memory after load (the engine processes' resident memory on CPU; NVML's used memory on GPU);
- memory per 1k tokens of context: a second engine with a KV cache at least 1 GiB smaller (or,
  for a small cache, larger), the difference in memory divided by the difference in tokens
  (must match the engine's own figure within 5%);
- the largest context that runs without preemption or error, and the largest number of
  requests of `--request-tokens` that run at once without preemption (every one running in
  the same step), each by an edge search with real requests (policy/capacity_search.py).

Prints a table and writes a YAML fragment with a safety margin (80% by default) to paste into
the config: `context_window` (vLLM's max_model_len), `max_concurrency` and
`engine_kwargs.max_num_seqs`. Must run on a node of the model's pool (its GPU, its memory).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml
from tqdm import tqdm

from autoscale.vram import GpuReading, NvmlSource
from cluster.capacity_report import EngineFacts, Measurement, fragment, table
from cluster.model_files import read_geometry
from core.config import ClusterConfig, ConfigError, ModelConfig, load_config
from deployments.engine.cpu_features import node_has_native_bf16
from policy.capacity_search import EdgeSearch
from policy.cpu_dtype import served_model
from policy.engine_memory import ModelGeometry, plan_engine

__all__ = ["EngineFacts", "Measurement", "fragment", "main", "measure", "table"]

# Tokens each probe generates past the steps the prefills take: enough decode steps to see every
# request running together.
OUTPUT_TOKENS = 8
SEED = 1234
TOLERANCE = 0.05  # measured KV bytes per token against the engine's own figure
# The KV cache the two engines differ by, at least: far above what else moves between two starts
# (tens of MB of touched library pages: 256 MiB apart once measured 1.11 x on a fresh clone; a
# float32 CPU engine moves more, 1 GiB apart measured 1.086 x once and 0.924 x once). A GPU
# keeps 1 GiB: a cache smaller than twice this would make its second engine larger than the card.
MEASURE_BYTES = {"cpu": 2 << 30, "gpu": 1 << 30}


@dataclass(frozen=True)
class RunResult:
    passed: bool
    why: str


class Engine:
    """One vLLM engine of the model, started in a child process of this one."""

    def __init__(self, engine: Any, facts: EngineFacts) -> None:
        self._engine = engine
        self.facts = facts
        self._rng = random.Random(SEED)
        self._ids = 0

    def output_tokens(self, lengths: Sequence[int]) -> int:
        """Tokens each request generates: the engine prefills at most `max_batched_tokens` a
        step (less one per decoding request), so the first request must still be decoding
        when the last one's prefill ends, or they never run together."""
        budget = max(1, self.facts.max_batched_tokens - len(lengths))
        return OUTPUT_TOKENS + math.ceil(sum(lengths) / budget)

    async def run(self, lengths: Sequence[int]) -> RunResult:
        """Requests of these total lengths (prompt + output), all sent at once. Passes when
        every one finishes whole, none was preempted, and all ran in one step together."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        preempted = _metric("vllm:num_preemptions")
        peak = 0
        wanted = self.output_tokens(lengths)

        async def one(total: int) -> tuple[int, int]:
            nonlocal peak
            self._ids += 1
            output = min(wanted, total - 1)
            params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0)
            ids = [
                self._rng.randrange(1000, self.facts.vocab_size - 1000)
                for _ in range(total - output)
            ]
            last = None
            async for step in self._engine.generate(
                TokensPrompt(prompt_token_ids=ids), params, request_id=f"capacity-{self._ids}"
            ):
                peak = max(peak, int(_metric("vllm:num_requests_running")))
                last = step
            return output, 0 if last is None else len(last.outputs[0].token_ids)

        try:
            produced = await asyncio.gather(*(one(n) for n in lengths))
        except Exception as error:  # noqa: BLE001 - an engine error is what a probe looks for
            return RunResult(False, f"error: {type(error).__name__}: {error}"[:200])
        if any(asked != got for asked, got in produced):
            return RunResult(False, f"short answers: {[got for _, got in produced]}")
        if (extra := _metric("vllm:num_preemptions") - preempted) > 0:
            return RunResult(False, f"{extra:.0f} preemptions")
        if peak < len(lengths):
            return RunResult(False, f"at most {peak} of {len(lengths)} ran at once")
        return RunResult(True, "clean")

    def close(self) -> None:
        self._engine.shutdown()


def engine_args(
    config: ClusterConfig, model: ModelConfig, max_model_len: int, blocks: int | None = None
) -> dict[str, Any]:
    """The engine as ray.serve.llm starts it for this model (less the OpenAI frontend's tool
    options), with the window to search up to and, for the second engine, fewer blocks."""
    kwargs: dict[str, Any] = {
        **model.engine_kwargs,
        "model": config.resolve_path(model.source),
        "max_model_len": max_model_len,
        "disable_log_stats": False,  # the preemption counter and running gauge come from it
    }
    if blocks is not None:
        kwargs["num_gpu_blocks_override"] = blocks
    return kwargs


@contextmanager
def model_environment(model: ModelConfig) -> Iterator[None]:
    """The model's env_vars for the engines started inside (their processes inherit them)."""
    saved = {k: os.environ.get(k) for k in model.env_vars}
    os.environ.update(model.env_vars)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_engine(args: dict[str, Any], device: str) -> Engine:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    # The usage context ray.serve.llm starts engines with: it sets defaults like max_num_seqs.
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(**args), usage_context=UsageContext.OPENAI_API_SERVER
    )
    vllm_config = engine.vllm_config
    cache = vllm_config.cache_config
    settle = time.monotonic() + 2
    while time.monotonic() < settle:  # the engine's processes finish touching their memory
        time.sleep(0.2)
    facts = EngineFacts(
        memory_bytes=_memory_used(device),
        blocks=int(cache.num_gpu_blocks or 0),
        block_size=int(cache.block_size),
        engine_bytes_per_token=_engine_bytes_per_token(vllm_config),
        max_model_len=int(vllm_config.model_config.max_model_len),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        max_batched_tokens=int(vllm_config.scheduler_config.max_num_batched_tokens),
        vocab_size=int(vllm_config.model_config.get_vocab_size()),
        dtype=str(vllm_config.model_config.dtype).removeprefix("torch."),
    )
    return Engine(engine, facts)


def _engine_bytes_per_token(vllm_config: Any) -> int:
    """The engine's own figure: its attention layers' KV page size per token."""
    from vllm.utils.torch_utils import get_kv_cache_torch_dtype
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model_config, parallel = vllm_config.model_config, vllm_config.parallel_config
    cache = vllm_config.cache_config
    spec = FullAttentionSpec(
        block_size=cache.block_size,
        num_kv_heads=model_config.get_num_kv_heads(parallel),
        head_size=model_config.get_head_size(),
        dtype=get_kv_cache_torch_dtype(cache.cache_dtype, model_config.dtype),
    )
    layers = model_config.get_num_layers_by_block_type(parallel, "attention")
    return int(layers * spec.page_size_bytes // cache.block_size)


def _memory_used(device: str) -> int:
    if device == "gpu":
        return _first_gpu().used_bytes
    # The engine's own processes only: this one's heap moves with the probes, not the cache.
    return sum(_private_bytes(p.pid) for p in psutil.Process().children(recursive=True))


def _private_bytes(pid: int) -> int:
    """A process's anonymous memory, resident or swapped: where a CPU engine's KV cache lives.
    Not RSS: its file-backed pages (torch's libraries, hundreds of MB) come and go with the
    page cache, and on a busy node they moved a measurement 13% (0.872 x the engine's figure)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return sum(int(fields.get(key, "0 kB").split()[0]) * 1024 for key in ("RssAnon", "VmSwap"))


def _metric(name: str) -> float:
    from vllm.v1.metrics.reader import get_metrics_snapshot

    return sum(float(getattr(m, "value", 0)) for m in get_metrics_snapshot() if m.name == name)


def _wait_gone(children: list[psutil.Process]) -> None:
    """The engine's processes are gone before the next one starts (and when we end)."""
    _, alive = psutil.wait_procs(children, timeout=30)
    for process in alive:
        process.kill()
    psutil.wait_procs(alive, timeout=10)


def _engine_children(before: set[psutil.Process]) -> list[psutil.Process]:
    """Processes the engine started. Not multiprocessing's resource tracker: it serves this
    process until it exits, and killing it only makes the next engine start another."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process in before or "resource_tracker" in " ".join(process.cmdline()):
                continue
        except psutil.Error:
            continue
        found.append(process)
    return found


async def _search(
    engine: Engine, search: EdgeSearch, lengths_for: Any, label: str, bar: tqdm, runs: list[str]
) -> int | None:
    while (size := search.next()) is not None:
        bar.set_postfix_str(f"{label} {size}")
        result = await engine.run(lengths_for(size))
        search.record(size, result.passed)
        runs.append(f"{label} {size}: {result.why}")
        bar.update(1)
    return search.best


def measure(
    config: ClusterConfig,
    name: str,
    *,
    request_tokens: int | None = None,
    max_context: int | None = None,
) -> Measurement:
    # An adapter's name: its base model's engine, in the dtype this node serves it in.
    model = served_model(config.base_model(name), node_has_native_bf16())
    if not model.generates:
        raise ConfigError(f"{name}: an embedding model has no context to search")
    geometry = read_geometry(config.resolve_path(model.source))
    if not isinstance(geometry, ModelGeometry):
        raise ConfigError(f"{name}: {geometry}")
    gpu_bytes = _first_gpu().total_bytes if model.device == "gpu" else None
    plan = plan_engine(model, geometry, gpu_bytes)
    ceiling = min(geometry.max_positions, max_context or geometry.max_positions)
    if plan.kv_tokens is not None:
        ceiling = min(ceiling, plan.kv_tokens)
    with model_environment(model):
        return asyncio.run(
            _measure(config, model, plan.kv_bytes_per_token, ceiling, request_tokens)
        )


async def _measure(
    config: ClusterConfig,
    model: ModelConfig,
    config_bytes_per_token: int,
    ceiling: int,
    request_tokens: int | None,
) -> Measurement:
    """Everything on one event loop: vLLM's output handler lives on the loop that started it."""
    bar = tqdm(total=2, desc=f"capacity {model.name}", unit="step", file=sys.stderr)
    bar.set_postfix_str("starting the engine")
    before = set(psutil.Process().children(recursive=True))
    engine = start_engine(engine_args(config, model, ceiling), model.device)
    facts = engine.facts
    result = Measurement(model.name, model.device, facts, config_bytes_per_token)
    bar.update(1)
    try:
        top = min(facts.max_model_len, facts.kv_tokens)
        context = EdgeSearch(low=min(OUTPUT_TOKENS + 1, top), high=top)
        tokens = min(request_tokens or model.context_window, top)
        result.request_tokens = tokens
        # One more than the arithmetic allows, so the search sees the edge from both sides.
        most = min(facts.max_num_seqs, facts.kv_tokens // tokens + 1)
        concurrency = EdgeSearch(low=1, high=max(1, most))
        bar.total += context.max_probes + concurrency.max_probes
        result.largest_context = await _search(
            engine, context, lambda n: [n], "context", bar, result.runs
        )
        result.largest_concurrency = await _search(
            engine, concurrency, lambda k: [tokens] * k, "requests", bar, result.runs
        )
    finally:
        engine.close()
        _wait_gone(_engine_children(before))
    # The same engine with another number of blocks: the memory that moves with them is the
    # KV cache's. Fewer where that still leaves a clear difference (a GPU's cache is all it may
    # have), else more (a small CPU cache; RAM is there).
    bar.set_postfix_str("second engine, another KV cache size")
    blocks = _other_block_count(facts, model.device)
    other_len = min(ceiling, blocks * facts.block_size)
    other = start_engine(engine_args(config, model, other_len, blocks=blocks), model.device)
    other.close()
    _wait_gone(_engine_children(before))
    bar.update(bar.total - bar.n)
    bar.close()
    tokens = (facts.blocks - other.facts.blocks) * facts.block_size
    if tokens != 0:
        result.measured_bytes_per_token = (facts.memory_bytes - other.facts.memory_bytes) / tokens
    return result


def _other_block_count(facts: EngineFacts, device: str) -> int:
    """Blocks for the second engine: at least MEASURE_BYTES of KV cache apart from the first."""
    page = facts.block_size * facts.engine_bytes_per_token
    apart = max(facts.blocks // 2, -(-MEASURE_BYTES[device] // page))
    return facts.blocks - apart if facts.blocks - apart >= 1 else facts.blocks + apart


def _first_gpu() -> GpuReading:
    """The engine's GPU (device 0), read by the placement probes' own NVML reader."""
    reading = NvmlSource().read()
    if not reading.gpus:
        raise ConfigError(f"a GPU model needs a GPU to measure on: {reading.error}")
    return reading.gpus[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.capacity", description=__doc__)
    parser.add_argument(
        "model", help="the model (its name, an alias, or a role's name) whose engine to measure"
    )
    parser.add_argument("--config", help="config YAML (default: the embedded one)")
    parser.add_argument("--margin", type=float, default=0.8, help="share of what was measured")
    parser.add_argument(
        "--request-tokens",
        type=int,
        help="each request's length in the concurrency search (default: the context_window)",
    )
    parser.add_argument("--max-context", type=int, help="search contexts up to this many tokens")
    parser.add_argument("--out", type=Path, help="write the YAML fragment here (default: print)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        name = config.served_names.get(args.model)
        if name is None:
            raise ConfigError(f"{args.model!r} is not a model, alias or role of this config")
        result = measure(
            config, name, request_tokens=args.request_tokens, max_context=args.max_context
        )
    except ConfigError as error:
        print(f"gpu-pool-serve: {error}", file=sys.stderr)
        return 2
    for line in table(result, args.margin):
        print(line)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        f"# python -m cluster.capacity {args.model} ({stamp}): KV cache "
        f"{result.engine.kv_tokens} tokens, largest context {result.largest_context}, "
        f"{result.largest_concurrency} requests of {result.request_tokens} tokens at once; "
        f"{args.margin:.0%} of each. context_window is vLLM's max_model_len.\n"
        + yaml.safe_dump(fragment(result, args.margin), sort_keys=False)
    )
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    if result.kv_match is not None and abs(result.kv_match - 1) > TOLERANCE:
        print(
            f"gpu-pool-serve: measured KV bytes per token are {result.kv_match:.3f} x the "
            "engine's own figure (more than 5% apart): memory outside the KV cache moved "
            "between the two engines; run again on an idle node",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
