"""User latency under a background overload: our router's admission against bare ray.serve.llm,
with the class reaching the engine's own scheduler and without.

One backend of the demo model with a cap of 4 (bench/overload.yaml). A steady user stream (one
request every 0.5 s, open loop) is measured alone, then beside background clients offering four
times what the backend can take at once (16 closed-loop clients; a 429 makes a client wait its
Retry-After, as the contract asks). The gateway runs three times, each on a fresh engine:

- engine priority off (FCFS in the engine), background share 0.5; the same two phases against
  the anchor, bare `ray.serve.llm` on the very same replica (no priorities, no admission);
- engine priority off, background share 0.25: the background throughput to match;
- engine priority on (`router.engine_priority`: vLLM's priority scheduler, each request at its
  class's number), background share 0.5;
- the same with two ingress replicas, each running its router over half the cap (2 slots) and
  ordering only its own queue (`gateway.shared_slots: false`);
- the same two replicas sharing one set of slots (the default): each router admits under a
  lease from the app's slot broker, which moves the slots to where requests wait, users first.
  The broker counts the slot-seconds a user waited at one router while the other held a slot
  it did not use.

Targets for the third: user p99 under overload within 1.3x of unloaded, no user errors, and
background throughput (answers per second) no lower than the share-0.25 run's; for the last,
the same p99 and errors, and users waiting beside an unused slot for under 1% of their waiting.

Run with `make bench` (or `python -m bench.overload`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
P99_TARGET = 1.3
TRANSPORT_ERROR = 0  # the status recorded when no HTTP answer came back


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]
    anchor: bool = False  # also run the anchor's phases on this variant's replica


VARIANTS = (
    Variant(
        "priority off, share 0.5",
        {"router": {"engine_priority": False, "class_shares": {"background": 0.5}}},
        anchor=True,
    ),
    Variant(
        "priority off, share 0.25",
        {"router": {"engine_priority": False, "class_shares": {"background": 0.25}}},
    ),
    Variant(
        "priority on, share 0.5",
        {"router": {"engine_priority": True, "class_shares": {"background": 0.5}}},
    ),
    # Two ingress replicas, each running its own router: each over a fixed cap // 2 of the
    # backend's slots (ordering only its own queue), then sharing one set of slots through the
    # app's slot broker (the default): what priority is worth when the gateway scales out.
    Variant(
        "priority on, share 0.5, 2 ingress replicas, fixed halves",
        {
            "router": {"engine_priority": True, "class_shares": {"background": 0.5}},
            "gateway": {"ingress_replicas": 2, "shared_slots": False},
        },
    ),
    Variant(
        "priority on, share 0.5, 2 ingress replicas, shared slots",
        {
            "router": {"engine_priority": True, "class_shares": {"background": 0.5}},
            "gateway": {"ingress_replicas": 2},
        },
    ),
)
MEASURED, BACKGROUND_REFERENCE = VARIANTS[2].name, VARIANTS[1].name
HALVES, SCALED_OUT = VARIANTS[3].name, VARIANTS[4].name


@dataclass
class Phase:
    path: str
    background_clients: int
    seconds: float = 0.0
    user_latencies_s: list[float] = field(default_factory=list)
    user_statuses: Counter[int] = field(default_factory=Counter)
    background_statuses: Counter[int] = field(default_factory=Counter)
    # The slot broker's counts over the phase (shared slots only): slot-seconds users waited
    # beside a slot another router left unused, and all the seconds users waited.
    idle_s: float | None = None
    wait_s: float | None = None

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.user_latencies_s)
        if not ordered:
            return float("nan")
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def background_per_s(self) -> float:
        return self.background_statuses[200] / self.seconds if self.seconds else 0.0

    @property
    def user_errors(self) -> int:
        return sum(n for status, n in self.user_statuses.items() if status != 200)


async def post(client: httpx.AsyncClient, url: str, priority: str) -> httpx.Response | None:
    try:
        return await client.post(url, json=BODY, headers={"X-Priority": priority})
    except httpx.HTTPError:
        return None


async def user_stream(
    client: httpx.AsyncClient,
    url: str,
    requests: int,
    phase: Phase,
    interval_s: float = USER_INTERVAL_S,
) -> None:
    """Open loop: request i leaves at i * `interval_s` whatever the others are doing."""

    async def one(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        started = time.perf_counter()
        response = await post(client, url, "user")
        status = response.status_code if response is not None else TRANSPORT_ERROR
        phase.user_statuses[status] += 1
        if status == 200:
            phase.user_latencies_s.append(time.perf_counter() - started)

    await asyncio.gather(*(one(i * interval_s) for i in range(requests)))


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
        started = time.perf_counter()  # background answers are counted from here
        if background:
            await asyncio.sleep(QUEUE_FILL_S)
        await user_stream(client, url, requests, phase)
        stop.set()
        await asyncio.gather(*background)
        phase.seconds = time.perf_counter() - started
    return phase


IDLE_SHARE_TARGET = 0.01  # of the users' waiting, spent beside a slot another router left unused


def broker_stats() -> dict[str, float]:
    """The gateway's slot broker's counts (none without one), summed over backends."""
    import ray

    from cluster.ray_runtime import SERVE_NAMESPACE
    from deployments.router.slot_broker import broker_name

    try:
        broker = ray.get_actor(broker_name(stack.GATEWAY_APP), namespace=SERVE_NAMESPACE)
    except ValueError:
        return {}
    stats = ray.get(broker.stats.remote())
    return {
        "idle_s": sum(stats["idle_while_user_waits_s"].values()),
        "wait_s": sum(stats["user_wait_s"].values()),
    }


async def measure(target: stack.Stage, variant: Variant, requests: int) -> list[Phase]:
    clients = BACKGROUND_FACTOR * target.config.models[0].cap
    paths = [(variant.name, target.gateway_url)]
    if variant.anchor:
        paths.append(("ray.serve.llm", target.anchor_url))
    for _, url in paths:  # warm both paths
        await run_phase("warm-up", url, 0, 8)
    phases = []
    for name, url in paths:
        phases.append(await run_phase(name, url, 0, requests))
        before = broker_stats()
        loaded = await run_phase(name, url, clients, requests)
        after = broker_stats()
        if after:
            loaded.idle_s = after["idle_s"] - before.get("idle_s", 0.0)
            loaded.wait_s = after["wait_s"] - before.get("wait_s", 0.0)
        phases.append(loaded)
    return phases


def report(phases: list[Phase]) -> bool:
    print(
        "| path | background clients | user n | user p50 ms | user p99 ms | p99 vs unloaded "
        "| user errors | background 200 / 429 / other | background 200/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    unloaded: dict[str, float] = {}
    loaded: dict[str, Phase] = {}
    ratios: dict[str, float] = {}
    for phase in phases:
        p99 = phase.percentile_ms(0.99)
        if not phase.background_clients:
            unloaded[phase.path] = p99
        else:
            loaded[phase.path] = phase
        ratio = ratios[phase.path] = p99 / unloaded[phase.path]
        bg = phase.background_statuses
        other = sum(n for status, n in bg.items() if status not in (200, 429))
        p50 = statistics.median(phase.user_latencies_s) * 1000 if phase.user_latencies_s else 0
        print(
            f"| {phase.path} | {phase.background_clients} | {len(phase.user_latencies_s)} "
            f"| {p50:.0f} | {p99:.0f} | {ratio:.2f} | {phase.user_errors} "
            f"| {bg[200]} / {bg[429]} / {other} | {phase.background_per_s:.2f} |"
        )
    # The gateway answers background work 200 or 429, nothing else (no 5xx, no dropped call).
    clean = all(
        status in (200, 429)
        for phase in loaded.values()
        if phase.path != "ray.serve.llm"
        for status in phase.background_statuses
    )
    reference = loaded.get(BACKGROUND_REFERENCE)
    reference_rate = reference.background_per_s if reference else 0.0
    met = True
    if MEASURED in loaded:  # not with --scaled-out-only
        measured = loaded[MEASURED]
        throughput = measured.background_per_s / reference_rate if reference_rate else math.inf
        met = (
            ratios[MEASURED] <= P99_TARGET
            and measured.user_errors == 0
            and clean
            and throughput >= 1.0
        )
        print(
            f"\n{MEASURED}: user p99 loaded / unloaded {ratios[MEASURED]:.2f} (target <= "
            f"{P99_TARGET}), user errors {measured.user_errors}, background throughput "
            f"{throughput:.2f} x the {BACKGROUND_REFERENCE!r} run's (target >= 1.0); gateway "
            f"background answers other than 200/429: {'none' if clean else 'SOME'}: "
            f"{'met' if met else 'NOT met'}"
        )
    halves, scaled = loaded[HALVES], loaded[SCALED_OUT]
    idle_s, wait_s = scaled.idle_s or 0.0, scaled.wait_s or 0.0
    idle_share = idle_s / wait_s if wait_s else 0.0
    scaled_met = (
        ratios[SCALED_OUT] <= P99_TARGET
        and scaled.user_errors == 0
        and clean
        and idle_share <= IDLE_SHARE_TARGET
    )
    print(
        f"{HALVES}: user p99 loaded / unloaded {ratios[HALVES]:.2f}, user errors "
        f"{halves.user_errors}, background {halves.background_per_s:.2f}/s (for comparison)"
    )
    print(
        f"{SCALED_OUT}: user p99 loaded / unloaded {ratios[SCALED_OUT]:.2f} (target <= "
        f"{P99_TARGET}), user errors {scaled.user_errors}, background "
        f"{scaled.background_per_s:.2f}/s; users waited {wait_s:.1f} s at a router, "
        f"{idle_s:.2f} slot-s of it beside a slot the other router left unused "
        f"({100 * idle_share:.1f}%, target <= {100 * IDLE_SHARE_TARGET:.0f}%): "
        f"{'met' if scaled_met else 'NOT met'}"
    )
    return met and scaled_met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.overload")
    parser.add_argument("--requests", type=int, default=40, help="user requests per phase")
    parser.add_argument(
        "--scaled-out-only", action="store_true",
        help="only the two-replica variants (and no verdict on the others)",
    )  # fmt: skip
    args = parser.parse_args()
    phases: list[Phase] = []
    variants = VARIANTS[3:] if args.scaled_out_only else VARIANTS
    for variant in variants:  # each on an engine started for it (its scheduling policy)
        target = stack.stage(CONFIG, PORT, variant.overrides)
        try:
            phases += asyncio.run(measure(target, variant, args.requests))
        finally:
            stack.stop()
    sys.exit(0 if report(phases) else 1)


if __name__ == "__main__":
    main()
