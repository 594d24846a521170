"""What degraded service costs: the CPU fallback against the same model on vLLM's CPU engine.

The demo model on vLLM's CPU engine behind bare `ray.serve.llm` (the anchor), and its GGUF on
the CPU fallback's llama.cpp engine behind our gateway (bench/fallback.yaml), one thread each.
Streaming requests of 64 output tokens at concurrency 1 and 4: time to first token (p50, p99),
decode speed per stream (tokens/s after the first token, p50) and total tokens/s. The fallback
has no target against the anchor: it is what users get while every GPU link of a chain is down.

First, what moving llama.cpp out of the replica costs: the same library and GGUF in this process
(the anchor) against the fallback's engine in its child process (`LlamaCppEngine`), one thread,
no Serve, same prompt and 64 tokens: TTFT and decode tokens/s. Target: decode within 10%.

Then the engines themselves, no Serve: today's Python server (`LlamaCppEngine`, one sequence at
a time) against llama.cpp's own `llama-server` (`LlamaServerEngine`, continuous batching over
8 slots; its RAM prompt cache off and on), 8 streams of 64 tokens at once, then one alone, two
threads each. Targets: TTFT p99 <= 0.7x today's, total tokens/s >= 1.2x, one stream's decode
within 10% of today's.

Run with `make bench` (or `python -m bench.fallback`; `--engines` for the last part alone).
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
from core.types import FALLBACK_BACKEND
from deployments.fallback.engine import ChatParams, Piece
from deployments.fallback.llama_cpp_python_engine import LlamaCppEngine
from deployments.fallback.llama_server_engine import LlamaServerEngine
from deployments.fallback.replica import llama_server_binary

CONFIG = Path(__file__).with_name("fallback.yaml")
PORT = 18400
CONCURRENCY_REQUESTS = {1: 8, 4: 16}
OUTPUT_TOKENS = 64
GGUF = str(Path(__file__).resolve().parents[1] / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
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


HOP_RUNS = 6


def in_process() -> list[tuple[float, float]]:
    """(TTFT s, decode tok/s) per run, llama.cpp in this process."""
    from llama_cpp import Llama

    llama = Llama(model_path=GGUF, n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False)
    runs = []
    for _ in range(HOP_RUNS + 1):  # the first warms up
        started, first, tokens = time.perf_counter(), 0.0, 0
        for chunk in llama.create_chat_completion(
            messages=PROMPT, max_tokens=OUTPUT_TOKENS, stream=True, temperature=0.7
        ):
            if chunk["choices"][0]["delta"].get("content"):
                tokens += 1
                first = first or time.perf_counter()
        runs.append((first - started, tokens / (time.perf_counter() - first)))
    del llama
    return runs[1:]


async def in_child() -> list[tuple[float, float]]:
    """The same through the fallback's engine, whose llama.cpp runs in a child process."""
    engine = LlamaCppEngine(model_path=GGUF, context_window=2048, threads=1)
    await engine.start()
    runs = []
    try:
        for _ in range(HOP_RUNS + 1):
            params = ChatParams(messages=PROMPT, max_tokens=OUTPUT_TOKENS, temperature=0.7)
            started, first, tokens = time.perf_counter(), 0.0, 0
            async for piece in engine.chat(params):
                if isinstance(piece, Piece):
                    tokens += 1
                    first = first or time.perf_counter()
            runs.append((first - started, tokens / (time.perf_counter() - first)))
    finally:
        engine.close()
    return runs[1:]


