"""The Batch API against a client loop straight to bare ray.serve.llm, on the same engine.

One backend of the demo model (bench/batch.yaml), the anchor (bare ray.serve.llm) and our
gateway over the same replica (bench/stack.py). Measured:

- **throughput**: LINES short chat requests (`max_tokens` 8) as one batch through the Batch API
  (upload to `completed`), against the same requests sent by a client loop straight to the
  anchor at the same concurrency: the batch's own, the backend's background slots (its cap of
  4 times the background share of 0.5). Target: at least 0.9 of the anchor's lines per second.
- **peak gateway memory**: the resident memory of the ingress (with its router) and the batch
  service, sampled every second during the batch, against before it.
- **users during the batch**: one user sending short requests back to back at user priority,
  its p99 latency while the batch runs against the same user on an idle engine. Target: at most
  1.5 x. The same user runs beside the anchor's client loop too (so both sides carry the same
  work; its p99 there, without priority classes, is printed for comparison).
- **resume**: a second batch of RESUME_LINES, its service killed with SIGKILL at about a third:
  the seconds from the kill to the next committed chunk, and every line in the output once.

Run with `make bench` (or `python -m bench.batch [LINES]`; 10,000 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import ray
from ray.util.state import list_actors

from bench import stack
from deployments.batch.actor import batch_actor_name

CONFIG = Path(__file__).with_name("batch.yaml")
PORT = 18900
LINES = 10_000
RESUME_LINES = 300
USER_REQUESTS = 200  # idle: enough that its p99 is not simply its slowest
BATCH_TIMEOUT_S = 4 * 3600.0
RESUME_TIMEOUT_S = 900.0
ENDED = ("completed", "failed", "expired", "cancelled")
DIRECTORY = Path(tempfile.gettempdir()) / f"gps-bench-batches-{os.getpid()}"
CONCURRENCY = 2  # the backend's background slots: a cap of 4, background share 0.5
THROUGHPUT_TARGET = 0.9
USER_P99_TARGET = 1.5
BODY = {"model": "coding", "max_tokens": 8, "ignore_eos": True}


def message(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a word that rhymes with number {n}."}]


def batch_file(count: int, prefix: str) -> bytes:
    lines = (
        {
            "custom_id": f"{prefix}-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**BODY, "messages": message(n)},
        }
        for n in range(count)
    )
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def client_loop(url: str, count: int, concurrency: int) -> tuple[float, int]:
    """The anchor's side: `count` requests by `concurrency` clients; seconds and failures."""
    queue = iter(range(count))
    failed = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failed
        for n in queue:
            try:
                reply = await client.post(url, json={**BODY, "messages": message(n)})
                failed += reply.status_code != 200
            except httpx.HTTPError:
                failed += 1

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return time.monotonic() - started, failed


def user_latencies(url: str, stop: threading.Event, most: int) -> list[float]:
    """One user's short requests back to back (at its key's default: user priority), until
    `stop` or `most` answers."""
    latencies: list[float] = []
    with httpx.Client(timeout=600) as client:
        while not stop.is_set() and len(latencies) < most:
            started = time.monotonic()
            reply = client.post(url, json={**BODY, "messages": message(len(latencies))})
            if reply.status_code == 200:
                latencies.append(time.monotonic() - started)
    return latencies


