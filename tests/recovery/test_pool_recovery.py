"""A pool's node dies; the cluster manager drains the pool, has it replaced and brings it back.

A Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`: a head, a node with
`pool_local`, a node with `pool_cloud`), real demo-model replicas: reasoning is home on cloud
with a chain to local (recovery.yaml). While a steady stream of whole and streamed requests
runs, the cloud node's processes are killed with SIGKILL (no clean `ray stop`). The pool must
be draining within `dead_after_s` plus the GCS's own detection and one interval; no whole request
may fail; the `command` provisioner (start_node.py) starts a real replacement node; the pool is
healthy again, GPU_RECOVERED is recorded, and reasoning serves on cloud again.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import serve
from ray._private import state as gcs_state  # the GCS's actor table: no dashboard needed
from ray.cluster_utils import Cluster

from autoscale.cluster_manager import recovery_policy
from bench.multinode import (
    Stream,
    alive_pool_node,
    cluster_status,
    kill_started_nodes,
    report_free,
    wait_for,
)
from cluster.app import build_app
from core.config import load_config
from tests.local_ray import start_retrying

CONFIG = Path(__file__).with_name("recovery.yaml")
PORT = 18650
NAMESPACE = "serve"
CLOUD, LOCAL = "reasoning@cloud", "reasoning@local"
# Ray's GCS calls a node dead after its health checks fail (about 15 s by default), and the
# manager's probe of it fails as soon as its processes are gone; either starts the clock.
GCS_DETECTION_S = 30


def three_nodes() -> tuple[Cluster, Any, Any]:
    """A head and the two pools' nodes on this machine. The head has no dashboard: its ten
    processes start beside the head's raylet, whose dashboard agent must write its port within
    Ray's fixed 15 s, and beside the shared app the agent missed it on every try (run of
    1d8f684: 35 s and 70 s). Nothing here needs it: the actors are read from the GCS."""
    nodes = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    local = nodes.add_node(num_cpus=1, resources={"pool_local": 1})
    cloud = nodes.add_node(num_cpus=1, resources={"pool_cloud": 1})
    return nodes, local, cloud


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pids = tmp_path_factory.mktemp("recovery") / "node-pids"
    # Inherited by the raylets and so by the cluster manager, which runs the provisioner.
    os.environ["GPS_TEST_NODE_PIDS"] = str(pids)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    nodes, local, cloud = start_retrying(three_nodes)
    ray.init(address=nodes.address, namespace=NAMESPACE)
    # The HTTP proxy is the front door too: on the head only, never on a node that can die
    # (with one per node, the cloud node's proxy takes its share of connections down with it).
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": PORT})
    report_free(NAMESPACE, local.node_id, 30)
    report_free(NAMESPACE, cloud.node_id, 40)
    serve.run(build_app(load_config(CONFIG, environ={})), name="recovered", route_prefix="/")
    yield {"nodes": nodes, "cloud": cloud, "local": local, "pids": pids}
    serve.shutdown()
    ray.shutdown()
    kill_started_nodes(pids)
    nodes.shutdown()
    del os.environ["GPS_TEST_NODE_PIDS"]


def started_nodes_log(pids: Path) -> str:
    """The tail of what the provisioner's `ray start`s printed (tests/recovery/start_node.py)."""
    try:
        lines = pids.with_suffix(".log").read_text(errors="replace").splitlines()
    except OSError as error:
        return f"no provisioner log: {error}"
    return "provisioner log: " + " | ".join(lines[-15:])


def pool(name: str) -> dict[str, Any]:
    reply: dict[str, Any] = cluster_status(PORT)["pools"][name]
    return reply


def event(kind: str) -> dict[str, Any] | None:
    return next((e for e in cluster_status(PORT)["events"] if e["type"] == kind), None)


def test_the_gateway_stands_on_the_head_node(cluster: dict[str, Any]) -> None:
    """Ingress (with the router in it), placement actor, cluster manager and fallback: none on a
    pool's node."""
    head = cluster["nodes"].head_node.node_id
    gateway_classes = ("ingress", "Placer", "ClusterManager", "cpu-fallback")

    def gateway_actors() -> dict[str, str]:
        return {
            a["ActorClassName"]: a["Address"]["NodeID"]
            for a in gcs_state.actors(actor_state_name="ALIVE").values()
            if any(part in a["ActorClassName"] for part in gateway_classes)
        }

    # The ingress starts the cluster manager once it serves: it may be a moment behind the app.
    wait_for(lambda: len(gateway_actors()) >= 4, 60, "the gateway's four kinds of actor")
    placed = gateway_actors()
    assert set(placed.values()) == {head}, placed