def report_hop(inside: list[tuple[float, float]], child: list[tuple[float, float]]) -> bool:
    def p50(runs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(run[i] for run in runs)

    print("| llama.cpp | TTFT p50 ms | decode tok/s p50 |\n|---|---:|---:|")
    for name, runs in (("in the process (anchor)", inside), ("child process", child)):
        print(f"| {name} | {1000 * p50(runs, 0):.1f} | {p50(runs, 1):.1f} |")
    speed = p50(child, 1) / p50(inside, 1)
    print(
        f"child / in process: TTFT +{1000 * (p50(child, 0) - p50(inside, 0)):.1f} ms "
        f"({p50(child, 0) / p50(inside, 0):.2f}x), decode {speed:.2f}x; "
        f"target (decode within 10%): {'met' if speed >= 0.9 else 'NOT met'}\n"
    )
    return speed >= 0.9


ENGINE_STREAMS = 8
ENGINE_THREADS = 2
ENGINE_ROUNDS = 2


@dataclass(frozen=True)
class EngineRun:
    name: str
    ttft_s: tuple[float, ...]  # each stream's wait for its first piece
    decode: tuple[float, ...]  # each stream's tokens/s after its first piece
    tokens: int
    elapsed_s: float

    @property
    def total(self) -> float:
        return self.tokens / self.elapsed_s

    def ttft_ms(self, q: float) -> float:
        ordered = sorted(self.ttft_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def engine_burst(engine: Any, name: str, streams: int) -> EngineRun:
    """`streams` chats of OUTPUT_TOKENS sent at once, `ENGINE_ROUNDS` times."""
    ttft: list[float] = []
    decode: list[float] = []
    tokens, elapsed = 0, 0.0

    async def one() -> None:
        nonlocal tokens
        params = ChatParams(messages=PROMPT, max_tokens=OUTPUT_TOKENS, temperature=0.7)
        started, first, count = time.perf_counter(), 0.0, 0
        async for piece in engine.chat(params):
            if isinstance(piece, Piece):
                count += 1
                first = first or time.perf_counter()
        ttft.append(first - started)
        decode.append((count - 1) / max(1e-9, time.perf_counter() - first))
        tokens += count

    await one()  # warm
    ttft.clear()
    decode.clear()
    tokens = 0
    for _ in range(ENGINE_ROUNDS):
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(streams)))
        elapsed += time.perf_counter() - started
    return EngineRun(name, tuple(ttft), tuple(decode), tokens, elapsed)


async def engines() -> list[tuple[int, list[EngineRun]]]:
    server = llama_server_binary()
    if server is None:
        raise SystemExit("no llama-server beside this Python: run `make install`")
    candidates: list[tuple[str, Any]] = [
        ("today's server (llama_cpp)", LlamaCppEngine(
            model_path=GGUF, context_window=2048, threads=ENGINE_THREADS)),
        ("llama-server, prompt cache off", LlamaServerEngine(
            binary=server, model_path=GGUF, context_window=2048, threads=ENGINE_THREADS,
            parallel=ENGINE_STREAMS)),
        ("llama-server, prompt cache 256 MiB", LlamaServerEngine(
            binary=server, model_path=GGUF, context_window=2048, threads=ENGINE_THREADS,
            parallel=ENGINE_STREAMS, prompt_cache_mib=256)),
    ]  # fmt: skip
    results: dict[int, list[EngineRun]] = {ENGINE_STREAMS: [], 1: []}
    for name, engine in candidates:  # one at a time: they share the two cores
        await engine.start()
        try:
            for streams in results:
                results[streams].append(await engine_burst(engine, name, streams))
        finally:
            await engine.aclose()
    return list(results.items())


def report_engines(results: list[tuple[int, list[EngineRun]]]) -> bool:
    met = True
    for streams, runs in results:
        print(f"\n{streams} stream(s) of {OUTPUT_TOKENS} tokens at once, {ENGINE_ROUNDS} rounds:")
        print(
            "| engine | TTFT p50 ms | TTFT p99 ms | decode tok/s per stream (p50) | total tok/s |"
        )
        print("|---|---:|---:|---:|---:|")
        for r in runs:
            print(
                f"| {r.name} | {r.ttft_ms(0.5):.0f} | {r.ttft_ms(0.99):.0f} "
                f"| {statistics.median(r.decode):.1f} | {r.total:.1f} |"
            )
        today, server = runs[0], runs[1]
        if streams == 1:
            ratio = statistics.median(server.decode) / statistics.median(today.decode)
            print(f"one stream, llama-server / today: decode {ratio:.2f}x (target >= 0.9)")
            met &= ratio >= 0.9
        else:
            ttft = server.ttft_ms(0.99) / today.ttft_ms(0.99)
            total = server.total / today.total
            print(
                f"{streams} at once, llama-server / today: TTFT p99 {ttft:.2f}x (target <= 0.7), "
                f"total tokens/s {total:.2f}x (target >= 1.2)"
            )
            met &= ttft <= 0.7 and total >= 1.2
    print(f"engine targets: {'met' if met else 'NOT met'}\n")
    return met


def main() -> int:
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    engines_met = report_engines(asyncio.run(engines()))
    if sys.argv[1:] == ["--engines"]:
        return 0 if engines_met else 1
    hop_met = report_hop(in_process(), asyncio.run(in_child()))
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
    return 1 if any(r.errors for r in runs) or not (hop_met and engines_met) else 0


if __name__ == "__main__":
    sys.exit(main())
