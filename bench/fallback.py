"""What degraded service costs: the CPU fallback against the same model on vLLM's CPU engine.

The demo model on vLLM's CPU engine behind bare `ray.serve.llm` (the anchor), and its GGUF on
the CPU fallback's llama.cpp engine behind our gateway (bench/fallback.yaml), one thread each.
Streaming requests of 64 output tokens at concurrency 1 and 4: time to first token (p50, p99),
decode speed per stream (tokens/s after the first token, p50) and total tokens/s. The fallback
has no target against the anchor: it is what users get while every GPU link of a chain is down.
Against the figures recorded when llama.cpp ran inside the replica (IN_PROCESS), the engine in a
child process should stay within 10%.

Run with `make bench` (or `python -m bench.fallback`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import stack
from cluster.backends import build_fallback
from cluster.config import FALLBACK_BACKEND

CONFIG = Path(__file__).with_name("fallback.yaml")
PORT = 18400
CONCURRENCY_REQUESTS = {1: 8, 4: 16}
OUTPUT_TOKENS = 64
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


@dataclass(frozen=True)
class Stream:
    ttft_s: float
    total_s: float
    completion_tokens: int

    @property
    def decode_tokens_per_s(self) -> float:
        decode = self.total_s - self.ttft_s
        return (self.completion_tokens - 1) / decode if decode > 0 else float("nan")


@dataclass(frozen=True)
class Run:
    path: str
    concurrency: int
    streams: tuple[Stream, ...]
    errors: int
    elapsed_s: float

    def ttft_ms(self, q: float) -> float:
        ordered = sorted(s.ttft_s for s in self.streams)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0

    @property
    def decode_p50(self) -> float:
        return statistics.median(s.decode_tokens_per_s for s in self.streams)

    @property
    def total_tokens_per_s(self) -> float:
        return sum(s.completion_tokens for s in self.streams) / self.elapsed_s


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Stream:
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                raise RuntimeError(event["error"])
            if first is None and any(
                (c.get("delta") or {}).get("content") for c in event.get("choices", [])
            ):
                first = time.perf_counter()
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    finished = time.perf_counter()
    return Stream((first or finished) - started, finished - started, tokens)


async def run(path: str, url: str, model: str, concurrency: int, requests: int) -> Run:
    body = {
        "model": model,
        "messages": PROMPT,
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0.7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    remaining = iter(range(requests))
    streams: list[Stream] = []
    errors = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for _ in remaining:
            try:
                streams.append(await one_stream(client, url, body))
            except (httpx.HTTPError, RuntimeError):
                errors += 1

    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return Run(path, concurrency, tuple(streams), errors, elapsed)


async def measure(anchor_url: str, gateway_url: str) -> list[Run]:
    paths = (
        ("vLLM CPU (ray.serve.llm)", anchor_url, "orchestrator"),
        ("CPU fallback (llama.cpp)", gateway_url, "coding"),
    )
    for _, url, model in paths:  # warm both engines
        await run("warm-up", url, model, 1, 2)
    runs = []
    for concurrency, requests in CONCURRENCY_REQUESTS.items():
        for path, url, model in paths:
            runs.append(await run(path, url, model, concurrency, requests))
    return runs


# The same table with llama.cpp in-process in the fallback replica (README, 2026-11-23, before
# the engine moved to a child process), as (TTFT p50 ms, total tok/s) per concurrency. Machines
# differ between runs, so the comparison is of each run's fallback-to-anchor ratios.
IN_PROCESS = {1: (34.0, 102.0), 4: (1665.0, 113.0)}
IN_PROCESS_ANCHOR = {1: (71.0, 56.7), 4: (184.0, 157.3)}


def report(runs: list[Run]) -> None:
    print(
        "| engine | concurrency | TTFT p50 ms | TTFT p99 ms | decode tok/s per stream (p50) "
        "| total tok/s | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(
            f"| {r.path} | {r.concurrency} | {r.ttft_ms(0.5):.0f} | {r.ttft_ms(0.99):.0f} | "
            f"{r.decode_p50:.1f} | {r.total_tokens_per_s:.1f} | {r.errors} |"
        )
    print()
    by_key = {(r.path.split()[0], r.concurrency): r for r in runs}
    for concurrency in CONCURRENCY_REQUESTS:
        vllm, fallback = by_key[("vLLM", concurrency)], by_key[("CPU", concurrency)]
        ttft = fallback.ttft_ms(0.5) / vllm.ttft_ms(0.5)
        speed = fallback.total_tokens_per_s / vllm.total_tokens_per_s
        ratios = f"TTFT p50 {ttft:.2f}x, total tok/s {speed:.2f}x"
        print(f"concurrency {concurrency}: fallback / anchor: {ratios}")
        (old_ttft, old_speed), (anchor_ttft, anchor_speed) = (
            IN_PROCESS[concurrency],
            IN_PROCESS_ANCHOR[concurrency],
        )
        print(
            f"  out of process / in process (each against its anchor): TTFT p50 "
            f"{ttft / (old_ttft / anchor_ttft):.2f}x, "
            f"total tok/s {speed / (old_speed / anchor_speed):.2f}x"
        )


def main() -> int:
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    config = stack.start(CONFIG, PORT)
    try:
        anchor = stack.deploy_anchor(config, names=("orchestrator@local",))
        backends: dict[str, Any] = {**anchor, FALLBACK_BACKEND: build_fallback(config)}
        stack.deploy_gateway(config, backends)
        base = f"http://127.0.0.1:{PORT}"
        runs = asyncio.run(
            measure(f"{base}/{stack.ANCHOR_APP}/v1/chat/completions", f"{base}/v1/chat/completions")
        )
    finally:
        stack.stop()
    report(runs)
    return 1 if any(r.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
