"""Replicas dying under load: what clients lose, through the gateway and through bare
`ray.serve.llm` (the anchor), under the same kills.

Two roles of the demo model (bench/chaos.yaml), served by one replica each that both paths share
(stack.stage), and the gateway's CPU fallback. For `PHASE_S` seconds, 4 clients send whole
requests and 2 stream, split over both roles; every `KILL_EVERY_S` seconds the replica of a
role picked at random (seeded) is killed with SIGKILL, as a crashing GPU node or the kernel's
OOM killer would take it. Measured per path: whole requests lost (any answer but 200), streams
that failed (not 200, an SSE error event, or no [DONE]), streams migrated mid-answer, and the
p99 and max latency of whole requests. Between the two phases every replica is replaced and
serving again. Target for the gateway: 0 lost, 0 failed streams.

Run with `make bench` (or `python -m bench.chaos`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from ray.util.state import list_actors

from bench import stack
from cluster.backends import build_fallback
from cluster.ray_runtime import this_cluster
from core.types import FALLBACK_BACKEND

CONFIG = Path(__file__).with_name("chaos.yaml")
PORT = 18500
ROLES = ("orchestrator", "coding")
PHASE_S = 180.0
KILL_EVERY_S = 12.0
SEED = 12
WHOLE_CLIENTS, STREAM_CLIENTS = 4, 2
REQUEST_TIMEOUT_S = 300.0
RECOVERY_TIMEOUT_S = 600.0
QUESTION = [{"role": "user", "content": "Tell me about lighthouses, in a few sentences."}]


@dataclass
class Tally:
    path: str
    whole_s: list[float] = field(default_factory=list)  # latencies of whole requests, any answer
    lost: int = 0
    streams: int = 0
    failed_streams: int = 0
    migrated_streams: int = 0
    kills: list[str] = field(default_factory=list)

    def latency_ms(self, q: float) -> float:
        ordered = sorted(self.whole_s)
        if not ordered:
            return float("nan")
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def replica_pid(deployment: str) -> int | None:
    for actor in list_actors(
        this_cluster(), filters=[("state", "=", "ALIVE")], detail=True, limit=1000
    ):
        name = str(actor.get("name") or "")
        if name.startswith(f"SERVE_REPLICA::{stack.ANCHOR_APP}#{deployment}#") and actor.get("pid"):
            return int(actor["pid"])
    return None


async def whole_client(
    client: httpx.AsyncClient, url: str, role: str, tally: Tally, end: float
) -> None:
    body = {"model": role, "messages": QUESTION, "max_tokens": 16}
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            ok = (await client.post(url, json=body)).status_code == 200
        except httpx.HTTPError:
            ok = False
        tally.whole_s.append(time.monotonic() - started)
        tally.lost += not ok


async def stream_client(
    client: httpx.AsyncClient, url: str, role: str, tally: Tally, end: float
) -> None:
    body = {"model": role, "messages": QUESTION, "max_tokens": 96, "stream": True}
    while time.monotonic() < end:
        tally.streams += 1
        lines: list[str] = []
        try:
            async with client.stream("POST", url, json=body) as reply:
                status = reply.status_code
                lines = [line async for line in reply.aiter_lines() if line]
        except httpx.HTTPError:
            status = 0
        errors = [x for x in lines if x.startswith("data: {") and "error" in json.loads(x[6:])]
        done = bool(lines) and lines[-1] == "data: [DONE]"
        tally.failed_streams += status != 200 or bool(errors) or not done
        tally.migrated_streams += any(x.startswith(": gps-migrated") for x in lines)


async def killer(tally: Tally, end: float) -> None:
    pick = random.Random(SEED)
    while time.monotonic() + KILL_EVERY_S < end:
        await asyncio.sleep(KILL_EVERY_S)
        role = pick.choice(ROLES)
        pid = await asyncio.to_thread(replica_pid, f"LLMServer:{role}@local")
        if pid is None:  # still being replaced after an earlier kill
            tally.kills.append(f"{role}: none alive")
            continue
        os.kill(pid, signal.SIGKILL)
        tally.kills.append(role)


async def phase(path: str, url: str) -> Tally:
    tally = Tally(path)
    end = time.monotonic() + PHASE_S
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        tasks = [
            whole_client(client, url, ROLES[i % len(ROLES)], tally, end)
            for i in range(WHOLE_CLIENTS)
        ]
        tasks += [
            stream_client(client, url, ROLES[i % len(ROLES)], tally, end)
            for i in range(STREAM_CLIENTS)
        ]
        await asyncio.gather(killer(tally, end), *tasks)
    return tally


async def wait_all_serving(base_url: str) -> None:
    """Every role's replica replaced and serving, and the gateway's breakers closed."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        while time.monotonic() < deadline:
            backends = (await client.get("/v1/cluster/status")).json()["backends"]
            if all(
                backends[f"{role}@local"]["state"] == "up"
                and backends[f"{role}@local"]["breaker"] == "closed"
                for role in ROLES
            ):
                return
            await asyncio.sleep(2)
    raise TimeoutError(f"the replicas did not come back within {RECOVERY_TIMEOUT_S} s")


async def measure(target: stack.Stage) -> list[Tally]:
    tallies = []
    for path, url in (("gateway", target.gateway_url), ("ray.serve.llm", target.anchor_url)):
        await wait_all_serving(target.base_url)
        tallies.append(await phase(path, url))
    await wait_all_serving(target.base_url)
    return tallies


def report(tallies: list[Tally]) -> bool:
    print(
        f"{PHASE_S:.0f} s per path, a replica of a random role SIGKILLed every "
        f"{KILL_EVERY_S:.0f} s (seed {SEED}), {WHOLE_CLIENTS} whole + {STREAM_CLIENTS} "
        "streaming clients\n"
    )
    print(
        "| path | kills | whole requests | lost | streams | failed streams | migrated streams "
        "| whole p99 ms | whole max ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in tallies:
        kills = sum(1 for k in t.kills if "none" not in k)
        print(
            f"| {t.path} | {kills} | {len(t.whole_s)} | {t.lost} | {t.streams} | "
            f"{t.failed_streams} | {t.migrated_streams} | {t.latency_ms(0.99):.0f} | "
            f"{t.latency_ms(1.0):.0f} |"
        )
    gateway, anchor = tallies
    print(
        f"\ngateway / anchor: whole p99 {gateway.latency_ms(0.99) / anchor.latency_ms(0.99):.2f}x, "
        f"max {gateway.latency_ms(1.0) / anchor.latency_ms(1.0):.2f}x; "
        f"lost {gateway.lost} vs {anchor.lost}, failed streams {gateway.failed_streams} vs "
        f"{anchor.failed_streams}"
    )
    met = gateway.lost == 0 and gateway.failed_streams == 0
    print(f"target (gateway: 0 lost, 0 failed streams): {'met' if met else 'NOT met'}")
    return met


def main() -> int:
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = stack.start(CONFIG, PORT)
    try:
        backends = {**stack.deploy_anchor(config), FALLBACK_BACKEND: build_fallback(config)}
        stack.deploy_gateway(config, backends)
        tallies = asyncio.run(measure(stack.Stage(config, f"http://127.0.0.1:{PORT}")))
    finally:
        stack.stop()
    return 0 if report(tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
