"""A pool's node dies: time to detect it, to answer from elsewhere, and to serve there again.

A Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`: a head, a node with
`pool_local`, a node with `pool_cloud`); the reasoning model is home on the cloud pool with a
chain to local (bench/recovery.yaml). Two clients send short whole requests in a closed loop.
The cloud node's processes are killed with SIGKILL.

- Gateway: the cluster manager declares the pool dead (`POOL_DRAINING`), the router sends its
  work down the chain, the placement actor evacuates the model to local, the `command`
  provisioner starts a replacement node (tests/recovery/start_node.py: a real `ray start`), the
  pool is healthy again (`GPU_RECOVERED`) and the model goes home (restore). Measured from the
  kill: detection, the first answer from another backend, GPU_RECOVERED, and serving on cloud
  again; the last split into provisioning (asked to joined), the restore move (the new engine's
  start) and what is left (overhead: waits of our own). Requests lost: failed whole requests.
- Anchor: bare `ray.serve.llm` serving the model on the cloud pool, the same node killed. Serve
  restarts the replica only once a node with the pool's resource appears, and nothing provisions
  one: measured over the same window, requests lost and the first answer after the kill.

Targets: detection <= 30 s, 0 whole requests lost, serving again within provisioning + engine
start + 15 s. Run with `make bench` (or `python -m bench.recovery`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve
from ray.cluster_utils import Cluster
from ray.serve.llm import build_openai_app

from autoscale.pool_states import manager_actor_name
from bench import stack
from bench.multinode import (
    STATUS_TIMEOUT_S,
    alive_pool_node,
    kill_started_nodes,
    report_free,
    wait_for,
)
from cluster.app import build_app
from cluster.backends import llm_config_for
from cluster.ray_runtime import SERVE_NAMESPACE
from core.config import ClusterConfig

CONFIG = Path(__file__).with_name("recovery.yaml")
PORT = 18750
ROLE = "reasoning"
CLOUD = f"{ROLE}@cloud"
GATEWAY_APP = "recovered"
BODY = {"model": ROLE, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 8}
CLIENTS = 2
PAUSE_S = 0.25
TIMEOUT_S = 600.0
ANCHOR_WINDOW_S = 120.0  # how long the anchor is watched after the kill
DETECTION_TARGET_S = 30.0
OVERHEAD_TARGET_S = 15.0


@dataclass(frozen=True)
class Answer:
    sent: float  # wall clock, as the manager's events are
    ended: float
    status: int
    backend: str


class Load:
    """Closed-loop clients in a thread of their own; each answer with its wall-clock times."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[Answer] = []
        self.waiting = 0  # requests sent and not answered yet
        self._stop = False

    async def _client(self, session: httpx.AsyncClient) -> None:
        while not self._stop:
            sent = time.time()
            self.waiting += 1
            try:
                reply = await session.post(self.url, json=BODY)
                status, backend = reply.status_code, reply.headers.get("x-backend", "")
            except httpx.HTTPError:
                status, backend = 0, ""
            finally:
                self.waiting -= 1
            self.answers.append(Answer(sent, time.time(), status, backend))
            await asyncio.sleep(PAUSE_S)

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as session:
            await asyncio.gather(*(self._client(session) for _ in range(CLIENTS)))

    def stop(self) -> None:
        self._stop = True

    def first(
        self, after: float, backend: str | None = None, other_than: str | None = None
    ) -> float:
        ends = [
            a.ended
            for a in self.answers
            if a.status == 200
            and a.sent >= after
            and backend in (None, a.backend)
            and (other_than is None or a.backend != other_than)
        ]
        return min(ends) if ends else float("nan")

    def answered(self, after: float, backend: str | None = None) -> bool:
        return not math.isnan(self.first(after, backend))

    def failed(self, after: float, before: float = float("inf")) -> int:
        return sum(1 for a in self.answers if a.status != 200 and after <= a.ended <= before)

    def count(self, after: float, before: float = float("inf")) -> int:
        return sum(1 for a in self.answers if after <= a.ended <= before)


