"""User latency under a background overload: our router's admission against bare ray.serve.llm.

One backend of the demo model with a cap of 4 (bench/overload.yaml). A steady user stream (one
request every 0.5 s, open loop) is measured alone, then beside background clients offering four
times what the backend can take at once (16 closed-loop clients; a 429 makes a client wait its
Retry-After, as the contract asks). The same two phases run against the anchor, bare
`ray.serve.llm` on the very same replica, which has no priorities and no admission. Targets for
the gateway: user p99 under overload within 1.5x of unloaded, and no user errors.

Run with `make bench` (or `python -m bench.overload`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import stack

CONFIG = Path(__file__).with_name("overload.yaml")
PORT = 18200
BODY = {
    "model": "orchestrator",
    "messages": [{"role": "user", "content": "Count from one to ten."}],
    "max_tokens": 16,
    "ignore_eos": True,
}
USER_INTERVAL_S = 0.5
BACKGROUND_FACTOR = 4  # background clients per slot of the backend's cap
QUEUE_FILL_S = 3.0  # background alone before the users start, so the queue is full
P99_TARGET = 1.5
TRANSPORT_ERROR = 0  # the status recorded when no HTTP answer came back


@dataclass
class Phase:
    path: str
    background_clients: int
    user_latencies_s: list[float] = field(default_factory=list)
    user_statuses: Counter[int] = field(default_factory=Counter)
    background_statuses: Counter[int] = field(default_factory=Counter)

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.user_latencies_s)
        if not ordered:
            return float("nan")
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def user_errors(self) -> int:
        return sum(n for status, n in self.user_statuses.items() if status != 200)


async def post(client: httpx.AsyncClient, url: str, priority: str) -> httpx.Response | None:
    try:
        return await client.post(url, json=BODY, headers={"X-Priority": priority})
    except httpx.HTTPError:
        return None


async def user_stream(client: httpx.AsyncClient, url: str, requests: int, phase: Phase) -> None:
    """Open loop: request i leaves at i * USER_INTERVAL_S whatever the others are doing."""

    async def one(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        started = time.perf_counter()
        response = await post(client, url, "user")
        status = response.status_code if response is not None else TRANSPORT_ERROR
        phase.user_statuses[status] += 1
        if status == 200:
            phase.user_latencies_s.append(time.perf_counter() - started)

    await asyncio.gather(*(one(i * USER_INTERVAL_S) for i in range(requests)))


async def background_client(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, phase: Phase
) -> None:
    while not stop.is_set():
        response = await post(client, url, "background")
        status = response.status_code if response is not None else TRANSPORT_ERROR
        phase.background_statuses[status] += 1
        if response is not None and status == 429:
            await asyncio.sleep(float(response.headers.get("retry-after", "1")))


async def run_phase(path: str, url: str, background_clients: int, requests: int) -> Phase:
    phase = Phase(path, background_clients)
    limits = httpx.Limits(max_connections=background_clients + requests)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        stop = asyncio.Event()
        background = [
            asyncio.create_task(background_client(client, url, stop, phase))
            for _ in range(background_clients)
        ]
        if background:
            await asyncio.sleep(QUEUE_FILL_S)
        await user_stream(client, url, requests, phase)
        stop.set()
        await asyncio.gather(*background)
    return phase


async def measure(target: stack.Stage, requests: int) -> list[Phase]:
    clients = BACKGROUND_FACTOR * target.config.models[0].cap
    paths = [("gateway", target.gateway_url), ("ray.serve.llm", target.anchor_url)]
    for _, url in paths:  # warm both paths
        await run_phase("warm-up", url, 0, 8)
    phases = []
    for name, url in paths:
        phases.append(await run_phase(name, url, 0, requests))
        phases.append(await run_phase(name, url, clients, requests))
    return phases


def report(phases: list[Phase]) -> bool:
    print(
        "| path | background clients | user n | user p50 ms | user p99 ms | p99 vs unloaded "
        "| user errors | background 200 / 429 / other |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    unloaded: dict[str, float] = {}
    met = True
    for phase in phases:
        p99 = phase.percentile_ms(0.99)
        if not phase.background_clients:
            unloaded[phase.path] = p99
        ratio = p99 / unloaded[phase.path]
        bg = phase.background_statuses
        other = sum(n for status, n in bg.items() if status not in (200, 429))
        p50 = statistics.median(phase.user_latencies_s) * 1000 if phase.user_latencies_s else 0
        print(
            f"| {phase.path} | {phase.background_clients} | {len(phase.user_latencies_s)} "
            f"| {p50:.0f} | {p99:.0f} | {ratio:.2f} | {phase.user_errors} "
            f"| {bg[200]} / {bg[429]} / {other} |"
        )
        if phase.path == "gateway" and phase.background_clients:
            met = ratio <= P99_TARGET and phase.user_errors == 0 and other == 0
    verdict = "met" if met else "NOT met"
    print(
        f"\ntarget (gateway user p99 under overload <= {P99_TARGET}x unloaded, "
        f"0 user errors, no 5xx): {verdict}"
    )
    return met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.overload")
    parser.add_argument("--requests", type=int, default=40, help="user requests per phase")
    parser.add_argument(
        "--background-share",
        type=float,
        help="router.class_shares.background for this run (default: the config's)",
    )
    args = parser.parse_args()
    overrides = {}
    if args.background_share is not None:
        overrides = {"router": {"class_shares": {"background": args.background_share}}}
    target = stack.stage(CONFIG, PORT, overrides)
    shares = target.config.router.class_shares
    print("class shares: " + ", ".join(f"{c.value} {s}" for c, s in shares.items()))
    try:
        met = report(asyncio.run(measure(target, args.requests)))
    finally:
        stack.stop()
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
