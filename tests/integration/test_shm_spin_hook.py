"""A process an engine replica spawns (vLLM's EngineCore, its worker) reads vLLM's step queue
with the spin window of the replica's environment, through the installed `.pth` hook
(deployments/engine/shm_spin.py); the replica's own process keeps vLLM's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deployments.engine.parent_death import ENV as PARENT_DEATH_ENV
from deployments.engine.parent_death import installed
from deployments.engine.shm_spin import ENV, MODULE

MARK = "windows: "  # vLLM logs to stdout too
# A stand-in for a replica: a reader of a real MessageQueue of vLLM's, as the worker makes one
# from its EngineCore's handle, here and in a spawned child.
REPLICA = f"""
import multiprocessing as mp

def reader_window():
    from {MODULE} import MessageQueue
    writer = MessageQueue(n_reader=1, n_local_reader=1, max_chunk_bytes=1024, max_chunks=2)
    reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
    return reader._spin_condition.busy_loop_s

def engine_core(queue):
    queue.put(reader_window())

if __name__ == "__main__":
    queue = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=engine_core, args=(queue,))
    child.start()
    print("{MARK}" + repr([queue.get(timeout=120), reader_window()]), flush=True)
    child.join()
"""


def test_a_spawned_engine_process_reads_with_the_replicas_window(tmp_path: Path) -> None:
    assert installed(), "`make install` writes the engines' .pth hook"
    script = tmp_path / "replica.py"  # spawn imports the parent's main module from its file
    script.write_text(REPLICA)
    env = {**os.environ, PARENT_DEATH_ENV: "1", ENV: "0.002"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith(MARK)]
    assert line.removeprefix(MARK) == "[0.002, 1]"