@dataclass(frozen=True)
class Outcome:
    path: str
    detected_s: float | None  # kill -> POOL_DRAINING
    first_elsewhere_s: float | None  # kill -> first answer (from another backend, or at all)
    recovered_s: float | None  # kill -> GPU_RECOVERED
    serving_s: float | None  # kill -> first answer from the pool again
    provisioning_s: float | None = None  # provisioner asked -> node joined
    engine_start_s: float | None = None  # the restore move (raise, wait healthy, switch)
    requests: int = 0
    failed: int = 0

    @property
    def overhead_s(self) -> float | None:
        parts = (self.serving_s, self.detected_s, self.provisioning_s, self.engine_start_s)
        if any(p is None for p in parts):
            return None
        serving, detected, provisioning, engine = (p or 0.0 for p in parts)
        return serving - detected - provisioning - engine


class Stage:
    """The three-node cluster; start_node.py nodes are killed with it."""

    def __init__(self) -> None:
        self.pids = Path(tempfile.mkdtemp(prefix="gps-recovery-")) / "node-pids"
        os.environ["GPS_TEST_NODE_PIDS"] = str(self.pids)
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        self.nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 4})
        self.local = self.nodes.add_node(num_cpus=1, resources={"pool_local": 1})
        self.cloud = self.nodes.add_node(num_cpus=1, resources={"pool_cloud": 1})
        ray.init(address=self.nodes.address, namespace=SERVE_NAMESPACE)
        # The HTTP proxy is the front door too: on the head only, never on a node that can die
        # (with one per node, the cloud node's proxy takes its share of connections down with it).
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": PORT})
        report_free(SERVE_NAMESPACE, self.local.node_id, 30)
        report_free(SERVE_NAMESPACE, self.cloud.node_id, 40)

    def kill_cloud(self) -> float:
        killed = time.time()
        self.nodes.remove_node(self.cloud, allow_graceful=False)
        return killed

    def new_cloud(self) -> None:
        """A fresh cloud node for the anchor, the only one: the provisioner's nodes go."""
        kill_started_nodes(self.pids)
        self.cloud = self.nodes.add_node(num_cpus=1, resources={"pool_cloud": 1})
        report_free(SERVE_NAMESPACE, self.cloud.node_id, 40)

    def stop(self) -> None:
        serve.shutdown()
        ray.shutdown()
        kill_started_nodes(self.pids)
        self.nodes.shutdown()


def gateway_status() -> dict[str, Any]:
    url = f"http://127.0.0.1:{PORT}/v1/cluster/status"
    reply: dict[str, Any] = httpx.get(url, timeout=STATUS_TIMEOUT_S).json()
    return reply


def event_at(kind: str) -> float | None:
    return next(
        (e["at"] for e in gateway_status()["events"] if e["type"] == kind and e["pool"] == "cloud"),
        None,
    )


async def measure_gateway(stage: Stage, config: ClusterConfig) -> Outcome:
    serve.run(build_app(config), name=GATEWAY_APP, route_prefix="/")
    load = Load(f"http://127.0.0.1:{PORT}/v1/chat/completions")
    clients = asyncio.create_task(load.run())
    await asyncio.to_thread(wait_for, lambda: load.answered(0, CLOUD), 120, "answers")
    old = stage.cloud.node_id
    killed = stage.kill_cloud()

    def joined() -> bool:
        node = alive_pool_node("cloud", old)
        if node is None:
            return False
        report_free(SERVE_NAMESPACE, node, 40)  # its "GPU" has room: the model may go home
        return True

    await asyncio.to_thread(wait_for, joined, TIMEOUT_S, "a replacement node")
    await asyncio.to_thread(
        wait_for, lambda: event_at("GPU_RECOVERED") is not None, TIMEOUT_S, "GPU_RECOVERED"
    )
    back = event_at("GPU_RECOVERED") or killed  # answers from cloud before it were in flight
    await asyncio.to_thread(
        wait_for, lambda: load.answered(back, CLOUD), TIMEOUT_S, "the model back on cloud"
    )
    end = load.first(back, CLOUD)
    load.stop()
    await clients
    status = gateway_status()
    asked, joined_at = event_at("NODE_PROVISIONING"), event_at("NODE_JOINED")
    drained, recovered = event_at("POOL_DRAINING"), event_at("GPU_RECOVERED")
    serve.delete(GATEWAY_APP)
    for name in (manager_actor_name(GATEWAY_APP), f"gps-placement:{GATEWAY_APP}"):
        ray.kill(ray.get_actor(name, namespace=SERVE_NAMESPACE))
    return Outcome(
        "gateway",
        detected_s=None if drained is None else drained - killed,
        first_elsewhere_s=load.first(killed, other_than=CLOUD) - killed,
        recovered_s=None if recovered is None else recovered - killed,
        serving_s=end - killed,
        provisioning_s=None if asked is None or joined_at is None else joined_at - asked,
        engine_start_s=engine_start(status["moves"], end),
        requests=load.count(killed, end),
        failed=load.failed(killed, end),
    )


