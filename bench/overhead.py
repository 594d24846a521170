"""Gateway overhead against the anchor: bare `ray.serve.llm` on the same replicas.

Two replicas of the demo model run once, under the anchor app: (a) `build_openai_app` at /anchor
reaches them through OpenAiIngress; (b) our gateway at / with the router as its own deployment
(Ingress -> Router, `gateway.router_in_ingress: false` in overhead.yaml) reaches the very same
replicas by deployment handle, with a key whose limits are all set (every request admitted and
settled through the key ledger actor); (c) the same gateway at /inside with the router in each
ingress replica (`gateway.router_in_ingress`, the default); (d) that one at /open with no keys
(auth and limits off). So the engines, their caches and their placement are shared, and only the
path in front differs. Rounds rotate the paths at concurrency 1, 8 and 32, so drift on the
machine hits all alike. Targets: throughput >= 90% of the anchor's and p50 at most 10% above it.
Beside them, the CPU time the replicas in front of the engines spend per request (the anchor's
OpenAiIngress; our ingress, router and key ledger): on this 2-core machine the engines compete
for the same cores, so that is where throughput goes.
Run with `make bench` (or `python -m bench.overhead --rounds 3`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench import stack
from bench.load import LoadResult, run_load

CONFIG = Path(__file__).with_name("overhead.yaml")
API_KEY = "bench-key"
PORT = 18100
INSIDE_APP = "inside"  # the same gateway with the router in the ingress (router_in_ingress)
OPEN_APP = "open"  # that one with no keys: auth and limits off
CONCURRENCY_REQUESTS = {1: 40, 8: 160, 32: 320}
# Same prompt, exactly 8 output tokens on both sides (ignore_eos), as the anchor was first
# measured (docs/design.md).
BODY = {
    "model": "orchestrator",
    "messages": [{"role": "user", "content": "Count from one to ten."}],
    "max_tokens": 8,
    "ignore_eos": True,
}
THROUGHPUT_TARGET = 0.90
P50_TARGET = 1.10


@dataclass
class Side:
    name: str
    url: str
    headers: dict[str, str]
    results: list[LoadResult]
    # Process titles of the Serve replicas in front of the engines on this path.
    front: tuple[str, ...] = ()
    front_cpu_s: dict[int, float] = field(default_factory=dict)

    def merged(self, concurrency: int) -> LoadResult:
        runs = [r for r in self.results if r.concurrency == concurrency]
        return LoadResult(
            concurrency,
            tuple(lat for r in runs for lat in r.latencies_s),
            sum(r.errors for r in runs),
            sum(r.elapsed_s for r in runs),
        )


def deploy() -> list[Side]:
    """The anchor, the gateway with keys and limits on (the ledger in the path), and the same
    gateway with no keys (auth and limits off), all over the same replicas."""
    target = stack.stage(CONFIG, PORT)
    anchor = Side(
        "ray.serve.llm",
        target.anchor_url,
        {},
        [],
        front=(f"ServeReplica:{stack.ANCHOR_APP}:OpenAiIngress",),
    )
    limited = Side(
        "gateway, router deployment, limits on",
        target.gateway_url,
        _auth(),
        [],
        front=(
            f"ServeReplica:{stack.GATEWAY_APP}:ingress",
            f"ServeReplica:{stack.GATEWAY_APP}:router",
            "KeyLedger",
        ),
    )
    inside = target.config.gateway.model_copy(update={"router_in_ingress": True})
    in_ingress = target.config.model_copy(update={"gateway": inside})
    stack.deploy_gateway(in_ingress, target.anchor, name=INSIDE_APP)
    limited_inside = Side(
        "gateway, router in ingress, limits on",
        f"{target.base_url}/{INSIDE_APP}/v1/chat/completions",
        _auth(),
        [],
        front=(f"ServeReplica:{INSIDE_APP}:ingress", "KeyLedger"),
    )
    open_config = in_ingress.model_copy(update={"api_keys": ()})
    stack.deploy_gateway(open_config, target.anchor, name=OPEN_APP)
    keyless = Side(
        "gateway, router in ingress, no keys",
        f"{target.base_url}/{OPEN_APP}/v1/chat/completions",
        {},
        [],
        front=(f"ServeReplica:{OPEN_APP}:ingress",),
    )
    return [anchor, limited, limited_inside, keyless]


def cpu_seconds(titles: tuple[str, ...]) -> float:
    """CPU time used so far by the processes whose title contains one of `titles`."""
    return sum(cpu_by_title(titles).values())


def cpu_by_title(titles: tuple[str, ...]) -> dict[str, float]:
    """CPU time used so far by the processes whose title contains each of `titles` (a process
    under the first of them it matches), every title present."""
    used = dict.fromkeys(titles, 0.0)
    for process in psutil.process_iter(["cmdline"]):
        title = " ".join(process.info["cmdline"] or ())
        matched = next((t for t in titles if t in title), None)
        if matched is None:
            continue
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        used[matched] += times.user + times.system
    return used


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


async def measure(sides: list[Side], rounds: int) -> None:
    for side in sides:  # warm every path: handles, routers, engine caches
        await run_load(side.url, BODY, concurrency=4, requests=20, headers=side.headers)
    for concurrency, requests in CONCURRENCY_REQUESTS.items():
        for round_index in range(rounds):
            shift = round_index % len(sides)  # each path goes first in turn: drift hits all
            for side in sides[shift:] + sides[:shift]:
                cpu_before = cpu_seconds(side.front)
                result = await run_load(
                    side.url, BODY, concurrency=concurrency, requests=requests, headers=side.headers
                )
                used = cpu_seconds(side.front) - cpu_before
                side.front_cpu_s[concurrency] = side.front_cpu_s.get(concurrency, 0.0) + used
                side.results.append(result)


def cpu_ms(side: Side, concurrency: int) -> float:
    """CPU time of the path's front replicas (ingress; router) per request."""
    requests = sum(
        len(r.latencies_s) + r.errors for r in side.results if r.concurrency == concurrency
    )
    return 1000 * side.front_cpu_s.get(concurrency, 0.0) / max(requests, 1)


def report(sides: list[Side]) -> bool:
    """One row per path and level, ratios against the anchor at that level; the targets hold
    for every gateway path."""
    anchor, *gateways = sides
    print(
        "| path | concurrency | req/s | throughput ratio | p50 ms | p50 ratio | p99 ms | errors "
        "| front CPU ms/req |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    met = True
    for concurrency in CONCURRENCY_REQUESTS:
        a = anchor.merged(concurrency)
        for side in sides:
            g = side.merged(concurrency)
            throughput_ratio = g.throughput / a.throughput
            p50_ratio = g.p50_ms / a.p50_ms
            if side in gateways:
                met &= throughput_ratio >= THROUGHPUT_TARGET and p50_ratio <= P50_TARGET
            print(
                f"| {side.name} | {concurrency} | {g.throughput:.1f} | {throughput_ratio:.2f} "
                f"| {g.p50_ms:.1f} | {p50_ratio:.2f} | {g.p99_ms:.1f} | {g.errors} "
                f"| {cpu_ms(side, concurrency):.1f} |"
            )
    verdict = "met" if met else "NOT met"
    print(
        f"\ntargets (throughput ratio >= {THROUGHPUT_TARGET}, p50 ratio <= {P50_TARGET}): {verdict}"
    )
    return met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request costs CPU
    parser = argparse.ArgumentParser(prog="python -m bench.overhead")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per level")
    args = parser.parse_args()
    sides = deploy()
    try:
        asyncio.run(measure(sides, args.rounds))
        met = report(sides)
    finally:
        stack.stop()
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
