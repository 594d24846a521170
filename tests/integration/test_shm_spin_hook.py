"""A process an engine replica spawns (vLLM's EngineCore, its worker) gets the spin window of the
replica's environment on vLLM's own module, through the installed `.pth` hook
(deployments/engine/shm_spin.py); the replica's process itself is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deployments.engine.parent_death import ENV as PARENT_DEATH_ENV
from deployments.engine.parent_death import installed
from deployments.engine.shm_spin import ENV, MODULE

# A stand-in for a replica: the default of vLLM's window here and in a spawned child.
REPLICA = f"""
import multiprocessing as mp

def window():
    import {MODULE} as module
    return module.SpinCondition.__init__.__defaults__

def engine_core(queue):
    queue.put(window())

if __name__ == "__main__":
    queue = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=engine_core, args=(queue,))
    child.start()
    print(queue.get(timeout=120), window(), flush=True)
    child.join()
"""


def test_a_spawned_engine_process_gets_the_replicas_window(tmp_path: Path) -> None:
    assert installed(), "`make install` writes the engines' .pth hook"
    script = tmp_path / "replica.py"  # spawn imports the parent's main module from its file
    script.write_text(REPLICA)
    env = {**os.environ, PARENT_DEATH_ENV: "1", ENV: "0.002"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["(0.002,)", "(1,)"]
