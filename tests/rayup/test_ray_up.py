"""`ray up ray_configs/cluster.local.yaml` on this machine, the app deployed on it with `serve run`,
and the cluster manager's `ray_autoscaler` provisioner getting nodes from that cluster's own
autoscaler: first the `cloud` pool's node (the pool starts empty), then a replacement when that
node is killed with SIGKILL. `ray down` then leaves no Ray or engine process behind.

Nothing but the provisioner asks for `pool_cloud` (rayup.yaml places no model there and its
node type has min_workers 0), so a cloud node that joins is the provisioner's doing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import ray
from ray.util.state import list_actors

from bench.multinode import cluster_status, wait_for
from cluster.ray_runtime import this_cluster
from tests.own_processes import another_suites

ROOT = Path(__file__).parents[2]
CLUSTER_YAML = ROOT / "ray_configs" / "cluster.local.yaml"
CONFIG = Path(__file__).with_name("rayup.yaml")
BIN = Path(sys.executable).parent
PORT = 8000  # cluster.local.yaml's `serve start`
RAY_PROCESS_MARKERS = (
    "raylet",
    "gcs_server",
    "VLLM::",
    "EngineCore",
    "llama_cpp_python_server",  # the fallback's engine over llama-cpp-python
    "llama-server",  # llama.cpp's own
)
CLI_TIMEOUT_S = 600


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def pool_nodes(pool: str) -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"] and f"pool_{pool}" in n["Resources"]]


def ray_processes() -> list[str]:
    found = []
    for process in psutil.process_iter(["cmdline", "name", "status"]):
        title = " ".join(process.info["cmdline"] or []) or (process.info["name"] or "")
        if (
            process.info["status"] != psutil.STATUS_ZOMBIE
            and any(marker in title for marker in RAY_PROCESS_MARKERS)
            and not another_suites(process)  # a session beside this one (tests/suites.py)
        ):
            found.append(f"{process.pid} {title[:100]}")
    return found


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`ray up`, then `serve run --non-blocking` once the local pool's node is in."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # ray up writes ~/ray_bootstrap_config.yaml on the head, here this machine: not in our home.
    env["HOME"] = str(tmp_path_factory.mktemp("head-home"))
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    cli("ray", "stop", "--force", env=env)
    try:
        cli("ray", "up", "-y", "--no-config-cache", str(CLUSTER_YAML), env=env)
        ray.init(address="auto", namespace="serve")
        wait_for(lambda: pool_nodes("local") != [], 120, "the local pool's node")
        cloud_after_up = pool_nodes("cloud")
        cli("serve", "run", "--non-blocking", "cluster.app:build", f"config={CONFIG}", env=env)
        yield {"env": env, "cloud_after_up": cloud_after_up}
    finally:
        ray.shutdown()
        subprocess.run(
            [str(BIN / "ray"), "down", "-y", str(CLUSTER_YAML)], env=env, cwd=ROOT, check=False
        )


def cloud_events(kind: str) -> list[dict[str, Any]]:
    """The cloud pool's events of `kind`; none while the app is still coming up."""
    try:
        events: list[dict[str, Any]] = cluster_status(PORT)["events"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []
    return [e for e in events if e["pool"] == "cloud" and e["type"] == kind]


def kill_node(node_id: str) -> int:
    """SIGKILL every process of a node the autoscaler launched (its raylet, agents, workers):
    Ray's fake provider gives them the node's id in their environment."""
    killed = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("RAY_OVERRIDE_NODE_ID_FOR_TESTING") == node_id:
                process.send_signal(signal.SIGKILL)
                killed.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    psutil.wait_procs(killed, timeout=30)
    return len(killed)


def test_ray_up_starts_the_head_and_only_the_pools_with_minimum_nodes(
    launched: dict[str, Any],
) -> None:
    assert launched["cloud_after_up"] == []
    head = [n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]]
    assert len(head) == 1
    assert not any(r.startswith("pool_") for r in head[0]["Resources"])


def test_the_gateway_runs_on_the_head(launched: dict[str, Any]) -> None:
    head = next(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"])
    # No placement actor: no model here may use a second pool; the router is in the ingress.
    gateway = ("ingress", "ClusterManager", "cpu-fallback")
    actors = list_actors(this_cluster(), filters=[("state", "=", "ALIVE")], limit=1000)
    placed = {part: {a.node_id for a in actors if part in a.class_name} for part in gateway}
    assert placed == {part: {head} for part in gateway}


def test_the_autoscaler_brings_the_cloud_pool_and_replaces_its_killed_node(
    launched: dict[str, Any],
) -> None:
    wait_for(lambda: len(cloud_events("GPU_RECOVERED")) == 1, 300, "the first cloud node")
    first = pool_nodes("cloud")
    assert len(first) == 1
    assert cluster_status(PORT)["pools"]["cloud"]["state"] == "healthy"

    killed_at = time.time()
    assert kill_node(first[0]) > 0
    wait_for(lambda: len(cloud_events("GPU_RECOVERED")) == 2, 300, "a replacement cloud node")
    replacement = pool_nodes("cloud")
    assert len(replacement) == 1
    assert replacement != first
    status = cluster_status(PORT)
    assert status["pools"]["cloud"]["state"] == "healthy"
    after_kill = [e for e in status["events"] if e["pool"] == "cloud" and e["at"] >= killed_at]
    types = [e["type"] for e in after_kill]
    assert types[:2] == ["POOL_UNHEALTHY", "POOL_DRAINING"], types
    # The manager asks the provisioner a round after it drains. The first node's ask stands
    # (Ray's autoscaler keeps a request_resources until another replaces it), so on a fast
    # machine the autoscaler has brought the replacement by then and nothing more is asked.
    assert types[2:-2] in ([], ["NODE_PROVISIONING"]), types
    assert types[-2:] == ["NODE_JOINED", "GPU_RECOVERED"], types
    recovered = after_kill[-1]
    print(
        f"\nray up: cloud node replaced; draining {after_kill[1]['at'] - killed_at:.1f} s and "
        f"GPU_RECOVERED {recovered['at'] - killed_at:.1f} s after the kill; events {types}"
    )
    reply = httpx.post(
        f"http://127.0.0.1:{PORT}/v1/chat/completions",
        json={"model": "orchestrator", "messages": [{"role": "user", "content": "Hi"}]},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text


def test_ray_down_leaves_no_ray_or_engine_process(launched: dict[str, Any]) -> None:
    ray.shutdown()
    cli("ray", "down", "-y", str(CLUSTER_YAML), env=launched["env"])
    deadline = time.monotonic() + 60
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(1)
    assert ray_processes() == []
