"""Spawned engine processes die with a parent killed by SIGKILL, the way vLLM's EngineCore and
its worker must die with their replica (deployments/engine/parent_death.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from deployments.engine.parent_death import ENV, installed

# A stand-in for a replica: it spawns a child (EngineCore) that spawns a grandchild (Worker),
# as vLLM does, prints their pids and waits to be killed.
REPLICA = """
import multiprocessing as mp, os, sys, time

def worker(queue):
    queue.put(os.getpid())
    time.sleep(600)

def engine_core(queue):
    mp.get_context("spawn").Process(target=worker, args=(queue,)).start()
    queue.put(os.getpid())
    time.sleep(600)

if __name__ == "__main__":
    queue = mp.get_context("spawn").Queue()
    mp.get_context("spawn").Process(target=engine_core, args=(queue,)).start()
    print(queue.get(), queue.get(), flush=True)
    time.sleep(600)
"""


def spawn_tree(tmp_path: object, armed: bool) -> tuple[subprocess.Popen[str], list[int]]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if armed:
        env[ENV] = "1"
    script = os.path.join(str(tmp_path), "replica.py")
    with open(script, "w") as file:
        file.write(REPLICA)
    replica = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True, env=env)
    assert replica.stdout is not None
    pids = [int(pid) for pid in replica.stdout.readline().split()]
    assert len(pids) == 2
    assert all(process_alive(pid) for pid in pids)
    return replica, pids


def sigkill(replica: subprocess.Popen[str]) -> None:
    replica.kill()
    replica.wait()
    assert replica.stdout is not None
    replica.stdout.close()


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if process_alive(p)]


@pytest.fixture(autouse=True)
def _hook_installed() -> None:
    if not installed():
        pytest.fail(
            "the parent-death hook is not installed: `make install` (or "
            "`python -m deployments.engine.parent_death install`) writes it"
        )


def test_engine_processes_die_with_a_replica_killed_by_sigkill(tmp_path: object) -> None:
    replica, pids = spawn_tree(tmp_path, armed=True)
    sigkill(replica)
    assert wait_gone(pids, timeout_s=30) == [], "engine processes outlived their replica"


def test_without_the_variable_they_would_be_orphaned(tmp_path: object) -> None:
    """The control: what happens to vLLM's processes without the hook."""
    replica, pids = spawn_tree(tmp_path, armed=False)
    sigkill(replica)
    try:
        assert wait_gone(pids, timeout_s=2) == pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


def process_alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
