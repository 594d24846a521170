"""Replicas dying under load and while idle: what clients lose and wait, through the gateway
and through bare `ray.serve.llm` (the anchor), under the same kills.

Two roles of the demo model (bench/chaos.yaml), served by one replica each that both paths share
(stack.stage), and the gateway's CPU fallback.

Busy kills: for `PHASE_S` seconds, 4 clients send whole requests and 2 stream, split over both
roles; every `KILL_EVERY_S` seconds the replica of a role picked at random (seeded) is killed
with SIGKILL, as a crashing GPU node or the kernel's OOM killer would take it. Measured per
path: whole requests lost (any answer but 200), streams that failed (not 200, an SSE error
event, or no [DONE]), streams migrated mid-answer, and the p99 and max latency of whole
requests. Target for the gateway: 0 lost, 0 failed streams.

Idle kills: with no request in flight, a role's only replica is killed; a whole and a streamed
request for that role are sent at once (Serve may not know yet), and again once Serve reports
the replica gone (its replacement loading). Each is timed against a normal failover measured
just before the kill: the same requests sent to the next link of the role's chain. Target for
the gateway: every first request after an idle kill answered within one normal failover
(its time <= the reference's + `FAILOVER_ALLOWANCE_S`), none lost, no stream error event. The
anchor has no next link: its first request after a kill waits for the replacement.

Between phases every replica is replaced and serving again.

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
from ray import serve
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
IDLE_KILL_ROUNDS = 2  # per role, on the gateway; one per role on the anchor (each waits minutes)
NEXT_LINK = {"orchestrator": "coding", "coding": "orchestrator"}  # bench/chaos.yaml's chains
# A failover past a dead replica costs an error's round trip and the router's short wait for a
# replacement that Serve may just have reported running
# (deployments/router/request_path/serving.py).
FAILOVER_ALLOWANCE_S = 1.5
NOTICED_TIMEOUT_S = 120.0
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


@dataclass(frozen=True)
class Reply:
    """One timed request: its answer, who served it, when its first text came and it ended."""

    ok: bool
    backend: str
    first_s: float  # to the whole answer, or a stream's first text
    total_s: float


@dataclass(frozen=True)
class IdleKill:
    path: str
    role: str
    sent: str  # "at once" after the kill, or once Serve "noticed" the replica gone
    whole: Reply
    stream: Reply | None  # the anchor's is not measured: its whole request already waits
    reference: Reply  # the same request, through the next link directly, before the kill

    @property
    def within_one_failover(self) -> bool:
        limit = self.reference.total_s + FAILOVER_ALLOWANCE_S
        streamed = self.stream is None or self.stream.first_s <= limit
        return self.whole.total_s <= limit and streamed


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


async def timed(client: httpx.AsyncClient, url: str, role: str, stream: bool) -> Reply:
    body = {"model": role, "messages": QUESTION, "max_tokens": 16, "stream": stream}
    started = time.monotonic()
    first: float | None = None
    lines: list[str] = []
    try:
        async with client.stream("POST", url, json=body) as reply:
            status, backend = reply.status_code, reply.headers.get("x-backend", "")
            async for line in reply.aiter_lines():
                if line:
                    lines.append(line)
                if first is None and '"content"' in line:
                    first = time.monotonic() - started
    except httpx.HTTPError:
        status, backend = 0, ""
    total = time.monotonic() - started
    errors = [x for x in lines if x.startswith("data: {") and "error" in json.loads(x[6:])]
    done = not stream or (bool(lines) and lines[-1] == "data: [DONE]")
    ok = status == 200 and done and not errors
    return Reply(ok, backend, total if first is None or not stream else first, total)


def serve_running(deployment: str) -> int:
    overview = serve.status().applications[stack.ANCHOR_APP].deployments
    return int(overview[deployment].replica_states.get("RUNNING", 0))


async def idle_kills(target: stack.Stage, path: str, url: str, rounds: int) -> list[IdleKill]:
    """Kill each role's replica while nothing is in flight; time the next requests for it."""
    kills: list[IdleKill] = []
    order = random.Random(SEED).sample(ROLES * rounds, len(ROLES) * rounds)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for role in order:
            await wait_all_serving(target.base_url)
            reference = await timed(client, url, NEXT_LINK[role], stream=False)
            deployment = f"LLMServer:{role}@local"
            pid = await asyncio.to_thread(replica_pid, deployment)
            if pid is None:
                raise RuntimeError(f"{role} has no replica to kill")
            os.kill(pid, signal.SIGKILL)
            kills.append(await _after_kill(client, path, url, role, "at once", reference))
            if path != "gateway":  # the anchor's first request waited for the replacement
                continue
            deadline = time.monotonic() + NOTICED_TIMEOUT_S
            while await asyncio.to_thread(serve_running, deployment):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Serve did not see {role}'s replica gone")
                await asyncio.sleep(0.2)
            kills.append(await _after_kill(client, path, url, role, "noticed", reference))
    return kills


