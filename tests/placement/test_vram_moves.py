"""Placement on a multi-node Ray cluster on this machine, with real demo-model replicas.

Nodes carry `pool_local` and `pool_cloud` (`ray.cluster_utils.Cluster`); this machine has no GPU,
so the test injects VRAM readings through the probes' own interface (`VramProbe.inject`). A
drop on the local pool moves the reasoning model to the cloud pool while a steady request stream
runs; recovery brings it back after the away time. No request may fail; each move is timed. The
routers of both ingress replicas must follow each move, and a restart of the placement actor
between the moves must change nothing. On the same two ingress replicas, a stored response is
continued (`previous_response_id`) and read back through either of them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from autoscale.placer import PLACER_NAME
from bench import multinode
from bench.multinode import Stream, cluster_status, wait_for
from cluster.app import build_app
from core.config import load_config
from tests.local_ray import start_retrying

CONFIG = Path(__file__).with_name("placed.yaml")
PORT = 18600
NAMESPACE = "serve"
LOCAL, CLOUD = "reasoning@local", "reasoning@cloud"


def three_nodes() -> tuple[Cluster, Any, Any]:
    """A head and the two pools' nodes on this machine."""
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local = nodes.add_node(num_cpus=1, resources={"pool_local": 1})
    cloud = nodes.add_node(num_cpus=1, resources={"pool_cloud": 1})
    return nodes, local, cloud


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    nodes, local, cloud = start_retrying(three_nodes)
    ray.init(address=nodes.address, namespace=NAMESPACE)
    # The front door on the head only, as in tests/recovery: on one machine every node's proxy
    # shares the port (SO_REUSEPORT), and Serve stops the proxy of a node a move leaves without
    # replicas, taking the connections the kernel gave it down with it (a stream failed so).
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": PORT})
    ids = {"local": local.node_id, "cloud": cloud.node_id, "head": nodes.head_node.node_id}
    ids["logs"] = nodes.head_node.get_logs_dir_path()  # every node's: one machine, one session
    # Before the app starts: both pools with plenty of VRAM, the head with no GPU.
    report_free(ids["local"], 30)
    report_free(ids["cloud"], 40)
    serve.run(build_app(load_config(CONFIG, environ={})), name="placed", route_prefix="/")
    yield ids
    serve.shutdown()
    ray.shutdown()
    nodes.shutdown()


def answers(actor: Any) -> bool:
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=10)
    except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
        return False  # still restarting
    return True


def every_router_places(backend: str, pool: str) -> bool:
    """Each status call reaches one of the two ingress replicas (each with its own router), picked
    at random: 16 calls miss
    one of them with odds of 1 in 32768."""
    return all(status()["placements"] == {backend: pool} for _ in range(16))


def status() -> dict[str, Any]:
    return cluster_status(PORT)


def report_free(node: str, free_gb: float) -> None:
    """The node's probe reports `free_gb` free from now on."""
    multinode.report_free(NAMESPACE, node, free_gb)


def move_by_vram(stream: Stream, node: str, free_gb: float, target: str, source: str) -> float:
    """Report `free_gb` on `node`; wait until `target` answers, `source` is parked and every
    router replica places the role on `target`. Seconds from the report to that first answer."""
    reported = time.monotonic()
    report_free(node, free_gb)
    wait_for(lambda: stream.first_from(target, reported) is not None, 420, target)
    seconds = (stream.first_from(target, reported) or 0) - reported
    wait_for(lambda: status()["backends"][source]["state"] == "parked", 120, f"{source} parked")
    assert every_router_places(target, target.split("@")[1])
    return seconds


