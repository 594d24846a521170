"""Load-driven autoscaling against Serve's own (`target_ongoing_requests`), on the same load.

One Ray node on this machine and one backend of the demo model allowed two replicas
(bench/autoscale.yaml). Each side meets the same load step: one client for WARM_S, then 16
clients until the second replica runs and HOLD_S longer, then one client again until the count
is back at one. Measured per side: the time from the step to the second replica running
(Serve's status), the p99 wait for the first token of a streamed answer (queue and prefill: what
a user waits) with one client before the step and with 16 once both replicas run, and the time
from the return to one client to one replica. Ours: the gateway with `models[].autoscaling`
(the router's queue and KV usage, a cap of 4 per replica); the anchor: bare ray.serve.llm with
Serve's default policy (`target_ongoing_requests` 2, named: ray.serve.llm's own default of 1e9
never scales up) and the same upscale and downscale delays. The sides run one after the other on
a fresh deployment each, so neither competes with the other's engines. No target: the figures
and their ratios are reported; a failed request on our side fails it.
Run with `make bench` (or `python -m bench.autoscale`).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from ray import serve
from ray.serve.config import AutoscalingConfig
from ray.serve.llm import build_openai_app

from bench import stack
from cluster.app import build_app
from cluster.backends import llm_config_for
from core.config import ClusterConfig

CONFIG = Path(__file__).with_name("autoscale.yaml")
PORT = 18800
ROLE = "coding"
STEP_CLIENTS = 16
WARM_S = 30.0
HOLD_S = 45.0
UP_TIMEOUT_S = 600.0
BODY = {
    "model": ROLE,
    "messages": [{"role": "user", "content": "Count from one to ten."}],
    "max_tokens": 16,
    "ignore_eos": True,
    "stream": True,
}


@dataclass(frozen=True)
class Answer:
    sent: float  # monotonic
    first_token_s: float | None
    ok: bool


@dataclass
class Side:
    name: str
    url: str
    app: str
    deployment: str
    answers: list[Answer] = field(default_factory=list)
    step_at: float = 0.0
    back_at: float = 0.0
    second_s: float | None = None  # from the step to two replicas running
    both_at: float | None = None
    down_s: float | None = None  # from the step back to one replica running

    def waits(self, start: float, end: float) -> list[float]:
        return [
            a.first_token_s
            for a in self.answers
            if a.ok and a.first_token_s is not None and start <= a.sent < end
        ]

    @property
    def failed(self) -> int:
        return sum(not a.ok for a in self.answers)


def running_replicas(app: str, deployment: str) -> int:
    deployments = serve.status().applications[app].deployments
    return int(deployments[deployment].replica_states.get("RUNNING", 0))


async def ask(client: httpx.AsyncClient, url: str) -> Answer:
    sent = time.monotonic()
    first: float | None = None
    ok = False
    try:
        async with client.stream("POST", url, json=BODY) as reply:
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    ok = reply.status_code == 200
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    break
                if first is None and chunk.get("choices"):
                    first = time.monotonic() - sent
    except httpx.HTTPError:
        ok = False
    return Answer(sent, first, ok)


class Clients:
    """`count` clients each sending requests back to back, their answers in `side.answers`."""

    def __init__(self, client: httpx.AsyncClient, side: Side) -> None:
        self._client = client
        self._side = side
        self._tasks: list[asyncio.Task[None]] = []

    def resize(self, count: int) -> None:
        while len(self._tasks) < count:
            self._tasks.append(asyncio.create_task(self._loop()))
        while len(self._tasks) > count:
            self._tasks.pop().cancel()

    async def _loop(self) -> None:
        while True:
            self._side.answers.append(await ask(self._client, self._side.url))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(check: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `check` holds (polled each second off the event loop); None on timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await asyncio.to_thread(check):
            return time.monotonic() - started
        await asyncio.sleep(1.0)
    return None


async def step(side: Side, down_timeout_s: float) -> None:
    count = running_replicas(side.app, side.deployment)
    assert count == 1, f"{side.name} starts with {count} replicas"
    limits = httpx.Limits(max_connections=STEP_CLIENTS * 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        clients = Clients(client, side)
        clients.resize(1)
        await asyncio.sleep(WARM_S)
        side.step_at = time.monotonic()
        clients.resize(STEP_CLIENTS)
        side.second_s = await until(
            lambda: running_replicas(side.app, side.deployment) == 2, UP_TIMEOUT_S
        )
        if side.second_s is not None:
            side.both_at = time.monotonic()
            await asyncio.sleep(HOLD_S)
        side.back_at = time.monotonic()
        clients.resize(1)
        side.down_s = await until(
            lambda: running_replicas(side.app, side.deployment) == 1, down_timeout_s
        )
        await clients.stop()


def ours(config: ClusterConfig) -> Side:
    serve.run(build_app(config), name=stack.GATEWAY_APP, route_prefix="/")
    return Side(
        "gateway (router queue + KV)",
        f"http://127.0.0.1:{PORT}/v1/chat/completions",
        stack.GATEWAY_APP,
        f"model:{ROLE}@local",
    )


def anchor(config: ClusterConfig) -> Side:
    """Bare ray.serve.llm with Serve's default autoscaling policy on the same engine."""
    scaling = config.model_named(config.backends[0].model).autoscaling
    assert scaling is not None
    [backend] = config.home_backends
    llm_config = llm_config_for(config, backend, placed=False)
    llm_config.deployment_config["autoscaling_config"] = {
        # Serve's own default, said out loud: ray.serve.llm lays a target of 1e9 ongoing
        # requests over any autoscaling_config that names none, and then never scales up (seen
        # here: 600 s of 16 clients on one replica).
        "target_ongoing_requests": AutoscalingConfig().target_ongoing_requests,
        "min_replicas": scaling.min_replicas,
        "max_replicas": scaling.max_replicas,
        "initial_replicas": 1,
        "upscale_delay_s": scaling.upscale_delay_s,
        "downscale_delay_s": scaling.downscale_delay_s,
    }
    route = f"/{stack.ANCHOR_APP}"
    serve.run(build_openai_app({"llm_configs": [llm_config]}), name=stack.ANCHOR_APP,
              route_prefix=route)  # fmt: skip
    return Side(
        "ray.serve.llm (target_ongoing_requests)",
        f"http://127.0.0.1:{PORT}{route}/v1/chat/completions",
        stack.ANCHOR_APP,
        f"LLMServer:{backend.name}",
    )


