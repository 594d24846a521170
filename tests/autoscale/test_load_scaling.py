"""Load-driven autoscaling on a real Serve app: a queue brings a second replica, idleness takes
it away, and its engine process goes with it; longer idleness puts the backend to sleep at zero
replicas, and a request wakes it.

One Ray node carrying `pool_local` with three logical CPUs (each CPU engine replica reserves
one), the coding model capped at one request per replica. Five clients send requests without
pause: the router's queue for the backend passes the target of one per replica, the policy in
Serve's controller reads the routers' load from Ray's key-value store and asks for a second
replica; when the clients stop, the count goes back to one after the downscale delay. No
request may fail on the way, the router must count the decision, and once back at one replica
exactly one engine process may remain.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve

from autoscale.serve_scaling import read_scaled
from bench.multinode import Stream, wait_for
from cluster.app import build_app
from core.config import load_config
from tests.local_ray import start_retrying, stop_serve_and_ray
from tests.own_processes import own_engine_processes

CONFIG = Path(__file__).with_name("scaled.yaml")
PORT = 18700
APP = "scaled"
BACKEND = "coding@local"
DEPLOYMENT = f"model:{BACKEND}"
CLIENTS = 5
KEPT_ASLEEP_S = 20  # several of the router's KV readings (1 s) and load posts
ROUTER_SEES_S = 120  # for the router to read what Serve and the policy did (every few s)


@pytest.fixture(scope="module")
def app() -> Iterator[None]:
    start_retrying(
        lambda: ray.init(
            address="local", num_cpus=3, resources={"pool_local": 1}, namespace="serve"
        )
    )
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(load_config(CONFIG, environ={})), name=APP, route_prefix="/")
    yield
    stop_serve_and_ray()


def running_replicas() -> int:
    deployments = serve.status().applications[APP].deployments
    [name] = [d for d in deployments if d.endswith(BACKEND)]
    return int(deployments[name].replica_states.get("RUNNING", 0))


def metric(name: str, **labels: str) -> float:
    """A sample from the gateway's /metrics; 0 when it has none yet."""
    text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_counted(direction: str, what: str) -> None:
    """Until the router counts a decision of `direction`; past ROUTER_SEES_S, fail naming the
    policy's last published decision (which tells a decision never made from one never
    counted)."""
    try:
        wait_for(
            lambda: (
                metric("gps_autoscale_decisions_total", backend=BACKEND, direction=direction) >= 1
            ),
            ROUTER_SEES_S,
            what,
        )
    except TimeoutError as error:
        raise AssertionError(
            f"{error}; the last decision: {read_scaled(APP, DEPLOYMENT)}"
        ) from None


def test_a_queue_brings_a_second_replica_and_idleness_takes_it_away(app: None) -> None:
    assert running_replicas() == 1
    # Two clients hold a conversation each (X-Session-Id): the prefix router's session path
    # (deployments/router/adapters/replica_choice.py, on for a backend that may run two
    # replicas) while the second replica comes and goes; none of their requests may fail either.
    streams = [
        Stream(
            PORT,
            "coding",
            pause_s=0,
            headers={"X-Session-Id": f"conversation-{n}"} if n < 2 else None,
        )
        for n in range(CLIENTS)
    ]
    for stream in streams:
        stream.__enter__()
    try:
        up_s = wait_for(lambda: running_replicas() == 2, 300, "a second replica")
        # The router's slots follow the replicas (it reads their count every 5 s), so both
        # take work before the clients stop. Generous: beside the shared app (make test) a
        # read of Serve's status and of /metrics each took seconds, and 30 s ran out in CI's
        # run of e1ea599.
        wait_for(
            lambda: metric("gps_backend_replicas", backend=BACKEND) == 2,
            ROUTER_SEES_S,
            "the router to see both replicas",
        )
        time.sleep(10)
    finally:
        for stream in streams:
            stream.__exit__()
    down_s = wait_for(lambda: running_replicas() == 1, 180, "back to one replica")
    wait_for(lambda: len(own_engine_processes()) == 1, 60, "the removed replica's engine to exit")
    wait_counted("down", "the router to count the way down")
    results = [r for stream in streams for r in stream.results]
    failed = [r for stream in streams for r in stream.failed()]
    print(
        f"\nautoscaling: {len(results)} requests from {CLIENTS} clients, {len(failed)} failed; "
        f"second replica running {up_s:.1f} s after the load began, back to one {down_s:.1f} s "
        "after it ended"
    )
    assert failed == []
    assert metric("gps_autoscale_decisions_total", backend=BACKEND, direction="up") >= 1


def cluster_status() -> dict[str, Any]:
    reply = httpx.get(f"http://127.0.0.1:{PORT}/v1/cluster/status", timeout=30)
    return dict(reply.json())


def test_an_idle_backend_sleeps_at_zero_and_a_request_waits_for_it_to_wake(app: None) -> None:
    """Runs after the test above: the backend has been idle since its clients stopped."""
    slept_s = wait_for(lambda: running_replicas() == 0, 180, "the backend to sleep")
    wait_for(lambda: len(own_engine_processes()) == 0, 60, "the sleeping backend's engine to exit")
    wait_counted("sleep", "the router to count the sleep")
    wait_for(
        lambda: cluster_status()["backends"][BACKEND]["state"] == "asleep",
        30,
        "the router to see the backend asleep",
    )
    status = cluster_status()
    assert status["status"] == "ok"  # asleep on purpose: nothing is wrong
    assert status["backends"][BACKEND]["breaker"] == "closed"
    # It stays asleep: no call of the router's (a KV reading sent as the replica stopped)
    # waits in Serve's handle, which Serve would answer with a replica (its "cold start").
    time.sleep(KEPT_ASLEEP_S)
    woken = f"woken while idle; the last decision: {read_scaled(APP, DEPLOYMENT)}"
    assert running_replicas() == 0, woken
    assert len(own_engine_processes()) == 0, woken
    assert metric("gps_autoscale_decisions_total", backend=BACKEND, direction="wake") == 0

    body = {
        "model": "coding",
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 4,
    }
    started = time.monotonic()
    reply = httpx.post(f"http://127.0.0.1:{PORT}/v1/chat/completions", json=body, timeout=400)
    woke_s = time.monotonic() - started
    print(
        f"\nscale to zero: asleep {slept_s:.1f} s into this test, a request for it "
        f"answered {woke_s:.1f} s after it arrived"
    )
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-backend"] == BACKEND  # it waited for the backend, not the fallback
    assert reply.json()["choices"][0]["message"]["content"]
    assert running_replicas() == 1
    wait_counted("wake", "the router to count the wake")
    # The test engine's core is a spawned Python that titles itself seconds after its replica
    # runs (the engine computes nothing, so the replica answers first): wait for its title.
    wait_for(lambda: len(own_engine_processes()) == 1, 120, "the woken backend's engine")