def engine_start(moves: list[dict[str, Any]], serving_at: float) -> float | None:
    """How long the model took to start on the cloud pool again: the restore move (raise,
    wait healthy, switch), or, where the evacuation was given up because the pool came back
    first, from the source asked for its replicas again to its first answer."""
    restore = next((m for m in moves if m["kind"] == "restore"), None)
    if restore is not None:
        return float(restore["seconds"])
    given_up = next((m for m in moves if m["kind"] == "evacuate"), None)
    if given_up is None or given_up["outcome"] != "abandoned":
        return None
    return serving_at - (float(given_up["at"]) + float(given_up["seconds"]))


def anchor_app(config: ClusterConfig) -> Any:
    backend = next(b for b in config.backends if b.name == CLOUD)
    return build_openai_app({"llm_configs": [llm_config_for(config, backend, placed=False)]})


async def measure_anchor(stage: Stage, config: ClusterConfig) -> Outcome:
    route = f"/{stack.ANCHOR_APP}"
    serve.run(anchor_app(config), name=stack.ANCHOR_APP, route_prefix=route)
    load = Load(f"http://127.0.0.1:{PORT}{route}/v1/chat/completions")
    clients = asyncio.create_task(load.run())
    await asyncio.to_thread(wait_for, lambda: load.answered(0), 120, "an answer")
    killed = stage.kill_cloud()
    await asyncio.sleep(ANCHOR_WINDOW_S)
    load.stop()
    stuck = load.waiting  # still without an answer at the window's end: lost as well
    clients.cancel()
    await asyncio.gather(clients, return_exceptions=True)
    first = load.first(killed)
    serve.delete(stack.ANCHOR_APP)
    return Outcome(
        "ray.serve.llm",
        detected_s=None,
        first_elsewhere_s=None if math.isnan(first) else first - killed,
        recovered_s=None,
        serving_s=None if math.isnan(first) else first - killed,
        requests=load.count(killed) + stuck,
        failed=load.failed(killed) + stuck,
    )


def _s(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def report(outcomes: list[Outcome]) -> bool:
    print(
        "| path | detected (s) | first answer elsewhere (s) | GPU_RECOVERED (s) | serving on "
        "the pool again (s) | provisioning (s) | engine start (s) | overhead (s) | requests "
        "| lost |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for o in outcomes:
        print(
            f"| {o.path} | {_s(o.detected_s)} | {_s(o.first_elsewhere_s)} | {_s(o.recovered_s)} "
            f"| {_s(o.serving_s)} | {_s(o.provisioning_s)} | {_s(o.engine_start_s)} "
            f"| {_s(o.overhead_s)} | {o.requests} | {o.failed} |"
        )
    anchor = next((o for o in outcomes if o.path == "ray.serve.llm"), None)
    if anchor is not None:
        print(
            f"\nanchor: {anchor.failed} of {anchor.requests} requests lost in the "
            f"{ANCHOR_WINDOW_S:.0f} s after the kill; first answer after it: "
            f"{_s(anchor.first_elsewhere_s)} s"
        )
    gateway = next(o for o in outcomes if o.path == "gateway")
    overhead = gateway.overhead_s
    met = (
        gateway.detected_s is not None
        and gateway.detected_s <= DETECTION_TARGET_S
        and gateway.failed == 0
        and overhead is not None
        and overhead <= OVERHEAD_TARGET_S
    )
    print(
        f"target (detected <= {DETECTION_TARGET_S:.0f} s, 0 lost, overhead <= "
        f"{OVERHEAD_TARGET_S:.0f} s): {'met' if met else 'NOT met'}"
    )
    return met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = stack.load(CONFIG)
    stage = Stage()
    try:
        outcomes = [asyncio.run(measure_gateway(stage, config))]
        print(f"gateway: {outcomes[0]}", flush=True)  # kept if the anchor's run fails
        stage.new_cloud()
        outcomes.append(asyncio.run(measure_anchor(stage, config)))
    finally:
        stage.stop()
    sys.exit(0 if report(outcomes) else 1)


if __name__ == "__main__":
    main()
