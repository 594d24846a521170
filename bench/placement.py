"""Moving a model between pools: time until it serves on the new pool, requests failed and waits.

A Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`: a head, a node with
`pool_local`, a node with `pool_cloud`); the reasoning model may run on either pool
(bench/placement.yaml). Two clients send short requests in a closed loop throughout.

- Gateway: the local pool's VRAM probe is made to report 2 GB free (`VramProbe.inject`, the
  probes' own interface: this machine has no GPU); the placement actor reads it, moves the model
  to the cloud pool make-before-break, and later, once the probe reports 30 GB again and the
  away time has passed, back. Measured from the probe reading that crossed the threshold (the
  move record's `read_at`; the reading comes at most `placement.interval_s` after the change,
  shown apart) to the first answer served by the target deployment.
- Anchor: bare `ray.serve.llm` on the same nodes can move a model only by redeploying it with
  the other pool's resource, which restarts its replica. Measured from the redeploy call to the
  first answer that ends after Serve reports the app running again.

For both, over the requests in flight from that start to that first answer: how many failed
(target for the gateway: 0) and the longest any of them waited.

Run with `make bench` (or `python -m bench.placement`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve
from ray.cluster_utils import Cluster
from ray.serve.llm import build_openai_app

from autoscale.placer import PLACER_NAME
from autoscale.probe import start_probes
from autoscale.vram import NodeReading
from bench import stack
from cluster.app import build_app
from cluster.backends import llm_config_for
from cluster.ray_runtime import SERVE_NAMESPACE
from core.config import ClusterConfig

CONFIG = Path(__file__).with_name("placement.yaml")
PORT = 18700
ROLE = "reasoning"
LOCAL, CLOUD = f"{ROLE}@local", f"{ROLE}@cloud"
GATEWAY_APP = "placed"
BODY = {"model": ROLE, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 8}
CLIENTS = 2
PAUSE_S = 0.25  # between a client's requests: the engines starting share the same two cores
MOVE_TIMEOUT_S = 480.0
PLENTY_GB, SCARCE_GB = 30.0, 2.0
TRANSPORT_ERROR = 0


@dataclass(frozen=True)
class Answer:
    sent: float  # wall clock, as the placement actor's move records are
    ended: float
    status: int
    backend: str


@dataclass(frozen=True)
class Move:
    path: str
    direction: str
    started: float  # the reading that crossed the threshold, or the redeploy call
    serving_s: float  # from `started` to the first answer from the moved model
    answers: list[Answer]  # those in flight between `started` and that first answer
    detected_s: float | None = None  # from the VRAM change to the reading that saw it

    @property
    def failed(self) -> int:
        return sum(1 for a in self.answers if a.status != 200)

    @property
    def longest_wait_s(self) -> float:
        return max((a.ended - a.sent for a in self.answers), default=0.0)


class Load:
    """Closed-loop clients in the background; each answer kept with its wall-clock times."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[Answer] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _client(self, session: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            sent = time.time()
            try:
                reply = await session.post(self.url, json=BODY)
                status, backend = reply.status_code, reply.headers.get("x-backend", "")
            except httpx.HTTPError:
                status, backend = TRANSPORT_ERROR, ""
            self.answers.append(Answer(sent, time.time(), status, backend))
            await asyncio.sleep(PAUSE_S)

    async def __aenter__(self) -> Load:
        self._session = httpx.AsyncClient(timeout=MOVE_TIMEOUT_S)
        self._tasks = [asyncio.create_task(self._client(self._session)) for _ in range(CLIENTS)]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.aclose()

    def between(self, start: float, end: float) -> list[Answer]:
        return [a for a in self.answers if a.ended >= start and a.sent <= end]

    async def first_answer(self, after: float, backend: str | None = None) -> float:
        """When the first successful answer (from `backend`) ending after `after` ended."""
        deadline = time.monotonic() + MOVE_TIMEOUT_S
        while time.monotonic() < deadline:
            ends = [
                a.ended
                for a in self.answers
                if a.status == 200 and a.ended >= after and backend in (None, a.backend)
            ]
            if ends:
                return min(ends)
            await asyncio.sleep(0.5)
        raise TimeoutError(f"no answer from {backend or 'the model'} in {MOVE_TIMEOUT_S} s")


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + MOVE_TIMEOUT_S
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"timed out after {MOVE_TIMEOUT_S} s waiting for {what}")


class Stage:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 4})
        self.local = self.nodes.add_node(num_cpus=1, resources={"pool_local": 1}).node_id
        self.cloud = self.nodes.add_node(num_cpus=1, resources={"pool_cloud": 1}).node_id
        ray.init(address=self.nodes.address, namespace=SERVE_NAMESPACE)
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        self.probes = start_probes(SERVE_NAMESPACE)
        self.report_free(PLENTY_GB, PLENTY_GB)

    def report_free(self, local_gb: float, cloud_gb: float) -> None:
        for node, free_gb in ((self.local, local_gb), (self.cloud, cloud_gb)):
            ray.get(self.probes[node].inject.remote(NodeReading.rehearsal(node, free_gb).to_json()))

    def stop(self) -> None:
        serve.shutdown()
        ray.shutdown()
        self.nodes.shutdown()


