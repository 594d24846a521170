"""Replica death under load: requests lost and time to the next answer, gateway against anchor.

Two backends of the demo model (bench/failover.yaml); the gateway's chain for the orchestrator
is orchestrator@local -> coding@local. Four clients send non-streaming requests in a closed
loop; after a few seconds the orchestrator's only replica is killed (`ray.kill`, as a dying GPU
node would take it) and the load goes on until Serve has replaced it and it serves again.
Measured for the gateway: requests lost (target 0), seconds from the kill to the first answer
served by the next link, and to the first answer from the replaced replica. The same kill under
bare `ray.serve.llm` (the anchor, on the same replica, no chain): requests lost and seconds
until a request sent after the kill is answered.

Run with `make bench` (or `python -m bench.failover`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import ray

from bench import stack
from cluster.backends import build_backend

CONFIG = Path(__file__).with_name("failover.yaml")
PORT = 18300
VICTIM = "orchestrator@local"
NEXT_LINK = "coding@local"
BODY = {
    "model": "orchestrator",
    "messages": [{"role": "user", "content": "Count from one to ten."}],
    "max_tokens": 16,
    "ignore_eos": True,
}
CLIENTS = 4
KILL_AFTER_S = 5.0
RECOVERY_TIMEOUT_S = 480.0
TRANSPORT_ERROR = 0


@dataclass(frozen=True)
class Outcome:
    started: float  # seconds from the kill (negative: before it)
    ended: float
    status: int
    backend: str


@dataclass(frozen=True)
class Run:
    path: str
    outcomes: list[Outcome]

    @property
    def lost(self) -> int:
        return sum(1 for o in self.outcomes if o.status != 200)

    def first_answer_after_kill(self, backend: str | None = None) -> float | None:
        """Seconds from the kill to the first answer (from `backend`) sent after the kill or,
        for the next link, ending after it."""
        times = [
            o.ended
            for o in self.outcomes
            if o.status == 200
            and (o.started >= 0 if backend in (None, VICTIM) else o.ended >= 0)
            and (backend is None or o.backend == backend)
        ]
        return min(times, default=None)


def replica_actor(app: str, deployment: str) -> str:
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    names: list[str] = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(prefix)
    ]
    [name] = names
    return name


async def load_through_a_kill(
    url: str, victim_actor: str, recovered: Callable[[list[Outcome]], bool]
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    kill_at = time.monotonic() + KILL_AFTER_S
    deadline = kill_at + RECOVERY_TIMEOUT_S

    async def client(session: httpx.AsyncClient) -> None:
        while not recovered(outcomes) and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                response = await session.post(url, json=BODY)
                status, backend = response.status_code, response.headers.get("x-backend", "")
            except httpx.HTTPError:
                status, backend = TRANSPORT_ERROR, ""
            outcomes.append(Outcome(started - kill_at, time.monotonic() - kill_at, status, backend))

    async with httpx.AsyncClient(timeout=RECOVERY_TIMEOUT_S) as session:
        clients = [asyncio.create_task(client(session)) for _ in range(CLIENTS)]
        await asyncio.sleep(max(0.0, kill_at - time.monotonic()))
        ray.kill(ray.get_actor(victim_actor, namespace="serve"), no_restart=True)
        await asyncio.gather(*clients)
    return outcomes


def gateway_recovered(outcomes: list[Outcome]) -> bool:
    return any(o.started >= 0 and o.status == 200 and o.backend == VICTIM for o in outcomes)


def anchor_recovered(outcomes: list[Outcome]) -> bool:
    return any(o.started >= 0 and o.status == 200 for o in outcomes)


async def wait_until_up(target: stack.Stage) -> None:
    """The replaced replica is running and the gateway's breaker for it is closed again."""
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as session:
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            backend = (await session.get("/v1/cluster/status")).json()["backends"][VICTIM]
            if backend["state"] == "up" and backend["breaker"] == "closed":
                return
            await asyncio.sleep(1)
    raise TimeoutError(f"{VICTIM} did not come back within {RECOVERY_TIMEOUT_S} s")


async def measure(target: stack.Stage) -> list[Run]:
    anchor_deployment = f"LLMServer:{VICTIM}"
    runs = []
    for path, url, recovered in (
        ("gateway", target.gateway_url, gateway_recovered),
        ("ray.serve.llm", target.anchor_url, anchor_recovered),
    ):
        await wait_until_up(target)
        victim = replica_actor(stack.ANCHOR_APP, anchor_deployment)
        runs.append(Run(path, await load_through_a_kill(url, victim, recovered)))
    return runs


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def report(runs: list[Run]) -> bool:
    print(
        "| path | requests | lost | first answer by the next link (s) "
        "| first answer sent after the kill (s) | killed backend serving again (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    met = True
    for run in runs:
        next_link = run.first_answer_after_kill(NEXT_LINK) if run.path == "gateway" else None
        print(
            f"| {run.path} | {len(run.outcomes)} | {run.lost} "
            f"| {seconds(next_link) if run.path == 'gateway' else 'no chain'} "
            f"| {seconds(run.first_answer_after_kill())} "
            f"| {seconds(run.first_answer_after_kill(VICTIM if run.path == 'gateway' else None))} |"
        )
        if run.path == "gateway":
            met = run.lost == 0 and next_link is not None
    print(
        f"\ntarget (gateway: 0 requests lost, the next link answers): {'met' if met else 'NOT met'}"
    )
    return met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = stack.start(CONFIG, PORT)
    replicas = stack.deploy_anchor(config, (VICTIM,))
    backends = {
        VICTIM: replicas[VICTIM],
        NEXT_LINK: build_backend(config, next(b for b in config.backends if b.name == NEXT_LINK)),
    }
    stack.deploy_gateway(config, backends)
    try:
        met = report(asyncio.run(measure(stack.Stage(config, f"http://127.0.0.1:{PORT}"))))
    finally:
        stack.stop()
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
