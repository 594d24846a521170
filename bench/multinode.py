"""What the multi-node tests and benchmarks share: a steady request stream, waiting, and
driving the VRAM probes (this machine has no GPU; readings are injected through the probes'
own interface)."""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import ray

from autoscale.probe import start_probes
from autoscale.vram import NodeReading

# A stream that ends without [DONE], or with an error event, counts as this status.
BROKEN_STREAM = 599
# The status reads Serve's controller, which takes seconds to answer while it replaces what a
# node's death took (5.2 s seen once under `make test`): httpx's default 5 s is too short.
STATUS_TIMEOUT_S = 60.0


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until `check()` holds; TimeoutError naming `what` past `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


class Stream:
    """Requests every `pause_s` in a thread, streamed and whole in turn: (time, status,
    backend, streamed) of each, and the tokens the answers' `usage` counted (`tokens`). A
    stream counts as a success only if it ends with [DONE] and carries no error event."""

    def __init__(
        self, port: int, model: str, pause_s: float = 0.25, headers: dict[str, str] | None = None
    ) -> None:
        self.results: list[tuple[float, int, str, bool]] = []
        self.tokens = 0
        self._port = port
        self._headers = headers or {}
        self._model = model
        self._pause_s = pause_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {
            "model": self._model,
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 4,
        }
        streamed = {
            **body,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 24,
            "ignore_eos": True,
        }
        base_url = f"http://127.0.0.1:{self._port}"
        with httpx.Client(base_url=base_url, headers=self._headers, timeout=180) as client:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                try:
                    code, backend, tokens = self._one(client, body, streamed, bool(n % 2))
                except httpx.HTTPError:
                    code, backend, tokens = 0, "", 0
                self.tokens += tokens
                self.results.append((time.monotonic(), code, backend, bool(n % 2)))
                time.sleep(self._pause_s)

    @staticmethod
    def _one(
        client: httpx.Client, body: dict[str, Any], streamed: dict[str, Any], stream: bool
    ) -> tuple[int, str, int]:
        """Status, backend and the usage's total tokens of one request."""
        if not stream:
            reply = client.post("/v1/chat/completions", json=body)
            usage = reply.json().get("usage") if reply.status_code == 200 else None
            tokens = int(usage["total_tokens"]) if usage else 0
            return reply.status_code, reply.headers.get("x-backend", ""), tokens
        with client.stream("POST", "/v1/chat/completions", json=streamed) as reply:
            lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
            whole = lines[-1:] == ["data: [DONE]"] and not any('"error"' in x for x in lines)
            code = reply.status_code if whole else BROKEN_STREAM
            return code, reply.headers.get("x-backend", ""), usage_tokens(lines)

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def first_from(self, backend: str, after: float) -> float | None:
        return next((t for t, _, b, _ in self.results if b == backend and t >= after), None)

    def failed(self, since: float = 0.0) -> list[tuple[float, int, str, bool]]:
        return [r for r in self.results if r[1] != 200 and r[0] >= since]


def usage_tokens(lines: list[str]) -> int:
    """The total tokens a stream's usage chunk counted (0 without one)."""
    for line in reversed(lines):
        if '"usage"' in line and line != "data: [DONE]":
            usage = json.loads(line.removeprefix("data: ")).get("usage")
            if usage:
                return int(usage["total_tokens"])
    return 0


def report_free(namespace: str, node: str, free_gb: float) -> None:
    """The node's VRAM probe reports one GPU with `free_gb` free from now on."""
    probe = start_probes(namespace)[node]
    ray.get(probe.inject.remote(NodeReading.rehearsal(node, free_gb).to_json()))


def cluster_status(port: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/v1/cluster/status"
    reply: dict[str, Any] = httpx.get(url, timeout=STATUS_TIMEOUT_S).json()
    return reply


def kill_started_nodes(pids: Path) -> None:
    """The nodes tests/recovery/start_node.py started (their pids in `pids`): each
    `ray start --block` and everything under it, with SIGKILL."""
    if not pids.exists():
        return
    for line in pids.read_text().split():
        try:
            parent = psutil.Process(int(line))
            group = [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for process in group:
            # One may have exited since it was listed (Serve's shutdown just stopped its workers).
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(group, timeout=30)


def alive_pool_node(pool: str, other_than: str) -> str | None:
    """An alive node carrying `pool_<pool>` other than `other_than` (a replacement)."""
    return next(
        (
            n["NodeID"]
            for n in ray.nodes()
            if n["Alive"] and f"pool_{pool}" in n["Resources"] and n["NodeID"] != other_than
        ),
        None,
    )