def test_a_dead_pool_is_drained_replaced_and_serves_again(cluster: dict[str, Any]) -> None:
    config = load_config(CONFIG, environ={})
    settings = config.cluster_manager
    assert cluster_status(PORT)["placements"] == {CLOUD: "cloud"}
    wait_for(lambda: pool("cloud")["nodes"] != [], 60, "the manager to see the cloud node")
    assert pool("cloud")["state"] == "healthy"
    with Stream(PORT, "reasoning") as stream:
        wait_for(lambda: stream.first_from(CLOUD, 0) is not None, 120, "answers from cloud")
        killed_wall, killed = time.time(), time.monotonic()
        cluster["nodes"].remove_node(cluster["cloud"], allow_graceful=False)  # SIGKILL

        wait_for(lambda: event("POOL_DRAINING") is not None, 120, "the pool to be drained")
        draining = event("POOL_DRAINING")
        assert draining is not None
        detected_s = draining["at"] - killed_wall
        wait_for(lambda: stream.first_from("cpu-fallback", killed) is not None, 60, "fallback")
        first_fallback_s = (stream.first_from("cpu-fallback", killed) or 0) - killed

        try:
            wait_for(
                lambda: alive_pool_node("cloud", cluster["cloud"].node_id) is not None,
                # The manager's own bound on replacing a node, and a look's interval to see it.
                recovery_policy(config, "cloud").replacement_budget_s() + settings.interval_s,
                "a new node",
            )
        except TimeoutError as timeout:
            raise TimeoutError(f"{timeout}; {started_nodes_log(cluster['pids'])}") from None
        new_node = alive_pool_node("cloud", cluster["cloud"].node_id)
        assert new_node is not None
        report_free(NAMESPACE, new_node, 40)  # its "GPU" has room again: reasoning may go home
        wait_for(lambda: event("GPU_RECOVERED") is not None, 120, "GPU_RECOVERED")
        recovered = event("GPU_RECOVERED")
        assert recovered is not None
        assert pool("cloud")["state"] == "healthy"
        recovered_s = recovered["at"] - killed_wall

        back_from = time.monotonic()
        wait_for(lambda: stream.first_from(CLOUD, back_from) is not None, 480, "cloud again")
        home_s = time.monotonic() - killed
    whole_failed = [r for r in stream.failed() if not r[3]]
    streams_failed = [r for r in stream.failed() if r[3]]
    status = cluster_status(PORT)
    print(
        f"\nrecovery: detected (draining) {detected_s:.1f} s after the kill; first fallback "
        f"answer {first_fallback_s:.1f} s; GPU_RECOVERED {recovered_s:.1f} s; serving on cloud "
        f"again {home_s:.1f} s; {len(stream.results)} requests, whole failed "
        f"{len(whole_failed)}, streams broken {len(streams_failed)}; events "
        f"{[(e['type'], e['pool']) for e in status['events']]}; moves "
        f"{[(m['kind'], m['from'], m['to'], m['outcome']) for m in status['moves']]}"
    )
    assert detected_s <= settings.dead_after_s + settings.interval_s + GCS_DETECTION_S
    assert whole_failed == []
    types = [e["type"] for e in status["events"] if e["pool"] == "cloud"]
    assert types[:3] == ["POOL_UNHEALTHY", "POOL_DRAINING", "NODE_PROVISIONING"]
    assert "NODE_JOINED" in types
    assert types[-1] == "GPU_RECOVERED"
    # The placement actor began evacuating to local; it finished (and the model came home by a
    # restore) or, the cloud pool back first, gave the evacuation up.
    evacuations = [m for m in status["moves"] if m["kind"] == "evacuate"]
    assert [(m["from"], m["to"]) for m in evacuations] == [(CLOUD, LOCAL)]
    if evacuations[0]["outcome"] == "done":
        # A restore publishes its target before it scales the source down and records itself:
        # the answers from cloud may come before its record.
        wait_for(
            lambda: [m["kind"] for m in cluster_status(PORT)["moves"]][-1] == "restore",
            120,
            "the restore home to be recorded",
        )
    assert cluster_status(PORT)["placements"] == {CLOUD: "cloud"}