def test_a_vram_drop_moves_reasoning_to_the_cloud_and_recovery_brings_it_back(
    cluster: dict[str, str],
) -> None:
    assert status()["placements"] == {LOCAL: "local"}
    assert status()["backends"][CLOUD]["state"] == "parked"
    with Stream(PORT, "reasoning") as stream:
        wait_for(lambda: len(stream.results) >= 4, 60, "the stream to start")
        out_s = move_by_vram(stream, cluster["local"], 2, CLOUD, LOCAL)

        # The placement actor dies and Ray restarts it: it carries on from the cloud (the
        # placements it recorded), it does not send the model home at once.
        placer = ray.get_actor(f"{PLACER_NAME}:placed", namespace=NAMESPACE)
        ray.kill(placer, no_restart=False)
        wait_for(lambda: answers(placer), 120, "the placement actor to be back")
        time.sleep(3)  # several router syncs, each of which gets the restarted actor's view
        assert every_router_places(CLOUD, "cloud")
        assert status()["backends"][LOCAL]["state"] == "parked"

        back_s = move_by_vram(stream, cluster["local"], 30, LOCAL, CLOUD)
    failed = stream.failed()
    moves = status()["moves"]
    print(
        f"\nmove out: {out_s:.1f} s from the drop to the first answer on cloud; move back: "
        f"{back_s:.1f} s from recovery to the first answer on local; {len(stream.results)} "
        f"requests, {len(failed)} failed; moves: "
        f"{[(m['kind'], m['from'], m['to'], m['outcome'], m['seconds']) for m in moves]}"
    )
    assert failed == []
    assert [(m["kind"], m["outcome"]) for m in moves] == [("offload", "done"), ("restore", "done")]
    served = [b for _, _, b, _ in stream.results]
    assert served[0] == LOCAL
    assert CLOUD in served
    assert served[-1] == LOCAL


def ingress_replicas(logs: str) -> dict[str, str]:
    """Which ingress replica answered each request, by Serve's request id (`x-request-id`):
    the access lines in the workers' stderr files, or in Serve's own replica log files under
    the throughput mode, which writes none to stderr (the tests have the replicas write each
    line at once, RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE=1, which the front's options pass on)."""
    access = re.compile(r"placed_ingress (\w+) ([\w-]+) -- ")
    answered: dict[str, str] = {}
    folder = Path(logs)
    for log in (*folder.glob("worker-*.err"), *folder.glob("serve/replica_placed_ingress_*.log")):
        for replica, request in access.findall(log.read_text(errors="replace")):
            answered[request] = replica
    return answered


def posted(client: httpx.Client, body: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    reply = client.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json(), reply.headers["x-request-id"]


def test_a_stored_response_is_continued_and_read_through_either_ingress_replica(
    cluster: dict[str, str],
) -> None:
    """One keeper per app holds stored responses; each ingress replica reaches it. The proxy
    picks a replica per request, so 24 continuations all missing one of two replicas would
    take odds of 1 in 16 million: the replicas' access lines say which answered each."""
    body = {"model": "reasoning", "max_output_tokens": 4}
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
        first, first_request = posted(client, body | {"input": "My name is Ada."})
        requests = [first_request]
        for n in range(24):
            turn, request = posted(
                client, body | {"input": f"Turn {n}.", "previous_response_id": first["id"]}
            )
            assert turn["previous_response_id"] == first["id"]
            items = client.get(f"/v1/responses/{turn['id']}/input_items", params={"order": "asc"})
            assert items.status_code == 200, items.text
            texts = [p["text"] for i in items.json()["data"] for p in i.get("content", [])]
            # the first's input and answer, then this turn's input: three items
            assert (texts[0], texts[-1], len(items.json()["data"])) == (
                "My name is Ada.",
                f"Turn {n}.",
                3,
            )
            requests.append(request)
    # Serve writes a replica's access line when the answer is sent; give its file a moment.
    wait_for(
        lambda: set(requests) <= ingress_replicas(cluster["logs"]).keys(),
        30,
        "each request's access line from an ingress replica",
    )
    answered = ingress_replicas(cluster["logs"])
    assert len({answered[r] for r in requests}) == 2
