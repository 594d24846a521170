"""After everything the shared app's suites did to it (every endpoint, bad input, engine errors,
failovers, killed replicas and engines), the gateway's own processes still hold no vLLM and no
torch, nor the pandas and pyarrow that Serve loads for others (deployments/light_process.py): a
lazy import or an engine's object unpickled off a handle would show here, where
tests/unit/test_light_gateway.py (a fresh import) cannot see it. Runs last (chaos runs after
e2e, and this file after the other chaos files).

Read off each process's memory maps: vLLM imports torch as it loads, and torch maps its
libtorch libraries, so a process that loaded either maps `libtorch`; pandas maps its compiled
`_libs`, pyarrow its `libarrow`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ray._common.usage.usage_lib import usage_stats_enabled
from ray.util.state import list_actors

from cluster.ray_runtime import this_cluster

# The gateway's Serve deployments (the engines' are `model:<backend>` and load vLLM); the
# shared app runs its router inside the ingress (gateway.router_in_ingress, the default).
GATEWAY_DEPLOYMENTS = ("ingress", "router", "model:cpu-fallback")
RUNNING_HERE = {"ingress", "model:cpu-fallback"}
OUR_ACTORS = "gps"  # the detached actors' names (key ledger, slot broker, placer, ...)
ENGINE_MARKERS = ("libtorch", "/vllm/")
UNUSED_MARKERS = ("/pandas/_libs/", "libarrow")
ENGINE_WAIT_S = 600  # a killed engine's replacement loads its model on CPU


def gateway_processes() -> dict[str, int]:
    """Each ALIVE gateway replica and detached actor of ours, by actor name: its pid."""
    found = {}
    for actor in list_actors(
        this_cluster(), filters=[("state", "=", "ALIVE")], detail=True, limit=1000
    ):
        name, pid = actor.get("name") or "", actor.get("pid")
        deployment = name.split("#")[1] if name.startswith("SERVE_REPLICA::gateway#") else None
        if pid and (deployment in GATEWAY_DEPLOYMENTS or name.startswith(OUR_ACTORS)):
            found[name] = int(pid)
    return found


def mapped_libraries(pid: int, markers: tuple[str, ...] = ENGINE_MARKERS) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if any(m in line for m in markers)})


def test_no_gateway_process_has_loaded_vllm_or_torch(gateway: str) -> None:
    processes = gateway_processes()
    kinds = {name.split("#")[1] for name in processes if name.startswith("SERVE_REPLICA")}
    assert kinds >= RUNNING_HERE, processes  # each is running, so each is read
    assert any(not name.startswith("SERVE_REPLICA") for name in processes), processes
    loaded = {name: mapped_libraries(pid) for name, pid in processes.items()}
    assert not {name: libs for name, libs in loaded.items() if libs}
    unused = {name: mapped_libraries(pid, UNUSED_MARKERS) for name, pid in processes.items()}
    assert not {name: libs for name, libs in unused.items() if libs}


def maps_if_alive(pid: int, markers: tuple[str, ...] = ENGINE_MARKERS) -> list[str] | None:
    try:
        return mapped_libraries(pid, markers)
    except OSError:  # it died since it was listed (a replica being replaced)
        return None


def engine_replicas() -> list[int]:
    """The pids of the ALIVE engine replicas (every `model:` deployment but the fallback's)."""
    return [
        int(actor["pid"])
        for actor in list_actors(
            this_cluster(), filters=[("state", "=", "ALIVE")], detail=True, limit=1000
        )
        if (name := actor.get("name") or "").startswith("SERVE_REPLICA::gateway#model:")
        and name.split("#")[1] not in GATEWAY_DEPLOYMENTS
        and actor.get("pid")
    ]


def test_the_check_sees_an_engine_where_one_is_loaded(gateway: str) -> None:
    # The kills before this file leave engines being replaced: a replacement is ALIVE before it
    # has imported vLLM, so wait (bounded) for one that has, rather than read the first found.
    deadline = time.monotonic() + ENGINE_WAIT_S
    seen: dict[int, list[str]] = {}
    while time.monotonic() < deadline:
        seen = {pid: maps for pid in engine_replicas() if (maps := maps_if_alive(pid)) is not None}
        if any(any("libtorch" in lib for lib in libs) for libs in seen.values()):
            # An engine's replica is started without the hook: Serve's pandas shows there.
            assert any(maps_if_alive(pid, UNUSED_MARKERS) for pid in seen), seen
            return
        time.sleep(2)
    raise AssertionError(f"no engine replica mapped libtorch in {ENGINE_WAIT_S} s: {seen}")


def test_no_engine_start_left_a_usage_telemetry_actor(gateway: str) -> None:
    """With Ray's usage stats off (tests/local_ray.py, as `make run`), no engine replica, first
    start or replacement, started ray.llm's telemetry actor: one more process of vLLM and torch
    on the head node that only records the stats nobody sends."""
    if usage_stats_enabled():  # whoever runs the tests turned them on: Ray's path, unchanged
        pytest.skip("RAY_USAGE_STATS_ENABLED is on here")
    agents = list_actors(
        this_cluster(), filters=[("class_name", "=", "TelemetryAgent")], detail=True, limit=100
    )
    assert not [(a.get("name"), a.get("state")) for a in agents]
