"""`make reload` that changes the set of models, on the running app of two ingress replicas
(pressure.yaml's, last in its session: tests/monitoring/conftest.py), under a closed loop of
requests on `model: coding`, with the command itself (`python -m cluster.reload`) as an
operator runs it.

One reload adds a model (coder-2, taking over the coding role), removes the model that served it
(coding) and changes the router's queue. coder-2's engine is started in a Serve app of its own
and serves before the routers turn to it; coding's engine (its replica and every process under
it) is gone once no router sends it work. Not one request of the loop fails, and no ingress
replica restarts."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import ray
from ray import serve

from bench.multinode import wait_for
from core.config import ClusterConfig
from deployments.live_config import replica_ids
from tests.monitoring.pressure_app import ADMIN_HEADERS, APP, LOAD_HEADERS
from tests.monitoring.test_reload import CALLS, config_file, ingress_running, run_reload
from tests.monitoring.test_run_time_keys import CHAT, URL, ClosedLoop

ADDED = "coder-2"


def swap_coding_for_coder_2(raw: dict[str, Any]) -> None:
    """coder-2 (the same engine settings, named) takes the coding role; coding goes."""
    coding = raw["models"][0]
    raw["models"] = [{**coding, "name": ADDED, "role": "coding"}]
    raw["router"]["max_queue"] = 48


def engine_pids(deployment: str) -> set[int]:
    """The processes of the app's replicas of `deployment`: the replica's and its engine's."""
    prefix = f"SERVE_REPLICA::{APP}#{deployment}#"
    pids = set()
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if str(actor["name"]).startswith(prefix):
            replica = ray.get_actor(actor["name"], namespace=actor["namespace"])
            pid = ray.get(replica.__ray_call__.remote(lambda _self: os.getpid()), timeout=60)
            process = psutil.Process(pid)
            pids |= {pid, *(child.pid for child in process.children(recursive=True))}
    return pids


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.add(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def backends_seen() -> set[tuple[str, ...]]:
    """The backends each replica's router has, as the status answers (either replica)."""
    with httpx.Client(base_url=URL, headers=ADMIN_HEADERS, timeout=60) as client:
        answers = [client.get("/v1/cluster/status").json() for _ in range(CALLS)]
    return {tuple(sorted(a["backends"])) for a in answers}


def test_a_reload_starts_a_new_model_before_it_serves_and_stops_a_removed_one_after(
    app: ClusterConfig, tmp_path: Path
) -> None:
    ingress_running()
    old_engine = engine_pids("model:coding@local")
    replicas = replica_ids(APP, ("ingress",))
    with ClosedLoop(LOAD_HEADERS, clients=2).running() as load:
        began = time.monotonic()
        swapped = run_reload(config_file(tmp_path, app, swap_coding_for_coder_2))
        returned = time.monotonic()
        seen = {"backends": backends_seen()}
        wait_for(lambda: not alive(old_engine), 120, "coding's engine processes to end")
        ended = time.monotonic()
        with httpx.Client(base_url=URL, headers=LOAD_HEADERS, timeout=120) as client:
            named = client.post("/v1/chat/completions", json={**CHAT, "model": ADDED})
    statuses = sorted(set(load.statuses()))
    print(
        f"\nswap: {swapped.stdout.strip()}; the command took {returned - began:.0f} s, the old "
        f"engine's processes ended {ended - returned:.0f} s after it returned; the loop: "
        f"{len(load.answers)} answers {statuses}"
    )
    assert swapped.returncode == 0, swapped.stderr
    assert f"models[{ADDED}] (added)" in swapped.stdout
    assert "models[coding] (removed)" in swapped.stdout
    assert "router.max_queue" in swapped.stdout
    assert f"{ADDED}@local running and healthy" in swapped.stdout
    assert f"new engines serve: {ADDED}@local" in swapped.stdout
    assert "engines stopping (after the requests they run): coding@local" in swapped.stdout
    assert old_engine  # there was an engine to stop: the replica and the vLLM process under it
    assert seen["backends"] == {(f"{ADDED}@local", "cpu-fallback")}
    assert named.status_code == 200, named.text
    assert set(load.statuses()) == {200}
    assert replica_ids(APP, ("ingress",)) == replicas
    # The new engine runs in its own app, beside the gateway's (its revision: the third reload
    # of this session's app, or the first where this test runs alone).
    apps = serve.status().applications
    [engine_app] = [name for name in apps if name.startswith(f"{APP}--{ADDED}@local--r")]
    assert str(apps[engine_app].status.value) == "RUNNING"