async def _after_kill(
    client: httpx.AsyncClient, path: str, url: str, role: str, sent: str, reference: Reply
) -> IdleKill:
    if path != "gateway":
        return IdleKill(path, role, sent, await timed(client, url, role, False), None, reference)
    whole, stream = await asyncio.gather(
        timed(client, url, role, False), timed(client, url, role, True)
    )
    return IdleKill(path, role, sent, whole, stream, reference)


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


def paths(target: stack.Stage) -> tuple[tuple[str, str], ...]:
    return (("gateway", target.gateway_url), ("ray.serve.llm", target.anchor_url))


async def measure_busy(target: stack.Stage) -> list[Tally]:
    tallies: list[Tally] = []
    for path, url in paths(target):
        await wait_all_serving(target.base_url)
        tallies.append(await phase(path, url))
    return tallies


async def measure_idle(target: stack.Stage) -> list[IdleKill]:
    kills: list[IdleKill] = []
    for path, url in paths(target):
        rounds = IDLE_KILL_ROUNDS if path == "gateway" else 1
        kills += await idle_kills(target, path, url, rounds)
    await wait_all_serving(target.base_url)
    return kills


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


def report_idle(kills: list[IdleKill]) -> bool:
    print(
        "\nIdle kills: a role's only replica SIGKILLed with nothing in flight, then a whole "
        "request and a stream (16 tokens) for it; reference: the whole request through the "
        "next link, just before the kill\n"
    )
    print(
        "| path | role | sent | served by | whole ms | stream first text ms | reference ms "
        "| whole / reference | answered |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---|")
    for k in kills:
        stream = f"{1000 * k.stream.first_s:.0f}" if k.stream else "-"
        answered = k.whole.ok and (k.stream is None or k.stream.ok)
        print(
            f"| {k.path} | {k.role} | {k.sent} | {k.whole.backend or '-'} | "
            f"{1000 * k.whole.total_s:.0f} | {stream} | {1000 * k.reference.total_s:.0f} | "
            f"{k.whole.total_s / k.reference.total_s:.2f} | {'yes' if answered else 'NO'} |"
        )
    ours = [k for k in kills if k.path == "gateway"]
    met = all(k.within_one_failover and k.whole.ok and k.stream and k.stream.ok for k in ours)
    worst = max((k.whole.total_s for k in ours), default=float("nan"))
    anchor = [k.whole.total_s for k in kills if k.path != "gateway"]
    print(
        f"\ngateway: slowest first answer after an idle kill {1000 * worst:.0f} ms; anchor: "
        f"{', '.join(f'{1000 * s:.0f}' for s in anchor)} ms (it waits for the replacement)"
    )
    print(
        "target (gateway: every first request after an idle kill answered within one normal "
        f"failover, reference + {FAILOVER_ALLOWANCE_S} s): {'met' if met else 'NOT met'}"
    )
    return met


def main() -> int:
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = stack.start(CONFIG, PORT)
    try:
        backends = {**stack.deploy_anchor(config), FALLBACK_BACKEND: build_fallback(config)}
        stack.deploy_gateway(config, backends)
        target = stack.Stage(config, f"http://127.0.0.1:{PORT}")
        busy_met = report(asyncio.run(measure_busy(target)))  # printed before the idle kills
        idle_met = report_idle(asyncio.run(measure_idle(target)))
    finally:
        stack.stop()
    return 0 if busy_met and idle_met else 1


if __name__ == "__main__":
    sys.exit(main())
