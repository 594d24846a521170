"""The GCS goes and comes back, then the whole head is replaced, while clients are served.

A Ray cluster of three nodes on this machine whose GCS keeps its tables in a real Redis
(`RAY_REDIS_ADDRESS`, Ray's switch for `ray start`; KubeRay sets the same for a RayService with
`gcsFaultToleranceOptions`): the head (GCS, Serve's controller), a gateway node
(`gateway.resource`: the ingress with its router, the placement actor, the cluster manager, the
key ledger, the batch service, the CPU fallback, and a Serve proxy: `gateway.proxy_location:
EveryNode`) and a pool node (the model, a test engine). Clients send whole and streamed requests
in a closed loop to the gateway node's proxy, as they would through a load balancer in front of
the gateway nodes, with a metered key, while a batch runs.

1. `gcs_server` is SIGKILLed and started again on its port against the same Redis, as Ray's own
   fault-tolerance tests restart it (`Node.start_gcs_server`).
2. Every process of the head is SIGKILLed and a new head starts on the same address against the
   same Redis, as KubeRay restarts a head pod whose container ended.

Each time: no whole request lost and no stream broken; afterwards Serve's controller reports the
app running and the GCS schedules again, the gateway's actors and the model's replicas are the
incarnations they were, with their state: placements, pool states and events as before, the
key's spend grown by exactly what the clients were answered, the batch ended with every line once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
from ray import serve
from ray._private import state as gcs_state  # the GCS's actor table: no dashboard needed
from ray.cluster_utils import Cluster
from ray.serve.schema import ApplicationStatus

from bench.multinode import Stream, wait_for
from cluster.app import build_app
from cluster.ray_runtime import gcs_answers, start_serve
from core.config import ClusterConfig, load_config
from tests.batches import assert_every_line_once, completed, submit
from tests.local_ray import (
    haproxy_ports_of_node,
    start_retrying,
    stop_serve_and_ray,
    use_loaded_machine_settings,
)

CONFIG = Path(__file__).with_name("gcs.yaml")
NAMESPACE, APP = "serve", "gcs"
HEAD_PORT, GATEWAY_PORT, POOL_PORT = 18760, 18761, 18762
REDIS_PORT = 18763
# Serve binds a worker node's proxy to this port instead of the head's (Ray 2.60): on one
# machine each node's proxy needs a port of its own, and the clients use the gateway node's.
WORKER_PROXY_PORT = "RAY_SERVE_WORKER_PROXY_HTTP_PORT"
HEAD_ARGS: dict[str, Any] = {"num_cpus": 1, "include_dashboard": False}
# A worker raylet exits when the GCS is away longer than this (Ray's default 60 s; KubeRay gives
# worker pods 600 with GCS fault tolerance): a new head's start, retried on a loaded machine
# (tests/local_ray.py), may take longer than 60 s.
RECONNECT_VARIABLE, RECONNECT_S = "RAY_gcs_rpc_server_reconnect_timeout_s", 600
ADMIN = {"Authorization": "Bearer gcs-test-admin-key"}  # gcs.yaml's `ops`
LOAD = {"Authorization": "Bearer gcs-test-load-key"}  # gcs.yaml's `load`
# Long enough that the data plane visibly serves without a GCS, well inside the raylets' 60 s
# reconnect window (RAY_gcs_rpc_server_reconnect_timeout_s), past which they exit.
OUTAGE_S = 10.0
# Seconds for the GCS to load its tables again and Serve's controller to report (measured here:
# a few); generous for a loaded 2-core machine.
CONTROL_TIMEOUT_S = 180.0
LINES = 120  # a batch that is still running when the GCS goes (6 tokens a line at 0.05 s each)
GATEWAY_ACTORS = ("ingress", "cpu-fallback", "Placer", "ClusterManager", "KeyLedger", "BatchActor")


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A real Redis on REDIS_PORT that keeps nothing on disk: it outlives the heads, which is
    all GCS fault tolerance asks of it here."""
    process = subprocess.Popen(
        ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: redis_answers(REDIS_PORT), 30, "redis-server")
        yield f"127.0.0.1:{REDIS_PORT}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def redis_answers(port: int) -> bool:
    reply = subprocess.run(
        ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False
    )
    return reply.stdout.strip() == "PONG"


