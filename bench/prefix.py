"""Prefix-aware replica choice against Serve's default, on a backend of two replicas.

Eight conversations of twenty turns, all opening with the same system prompt of about 2,000
tokens, run at once through the gateway; each conversation sends its next turn when the last
one is answered (streamed), with its history. A turn is about 140 tokens of the user's own text
and a 96-token answer, so a conversation ends near 7,000 tokens: more than one replica's KV
cache (1 GiB, about 46,000 tokens of the demo model) holds for all eight, and about what it
holds for half of them. Two runs, each on fresh replicas of the same config (bench/prefix.yaml),
so both start with cold caches:

- the anchor: `router.prefix_routing: false`, Serve's power-of-two choice;
- `router.prefix_routing: true`: the session's replica (`X-Session-Id`, one per conversation),
  else the prefix router's (deployments/router/adapters/replica_choice.py).

Measured: time to first token (p50, p99) over every turn, and the prefix-cache hit rate (hit
over queried prompt tokens, the engines' own counts, read from both replicas). Target: TTFT p50
with prefix-aware routing at most 0.7 x the anchor's.

Run with `make bench` (or `python -m bench.prefix [--turns N] [--answer-tokens N]
[--user-words N]`; `--answer-tokens 24 --user-words 0` gives one-line turns).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import stack
from deployments.engine.llm_server import ObservedLLMServer
from policy.engine_counters import EngineCounters

CONFIG = Path(__file__).with_name("prefix.yaml")
PORT = 18950
CONVERSATIONS = 8
TURNS = 20
# A turn the size of an agent's (a pasted snippet or log, a real answer), so by the last turn the
# conversation's own history (~5k tokens) outweighs the shared prompt, as in a coding session;
# the last turn (~7k tokens) still fits the 8k window, so nothing is compressed.
ANSWER_TOKENS = 96
USER_WORDS = 22  # about 140 tokens (the numbers take a token a digit)
TTFT_TARGET = 0.7
COUNTER_READS = 40  # handle calls land on either replica: enough to read both
# About 2,000 tokens of the demo model's tokenizer, the same for every conversation.
SYSTEM = "You are a careful assistant for the ACME support desk. " + " ".join(
    f"Rule {n}: answer politely, cite the ticket number, and never promise a refund "
    f"before checking the order history of customer group {n % 7}."
    for n in range(70)
)


WORDS = (
    "order", "parcel", "refund", "invoice", "courier", "address", "delay", "warehouse",
    "customer", "payment", "label", "tracking", "return", "damaged", "missing", "weekend",
)  # fmt: skip


@dataclass(frozen=True)
class Shape:
    turns: int = TURNS
    answer_tokens: int = ANSWER_TOKENS
    user_words: int = USER_WORDS


def user_turn(number: int, turn: int, words: int) -> str:
    """The turn's text, the same in every run, shared with no other conversation."""
    rng = random.Random(number * 1000 + turn)
    details = " ".join(f"{rng.choice(WORDS)}-{rng.randrange(10_000)}" for _ in range(words))
    return f"Ticket {number}-{turn}: my order is late. The log says: {details}"


@dataclass
class Run:
    name: str
    ttft_s: list[float] = field(default_factory=list)
    failed: int = 0
    counters: EngineCounters = field(default_factory=EngineCounters)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def conversation(
    client: httpx.AsyncClient, url: str, number: int, shape: Shape, session: bool, run: Run
) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    headers = {"X-Session-Id": f"conversation-{number}"} if session else {}
    for turn in range(shape.turns):
        messages.append({"role": "user", "content": user_turn(number, turn, shape.user_words)})
        body = {"model": "orchestrator", "messages": messages, "max_tokens": shape.answer_tokens,
                "ignore_eos": True, "stream": True}  # fmt: skip
        started = time.perf_counter()
        first: float | None = None
        text: list[str] = []
        try:
            async with client.stream("POST", url, json=body, headers=headers) as reply:
                if reply.status_code != 200:
                    run.failed += 1
                    return
                async for line in reply.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    delta = (choices[0].get("delta") or {}).get("content")
                    if delta:
                        first = first or time.perf_counter()
                        text.append(delta)
        except httpx.HTTPError:
            run.failed += 1
            return
        if first is None:
            run.failed += 1
            return
        run.ttft_s.append(first - started)
        messages.append({"role": "assistant", "content": "".join(text)})


def read_counters(target: stack.Stage) -> EngineCounters:
    """Both replicas' counts since their start: each read lands on either replica."""
    handle = target.anchor["orchestrator@local"]
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(COUNTER_READS):
        reading = handle.engine_counters.remote().result()
        if reading is not None:
            seen[reading["replica"]] = reading
    if len(seen) != 2:
        raise RuntimeError(f"read {len(seen)} of the 2 replicas' counters")
    return sum(
        (EngineCounters(r["preemptions"], r["prefix_queries"], r["prefix_hits"])
         for r in seen.values()),
        EngineCounters(),
    )  # fmt: skip


async def converse(target: stack.Stage, run: Run, shape: Shape, session: bool) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(
            *(conversation(client, target.gateway_url, n, shape, session, run)
              for n in range(CONVERSATIONS))
        )  # fmt: skip


def measure(name: str, prefix_routing: bool, shape: Shape) -> Run:
    target = stack.stage(
        CONFIG, PORT, {"router": {"prefix_routing": prefix_routing}}, ObservedLLMServer
    )
    run = Run(name)
    try:
        asyncio.run(converse(target, run, shape, session=prefix_routing))
        run.counters = read_counters(target)
    finally:
        stack.stop()
    return run


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.prefix")
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--answer-tokens", type=int, default=ANSWER_TOKENS)
    parser.add_argument("--user-words", type=int, default=USER_WORDS)
    args = parser.parse_args()
    shape = Shape(args.turns, args.answer_tokens, args.user_words)
    runs = [
        measure("Serve's power-of-two (anchor)", False, shape),
        measure("prefix-aware, X-Session-Id", True, shape),
    ]
    print(f"\n{CONVERSATIONS} conversations, a shared system prompt; {shape}")
    print("| routing | turns answered | failed | TTFT p50 ms | TTFT p99 ms | prefix hit rate |")
    print("|---|---:|---:|---:|---:|---:|")
    for run in runs:
        rate = run.counters.prefix_hit_rate
        print(
            f"| {run.name} | {len(run.ttft_s)} | {run.failed} | {run.percentile(0.5) * 1000:.0f} "
            f"| {run.percentile(0.99) * 1000:.0f} | {'-' if rate is None else f'{rate:.2f}'} |"
        )
    anchor, ours = runs
    if not anchor.ttft_s or not ours.ttft_s:
        print("\na run answered nothing: NOT met")
        sys.exit(1)
    ratio = ours.percentile(0.5) / anchor.percentile(0.5)  # the table's p50s
    met = ratio <= TTFT_TARGET and not ours.failed
    print(
        f"\nTTFT p50 prefix-aware / anchor: {ratio:.2f} (target <= {TTFT_TARGET}), "
        f"failed {ours.failed}: {'met' if met else 'NOT met'}"
    )
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
