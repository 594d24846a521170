"""`make reload` on the running app of two ingress replicas (pressure.yaml), under a closed loop
of requests, with the command itself (`python -m cluster.reload`) as an operator runs it:

- a reload that adds a key and changes a cap and a router setting is applied by both replicas
  (the command waits for both), the new key is served and every router counts the new cap;
- a config that changes the fallback (built into the app), and one the config guard refuses,
  change nothing;
- a reload back to the first config takes the key away and the cap back.

Not one request of the loop fails meanwhile, and no ingress replica restarts. A reload that
changes the set of models is test_model_swap.py's, last on the same app (it starts a second
engine: this suite runs after the shared app's, for memory)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import ray
import yaml
from ray import serve

from bench.multinode import wait_for
from core.config import ClusterConfig, hash_key
from deployments.live_config import replica_ids
from deployments.router.slot_broker import broker_name
from tests.monitoring.pressure_app import ADMIN_HEADERS, APP, CONFIG, LOAD_HEADERS
from tests.monitoring.test_run_time_keys import URL, ClosedLoop, chats

RELOADED_KEY = "monitoring-reloaded-key"
BACKEND = "coding@local"
# Status calls each reach one of the two replicas at random: 16 miss one with odds 1 in 32768.
CALLS = 16


def config_file(folder: Path, app: ClusterConfig, edit: Callable[[dict[str, Any]], None]) -> Path:
    """pressure.yaml as the app runs it, from another folder (its paths made absolute, the
    session's keys file), with `edit` applied."""
    raw = yaml.safe_load(CONFIG.read_text())
    for model in raw["models"]:
        model["source"] = app.resolve_path(model["source"])
    raw["fallback"]["source"] = app.fallback_source
    raw["gateway"]["keys_db"] = str(app.keys_db)
    raw["gateway"]["responses_db"] = str(app.responses_db)
    raw["batches"] = {"directory": str(app.batch_directory)}
    edit(raw)
    path = folder / "reloaded.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run_reload(path: Path) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    command = [sys.executable, "-m", "cluster.reload", str(path), "--app", APP]
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300)


def caps() -> set[tuple[int, int]]:
    """(config revision, the backend's cap) as each replica answers the status."""
    with httpx.Client(base_url=URL, headers=ADMIN_HEADERS, timeout=60) as client:
        answers = [client.get("/v1/cluster/status").json() for _ in range(CALLS)]
    return {(a["config_revision"], a["backends"][BACKEND]["cap_total"]) for a in answers}


def add_key_and_lower_cap(raw: dict[str, Any]) -> None:
    raw["api_keys"].append({"name": "reloaded", "sha256": hash_key(RELOADED_KEY), "rpm": 10_000})
    raw["models"][0]["max_concurrency"] = 12
    raw["router"]["max_queue"] = 32


def ingress_running() -> None:
    """Both ingress replicas serve (test_prometheus kills one: its replacement may still be
    starting, and a reload waits for every replica alive)."""

    def both() -> bool:
        ingress = serve.status().applications[APP].deployments["ingress"]
        return ingress.replica_states.get("RUNNING", 0) == 2 and len(ingress.replica_states) == 1

    wait_for(both, 300, "both ingress replicas running")


def test_a_reload_applies_in_place_on_both_replicas_and_a_refused_one_changes_nothing(
    app: ClusterConfig, tmp_path: Path
) -> None:
    ingress_running()
    reloaded_key = {"Authorization": f"Bearer {RELOADED_KEY}"}
    replicas = replica_ids(APP, ("ingress",))
    with ClosedLoop(LOAD_HEADERS, clients=2).running() as load:
        seen: dict[str, Any] = {"key_before": set(chats(reloaded_key, CALLS)), "cap": caps()}
        applied = run_reload(config_file(tmp_path, app, add_key_and_lower_cap))
        seen |= {"key_after": set(chats(reloaded_key, CALLS)), "cap_after": caps()}

        def change_fallback(raw: dict[str, Any]) -> None:
            add_key_and_lower_cap(raw)
            raw["fallback"]["threads"] = 2
            del raw["api_keys"][-1]

        engine = run_reload(config_file(tmp_path, app, change_fallback))
        guarded = run_reload(
            config_file(tmp_path, app, lambda raw: raw["models"][0].update(context_window=16384))
        )
        seen |= {"key_kept": set(chats(reloaded_key, CALLS)), "cap_kept": caps()}
        back = run_reload(config_file(tmp_path, app, lambda raw: None))
        seen |= {"key_back": set(chats(reloaded_key, CALLS)), "cap_back": caps()}
    statuses = sorted(set(load.statuses()))
    print(
        f"\nreload: {applied.stdout.strip()} | refused: {engine.stderr.strip()} | back: "
        f"{back.stdout.strip()}; the loop: {len(load.answers)} answers {statuses}"
    )
    assert (applied.returncode, back.returncode) == (0, 0), applied.stderr + back.stderr
    assert "3 of 3 replicas run it (" in applied.stdout  # both ingress replicas, the fallback
    assert "api_keys" in applied.stdout
    assert "models[coding].max_concurrency" in applied.stdout
    assert (seen["key_before"], seen["key_after"]) == ({401}, {200})
    # (revision, the backend's slots over both routers): 16, then 12; every status call
    # (either replica) agrees
    assert (seen["cap"], seen["cap_after"]) == ({(0, 16)}, {(1, 12)})
    assert engine.returncode == 2
    assert "\n  fallback" in engine.stderr
    assert guarded.returncode == 2
    assert "the config guard refused it" in guarded.stderr
    assert (seen["key_kept"], seen["cap_kept"]) == ({200}, {(1, 12)})
    assert (seen["key_back"], seen["cap_back"]) == ({401}, {(2, 16)})
    assert set(load.statuses()) == {200}
    assert len(replicas) == 2
    assert replica_ids(APP, ("ingress",)) == replicas  # the same two: none restarted
    # Both routers run under the app's slot broker's leases (tests/unit/test_slot_leases.py
    # checks what they get; here, that the real actor is posted to by each replica).
    broker = ray.get_actor(broker_name(APP), namespace="serve")
    assert replicas <= set(ray.get(broker.stats.remote(), timeout=60)["routers"])