class User(threading.Thread):
    """The user beside a load: `user_latencies` in a thread, stopped when the load ends."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._url = url
        self.stop = threading.Event()
        self.latencies: list[float] = []

    def run(self) -> None:
        self.latencies = user_latencies(self._url, self.stop, 10**9)

    def ended(self) -> list[float]:
        self.stop.set()
        self.join()
        return self.latencies


def p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def gateway_pids() -> list[int]:
    """The gateway's processes: its ingress replica (the router runs in it) and the batch
    service (not the anchor's OpenAiIngress)."""
    ingress = f"ServeReplica:{stack.GATEWAY_APP}:ingress"
    service = batch_actor_name(stack.GATEWAY_APP)
    return [
        int(actor.pid)
        for actor in list_actors(filters=[("state", "=", "ALIVE")])
        if actor.class_name == ingress or actor.name == service
    ]


class MemoryPeak(threading.Thread):
    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self._pids = pids
        self.peak = 0
        self.stopped = threading.Event()

    def rss(self) -> int:
        total = 0
        for pid in self._pids:
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        return total

    def run(self) -> None:
        self.peak = self.rss()
        while not self.stopped.wait(1.0):
            self.peak = max(self.peak, self.rss())


def run_batch(client: openai.OpenAI, count: int, prefix: str) -> Any:
    file = client.files.create(
        file=("in.jsonl", io.BytesIO(batch_file(count, prefix))), purpose="batch"
    )
    return client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def wait_done(client: openai.OpenAI, batch_id: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.with_options(max_retries=10).batches.retrieve(batch_id)  # 503: restarting
        if batch.status in ENDED or time.monotonic() > deadline:
            return batch
        time.sleep(1.0)


def output_ids(client: openai.OpenAI, file_id: str | None) -> list[str]:
    if file_id is None:
        return []
    return [json.loads(t)["custom_id"] for t in client.files.content(file_id).text.splitlines()]


def settled(client: openai.OpenAI, batch_id: str) -> tuple[int, str]:
    """Lines with a committed result (either file), and the status; one try (no SDK retry
    waits: the resume time is polled)."""
    batch = client.with_options(max_retries=0).batches.retrieve(batch_id)
    counts = batch.request_counts
    return (counts.completed + counts.failed if counts else 0), batch.status


def resume(client: openai.OpenAI) -> tuple[float | None, bool]:
    """Seconds from SIGKILL of the service to its next committed chunk; every line once."""
    batch = run_batch(client, RESUME_LINES, "r")
    deadline = time.monotonic() + RESUME_TIMEOUT_S
    while settled(client, batch.id)[0] < RESUME_LINES // 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    service = ray.get_actor(batch_actor_name(stack.GATEWAY_APP))
    pid = ray.get(service.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    # What was committed before the kill, read from the store the restarted service reads.
    committed = settled_in_store(batch.id)
    resumed_s = None
    while time.monotonic() < deadline:
        try:
            done, status = settled(client, batch.id)
        except openai.APIError:  # the service restarting: 503
            done, status = committed, "in_progress"
        if done > committed or status in ENDED:
            resumed_s = time.monotonic() - killed
            break
        time.sleep(0.1)
    batch = wait_done(client, batch.id, RESUME_TIMEOUT_S)
    ids = output_ids(client, batch.output_file_id)
    return resumed_s, sorted(ids) == sorted(f"r-{n}" for n in range(RESUME_LINES))


def settled_in_store(batch_id: str) -> int:
    """The batch's committed lines as the SQLite store has them (the service is dead now)."""
    [database] = DIRECTORY.glob("*/batches.sqlite3")
    with sqlite3.connect(database) as db:
        completed, failed = db.execute(
            "SELECT completed, failed FROM batches WHERE id=?", (batch_id,)
        ).fetchone()
    return int(completed) + int(failed)


def main() -> int:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else LINES
    # A directory of this run's own: no batch of an earlier run is taken up meanwhile.
    stage = stack.stage(CONFIG, PORT, {"batches": {"directory": str(DIRECTORY)}})
    client = openai.OpenAI(
        base_url=f"{stage.base_url}/v1", api_key="none", max_retries=3, timeout=600
    )
    try:
        for _ in range(3):  # warm the engine and both paths
            httpx.post(stage.gateway_url, json={**BODY, "messages": message(0)}, timeout=600)
            httpx.post(stage.anchor_url, json={**BODY, "messages": message(0)}, timeout=600)
        idle = user_latencies(stage.gateway_url, threading.Event(), USER_REQUESTS)

        # The same user beside each side's load, so both carry the same work.
        user = User(stage.anchor_url)
        user.start()
        anchor_s, anchor_failed = asyncio.run(client_loop(stage.anchor_url, lines, CONCURRENCY))
        beside_anchor = user.ended()

        memory = MemoryPeak(gateway_pids())
        before = memory.rss()
        memory.start()
        user = User(stage.gateway_url)
        user.start()
        started = time.monotonic()
        batch = run_batch(client, lines, "b")  # upload to completed
        batch = wait_done(client, batch.id, BATCH_TIMEOUT_S)
        batch_s = time.monotonic() - started
        busy = user.ended()
        memory.stopped.set()
        ids = output_ids(client, batch.output_file_id)
        every_once = sorted(ids) == sorted(f"b-{n}" for n in range(lines))
        resumed_s, resumed_whole = resume(client)
    finally:
        stack.stop()
        shutil.rmtree(DIRECTORY, ignore_errors=True)

    anchor_rate, batch_rate = lines / anchor_s, lines / batch_s
    throughput = batch_rate / anchor_rate
    user_ratio = p99(busy) / p99(idle)
    counts = batch.request_counts
    print(
        f"\nbatch: {lines} chat requests (max_tokens {BODY['max_tokens']}), concurrency "
        f"{CONCURRENCY}"
    )
    print("| path | seconds | lines/s | failed |")
    print("|---|---:|---:|---:|")
    print(
        f"| client loop -> bare ray.serve.llm | {anchor_s:.1f} | {anchor_rate:.2f} | "
        f"{anchor_failed} |"
    )
    print(
        f"| Batch API (upload to completed) | {batch_s:.1f} | {batch_rate:.2f} | "
        f"{counts.failed if counts else '?'} |"
    )
    print(f"| ratio batch / anchor | | {throughput:.2f} (target >= {THROUGHPUT_TARGET}) | |")
    print(
        f"\nuser p99 latency (one user, back to back): idle {p99(idle):.2f} s ({len(idle)}), "
        f"beside the batch {p99(busy):.2f} s ({len(busy)}): {user_ratio:.2f} x (target <= "
        f"{USER_P99_TARGET}); beside the anchor's client loop (no priority there) "
        f"{p99(beside_anchor):.2f} s ({len(beside_anchor)})"
    )
    print(
        f"gateway memory (ingress with its router, batch service): {before / 2**20:.0f} MiB "
        f"before, peak {memory.peak / 2**20:.0f} MiB during the batch"
    )
    resumed = "never" if resumed_s is None else f"{resumed_s:.1f} s"
    print(
        f"every line once in the output: {every_once}; SIGKILL of the service mid-batch "
        f"({RESUME_LINES} lines): next commit {resumed} after it, every line once: "
        f"{resumed_whole}"
    )
    met = throughput >= THROUGHPUT_TARGET and user_ratio <= USER_P99_TARGET
    whole = every_once and resumed_whole and resumed_s is not None
    return 0 if met and whole and batch.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