def three_nodes() -> Cluster:
    nodes = Cluster(initialize_head=True, head_node_args=HEAD_ARGS)
    pools = {"pool_local": 1, "pool_cloud": 1}  # gcs.yaml says why both
    nodes_here = (({"gateway": 1}, 2, GATEWAY_PORT), (pools, 1, POOL_PORT))
    for index, (resources, cpus, port) in enumerate(nodes_here, start=1):
        env = {
            WORKER_PROXY_PORT: str(port),
            RECONNECT_VARIABLE: str(RECONNECT_S),
            **haproxy_ports_of_node(index),
        }
        nodes.add_node(num_cpus=cpus, resources=resources, env_vars=env)
    return nodes


def shut_down(nodes: Cluster) -> None:
    """Serve and every node's processes, whatever state a failed test left the GCS in."""
    if nodes.head_node is not None and gcs_answers(nodes.address):
        with connected(nodes):
            stop_serve_and_ray()
    nodes.shutdown()


def gcs_config(folder: Path) -> ClusterConfig:
    """gcs.yaml with the batch store and the keys' file in the test's own folder."""
    return load_config(
        CONFIG,
        environ={},
        overrides={
            "batches": {"directory": str(folder / "batches")},
            "gateway": {"keys_db": str(folder / "keys.sqlite3")},
        },
    )


@contextmanager
def connected(nodes: Cluster) -> Iterator[None]:
    """A Ray connection for a look at the cluster, closed before anything is killed: a driver
    dies with the raylet it is attached to, and the test with it."""
    ray.init(address=nodes.address, namespace=NAMESPACE)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("gcs")
    use_loaded_machine_settings()
    with redis_server(folder) as redis, pytest.MonkeyPatch.context() as environment:
        environment.setenv("RAY_REDIS_ADDRESS", redis)  # read by every head this process starts
        started = start_retrying(three_nodes)
        try:
            config = gcs_config(folder)
            with connected(started):
                start_serve(config, http_options={"host": "127.0.0.1", "port": HEAD_PORT})
                serve.run(build_app(config), name=APP, route_prefix="/")
            wait_for(lambda: answers(GATEWAY_PORT), 120, "the gateway node's proxy")
            yield started
        finally:
            shut_down(started)


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def incarnations() -> dict[str, tuple[str, int, str]]:
    """Each gateway actor and model replica by actor id: (class, restarts, node)."""
    return {
        actor_id: (info["ActorClassName"], info["NumRestarts"], info["Address"]["NodeID"])
        for actor_id, info in gcs_state.actors(actor_state_name="ALIVE").items()
        if any(part in info["ActorClassName"] for part in (*GATEWAY_ACTORS, "coding"))
    }


def gateway_get(path: str) -> dict[str, Any]:
    """An admin's GET through the gateway node's proxy (the status reads Serve's controller)."""
    reply = httpx.get(f"http://127.0.0.1:{GATEWAY_PORT}{path}", headers=ADMIN, timeout=60)
    reply.raise_for_status()
    answer: dict[str, Any] = reply.json()
    return answer


def spent() -> int:
    tokens: int = gateway_get("/v1/keys/usage")["keys"]["load"]["total_tokens"]
    return tokens


def control_state(nodes: Cluster) -> dict[str, Any]:
    """What the control plane holds: its actors, the status the gateway reports, the spend."""
    with connected(nodes):
        actors = incarnations()
    status = gateway_get("/v1/cluster/status")
    return {
        "actors": actors,
        "placements": status["placements"],
        "pools": {name: pool["state"] for name, pool in status["pools"].items()},
        "events": status["events"],
        "spent": spent(),
    }


def client() -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{GATEWAY_PORT}/v1", api_key=ADMIN["Authorization"][7:],
        max_retries=0, timeout=60,
    )  # fmt: skip


def ping() -> int:
    return os.getpid()


def regain_control(nodes: Cluster) -> float:
    """Seconds until Serve's controller reports the app running and the GCS starts a new
    worker process (actor and task scheduling are what a GCS outage stops)."""
    started = time.monotonic()
    with connected(nodes):
        wait_for(
            lambda: serve.status().applications[APP].status == ApplicationStatus.RUNNING,
            CONTROL_TIMEOUT_S,
            "Serve's controller to report the app running",
        )
        ray.get(ray.remote(num_cpus=0)(ping).remote(), timeout=CONTROL_TIMEOUT_S)
    return time.monotonic() - started