async def gateway_status(session: httpx.AsyncClient) -> dict[str, Any]:
    reply: dict[str, Any] = (await session.get("/v1/cluster/status")).json()
    return reply


async def measure_gateway(stage: Stage) -> list[Move]:
    serve.run(build_app(stage.config), name=GATEWAY_APP, route_prefix="/")
    base = f"http://127.0.0.1:{PORT}"
    moves = []
    async with (
        httpx.AsyncClient(base_url=base, timeout=30) as session,
        Load(f"{base}/v1/chat/completions") as load,
    ):
        await load.first_answer(0.0, LOCAL)
        for direction, local_gb, source, target in (
            ("out", SCARCE_GB, LOCAL, CLOUD),
            ("back", PLENTY_GB, CLOUD, LOCAL),
        ):
            done_before = len((await gateway_status(session))["moves"])
            injected = time.time()
            stage.report_free(local_gb, PLENTY_GB)

            async def moved(source: str = source, done_before: int = done_before) -> bool:
                status = await gateway_status(session)
                return (
                    len(status["moves"]) > done_before
                    and status["backends"][source]["state"] == "parked"
                )

            await until(moved, f"{ROLE} to move {direction}")
            record = (await gateway_status(session))["moves"][-1]
            if record["outcome"] != "done":
                raise RuntimeError(f"the move was {record['outcome']}: {record}")
            first = await load.first_answer(record["read_at"], target)
            moves.append(
                Move(
                    "gateway",
                    direction,
                    record["read_at"],
                    first - record["read_at"],
                    load.between(record["read_at"], first),
                    record["read_at"] - injected,
                )
            )
    serve.delete(GATEWAY_APP)
    # The detached placement actor outlives the app: it must not take CPU from the anchor's run.
    ray.kill(ray.get_actor(f"{PLACER_NAME}:{GATEWAY_APP}", namespace=SERVE_NAMESPACE))
    return moves


def anchor_app(config: ClusterConfig, pool: str) -> Any:
    """Bare ray.serve.llm serving the model on `pool`, under one deployment name for both pools,
    so that changing the pool is an update of that deployment."""
    backend = next(b for b in config.backends if b.name == f"{ROLE}@{pool}")
    llm_config = llm_config_for(config, backend, placed=False)
    llm_config.deployment_config["name"] = ROLE
    return build_openai_app({"llm_configs": [llm_config]})


async def measure_anchor(stage: Stage) -> list[Move]:
    url = f"http://127.0.0.1:{PORT}/{stack.ANCHOR_APP}/v1/chat/completions"
    route = f"/{stack.ANCHOR_APP}"
    serve.run(anchor_app(stage.config, "local"), name=stack.ANCHOR_APP, route_prefix=route)
    moves = []
    async with Load(url) as load:
        await load.first_answer(0.0)
        for direction, pool in (("out", "cloud"), ("back", "local")):
            started = time.time()
            app = anchor_app(stage.config, pool)
            await asyncio.to_thread(serve.run, app, name=stack.ANCHOR_APP, route_prefix=route)
            running = time.time()
            first = await load.first_answer(running)
            moves.append(
                Move(
                    "ray.serve.llm",
                    direction,
                    started,
                    first - started,
                    load.between(started, first),
                )
            )
    serve.delete(stack.ANCHOR_APP)
    return moves


def report(moves: list[Move]) -> bool:
    print(
        "| path | move | VRAM change seen after (s) | to serving on the new pool (s) "
        "| ratio to anchor | requests during the move | failed | longest wait (s) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    anchor = {m.direction: m for m in moves if m.path == "ray.serve.llm"}
    for move in moves:
        base = anchor.get(move.direction)
        ratio = f"{move.serving_s / base.serving_s:.2f}" if base else "-"
        print(
            f"| {move.path} | {move.direction} "
            f"| {'-' if move.detected_s is None else f'{move.detected_s:.1f}'} "
            f"| {move.serving_s:.1f} | {ratio} "
            f"| {len(move.answers)} | {move.failed} | {move.longest_wait_s:.1f} |"
        )
    gateway = [m for m in moves if m.path == "gateway"]
    met = len(gateway) == 2 and all(m.failed == 0 for m in gateway)
    print(f"\ntarget (gateway: both moves done, 0 requests failed): {'met' if met else 'NOT met'}")
    return met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stage = Stage(stack.load(CONFIG))
    try:
        moves = asyncio.run(measure_gateway(stage))
        stage.report_free(PLENTY_GB, PLENTY_GB)
        moves += asyncio.run(measure_anchor(stage))
    finally:
        stage.stop()
    sys.exit(0 if report(moves) else 1)


if __name__ == "__main__":
    main()