def p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def ratio(ours_value: float | None, anchor_value: float | None) -> str:
    if ours_value is None or not anchor_value or math.isnan(anchor_value):
        return "-"
    return f"{ours_value / anchor_value:.2f}"


def report(sides: list[Side]) -> bool:
    rows: list[tuple[str, list[float | None]]] = []
    for side in sides:
        before = p99(side.waits(side.step_at - WARM_S, side.step_at))
        after = p99(side.waits(side.both_at, side.back_at)) if side.both_at else math.nan
        down = side.down_s if side.second_s is not None else None  # never up: never down
        rows.append((side.name, [side.second_s, before, after, down]))
    print(
        f"\nautoscaling: 1 client, {STEP_CLIENTS} clients until two replicas run and "
        f"{HOLD_S:.0f} s more, 1 client again"
    )
    print(
        "| path | to 2nd replica (s) | first-token wait p99, 1 client (s) "
        f"| first-token wait p99, {STEP_CLIENTS} clients on 2 (s) | back to 1 replica (s) "
        "| requests | failed |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, values), side in zip(rows, sides, strict=True):
        cells = " | ".join(seconds(v) for v in values)
        print(f"| {name} | {cells} | {len(side.answers)} | {side.failed} |")
    if len(rows) == 2:
        ours_values, anchor_values = rows[0][1], rows[1][1]
        cells = " | ".join(ratio(o, a) for o, a in zip(ours_values, anchor_values, strict=True))
        print(f"| ratio ours / anchor | {cells} | | |")
    return sides[0].failed == 0 and sides[0].second_s is not None


def main() -> int:
    config = stack.start(CONFIG, PORT)
    scaling = config.model_named(config.backends[0].model).autoscaling
    assert scaling is not None
    down_timeout_s = scaling.downscale_delay_s + 180
    sides = []
    try:
        side = ours(config)
        asyncio.run(step(side, down_timeout_s))
        sides.append(side)
        serve.delete(stack.GATEWAY_APP)
        side = anchor(config)
        asyncio.run(step(side, down_timeout_s))
        sides.append(side)
    finally:
        stack.stop()
    return 0 if report(sides) else 1


if __name__ == "__main__":
    sys.exit(main())