def assert_state_kept(before: dict[str, Any], after: dict[str, Any], answered: int) -> None:
    assert after["actors"] == before["actors"]
    assert (after["placements"], after["pools"]) == (before["placements"], before["pools"])
    assert after["events"][: len(before["events"])] == before["events"]
    assert after["spent"] - before["spent"] == answered


def wait_until_booked(before: int, answered: int) -> None:
    """Until the replicas' last settlements reached the ledger (within a second); past 30 s the
    assertion that follows names both figures."""
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: spent() - before == answered, 30, "the ledger to book every answer")


def report(what: str, loads: list[Stream], down: float, up: float, control_s: float) -> None:
    results = [r for load in loads for r in load.results]
    during = [r for r in results if down <= r[0] <= up and r[1] == 200]
    print(
        f"\n{what}: {len(results)} requests from {len(loads)} clients, "
        f"{sum(len(load.failed()) for load in loads)} failed; while away ({up - down:.1f} s) "
        f"{len(during)} answered ({sum(1 for r in during if r[3])} streams); full control "
        f"{control_s:.1f} s after the restart"
    )


def survive(nodes: Cluster, take_down: Callable[[], None], bring_back: Callable[[], None],
            what: str) -> None:  # fmt: skip
    """`take_down()` while two clients are served and a batch runs, OUTAGE_S away,
    `bring_back()`: every request answered, full control back, the control plane's state
    kept."""
    batch = submit(client(), LINES)
    wait_for(lambda: completed(client(), batch) >= 5, 120, "the batch under way")
    before = control_state(nodes)
    with (
        Stream(GATEWAY_PORT, "coding", headers=LOAD) as first,
        Stream(GATEWAY_PORT, "coding", headers=LOAD) as second,
    ):
        loads = [first, second]
        down = time.monotonic()
        take_down()
        try:
            time.sleep(OUTAGE_S)
            done_while_away = completed(client(), batch)
        finally:
            bring_back()  # whatever failed: the next test and the teardown need a cluster
        assert done_while_away < LINES, f"the batch ended during the {what}: lengthen it"
        control_s = regain_control(nodes)
        up = time.monotonic()
        wait_for(lambda: min(load.results[-1][0] for load in loads) > up + 2, 60, "answers")
    report(what, loads, down, up, control_s)
    kinds = sorted(kind for kind, _, _ in before["actors"].values())
    print(
        f"kept: {kinds}, placements {before['placements']}, pools {before['pools']}, "
        f"{len(before['events'])} events, {before['spent']} tokens spent"
    )
    assert [load.failed() for load in loads] == [[], []]
    answered = sum(load.tokens for load in loads)
    wait_until_booked(before["spent"], answered)
    assert_state_kept(before, control_state(nodes), answered)
    assert_every_line_once(client(), batch, LINES)


def test_the_gateway_serves_through_a_gcs_restart_and_keeps_its_state(nodes: Cluster) -> None:
    head = nodes.head_node
    [gcs] = head.all_processes["gcs_server"]

    def restart_gcs() -> None:
        head.kill_gcs_server(check_alive=False)  # reaps the killed one, forgets its address
        head.start_gcs_server()  # on its port, against the same Redis

    survive(nodes, lambda: os.kill(gcs.process.pid, signal.SIGKILL), restart_gcs, "GCS restart")


def test_the_gateway_serves_while_the_head_is_replaced_and_keeps_its_state(
    nodes: Cluster,
) -> None:
    head = nodes.head_node
    workers = {node.node_id for node in nodes.worker_nodes}
    gcs_port = int(head.gcs_address.rpartition(":")[2])

    def kill_head() -> None:
        # Not Cluster.remove_node: it would also delete the GCS's tables from Redis.
        head.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        nodes.head_node = None

    def new_head() -> None:
        start_retrying(lambda: nodes.add_node(**HEAD_ARGS, gcs_server_port=gcs_port))

    survive(nodes, kill_head, new_head, "head replacement")
    with connected(nodes):
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert workers <= alive, "a worker node did not rejoin the new head"
