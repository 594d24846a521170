"""Prefix-aware replica choice against Serve's default, on a backend of two replicas.

Eight conversations of twenty turns, all opening with the same system prompt of about 2,000
tokens, run at once through the gateway; each conversation sends its next turn when the last
one is answered (streamed), with its history. Two runs, each on fresh replicas of the same
config (bench/prefix.yaml), so both start with cold caches:

- the anchor: `router.prefix_routing: false`, Serve's power-of-two choice;
- `router.prefix_routing: true`: the session's replica (`X-Session-Id`, one per conversation),
  else the prefix router's (deployments/replica_router.py).

Measured: time to first token (p50, p99) over every turn, and the prefix-cache hit rate (hit
over queried prompt tokens, the engines' own counts, read from both replicas). Target: TTFT p50
with prefix-aware routing at most 0.7 x the anchor's.

Run with `make bench` (or `python -m bench.prefix [--turns N]`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import stack
from policy.engine_counters import EngineCounters

CONFIG = Path(__file__).with_name("prefix.yaml")
PORT = 18950
CONVERSATIONS = 8
TURNS = 20
ANSWER_TOKENS = 24
TTFT_TARGET = 0.7
COUNTER_READS = 40  # handle calls land on either replica: enough to read both
# About 2,000 tokens of the demo model's tokenizer, the same for every conversation.
SYSTEM = "You are a careful assistant for the ACME support desk. " + " ".join(
    f"Rule {n}: answer politely, cite the ticket number, and never promise a refund "
    f"before checking the order history of customer group {n % 7}."
    for n in range(70)
)


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
    client: httpx.AsyncClient, url: str, number: int, turns: int, session: bool, run: Run
) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    headers = {"X-Session-Id": f"conversation-{number}"} if session else {}
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Ticket {number}-{turn}: my order {turn} is late."}
        )
        body = {"model": "orchestrator", "messages": messages, "max_tokens": ANSWER_TOKENS,
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


async def converse(target: stack.Stage, run: Run, turns: int, session: bool) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(
            *(conversation(client, target.gateway_url, n, turns, session, run)
              for n in range(CONVERSATIONS))
        )  # fmt: skip


def measure(name: str, prefix_routing: bool, turns: int) -> Run:
    target = stack.stage(CONFIG, PORT, {"router": {"prefix_routing": prefix_routing}})
    run = Run(name)
    try:
        asyncio.run(converse(target, run, turns, session=prefix_routing))
        run.counters = read_counters(target)
    finally:
        stack.stop()
    return run


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.prefix")
    parser.add_argument("--turns", type=int, default=TURNS)
    args = parser.parse_args()
    runs = [
        measure("Serve's power-of-two (anchor)", False, args.turns),
        measure("prefix-aware, X-Session-Id", True, args.turns),
    ]
    print(f"\n{CONVERSATIONS} conversations x {args.turns} turns, a shared system prompt")
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
    ratio = statistics.median(ours.ttft_s) / statistics.median(anchor.ttft_s)
    met = ratio <= TTFT_TARGET and not ours.failed
    print(
        f"\nTTFT p50 prefix-aware / anchor: {ratio:.2f} (target <= {TTFT_TARGET}), "
        f"failed {ours.failed}: {'met' if met else 'NOT met'}"
    )
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
