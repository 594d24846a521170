"""Faults we did not choose the timing of, on the shared e2e app: replicas killed with SIGKILL
under mixed whole and streamed load, a replica killed while its engine starts, the fallback's
engine killed mid-answer. What must hold: no whole request lost, every stream ends in [DONE]
with no error event, and no engine process outlives its replica."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import psutil
import pytest
import ray
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest
from ray.util.state import list_actors

from cluster.ray_runtime import this_cluster

API_KEY = "test-user-key"  # tests/e2e/gateway.yaml
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
ORCHESTRATOR, CODING = "orchestrator@local", "coding@local"
QUESTION = "Write a long story about a lighthouse keeper and the sea, in many sentences."
RECOVERY_S = 480  # Serve replaces a vLLM replica in about a minute here; generous on 2 cores


def replica_pid(deployment: str, state: str = "ALIVE") -> int | None:
    """The worker process of the deployment's replica actor in `state`, if there is one."""
    for actor in list_actors(
        this_cluster(), filters=[("state", "=", state)], detail=True, limit=1000
    ):
        name = actor.get("name") or ""
        if name.startswith(f"SERVE_REPLICA::gateway#{deployment}#") and actor.get("pid"):
            return int(actor["pid"])
    return None


def engine_processes(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def survivors(processes: list[psutil.Process], timeout_s: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout_s
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.2)
    return [f"{p.pid} {p.name()}" for p in alive if _running(p)]


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _title(process: psutil.Process) -> str:
    """vLLM renames its processes (`VLLM::EngineCore`); the kernel's name keeps 15 letters."""
    try:
        return " ".join(process.cmdline()) or process.name()
    except psutil.NoSuchProcess:
        return ""


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - the app answering slowly while it recovers
            pass
        time.sleep(2)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def backends(http: httpx.Client) -> dict[str, Any]:
    reply: dict[str, Any] = http.get("/v1/cluster/status").json()["backends"]
    return reply


def running_replicas(deployment: str) -> int:
    info = serve.status().applications["gateway"].deployments[deployment]
    return int(info.replica_states.get("RUNNING", 0))


def wait_recovered(http: httpx.Client, backend: str) -> None:
    def serving() -> bool:
        replaced = running_replicas(f"model:{backend}") == 1
        return replaced and backends(http)[backend]["breaker"] == "closed"

    wait_for(serving, RECOVERY_S, f"{backend} to be replaced and its breaker to close")


def read_stream(lines: list[str]) -> dict[str, Any]:
    events = [json.loads(x[len("data: ") :]) for x in lines if x.startswith("data: {")]
    return {
        "done": bool(lines) and lines[-1] == "data: [DONE]",
        "errors": [e for e in events if "error" in e],
        "ids": {e["id"] for e in events if "id" in e},
        "migrated": any(x.startswith(": gps-migrated") for x in lines),
    }


def test_sigkilled_replicas_under_mixed_load_lose_no_request_and_no_stream(
    gateway: str, http: httpx.Client
) -> None:
    deployment = f"model:{ORCHESTRATOR}"
    victim = replica_pid(deployment)
    assert victim is not None, "no running orchestrator replica"
    engines = engine_processes(victim)
    assert engines, "the replica has no engine processes to check"

    async def load_with_a_kill() -> tuple[list[int], list[dict[str, Any]]]:
        whole: list[int] = []
        streams: list[dict[str, Any]] = []
        streaming = [asyncio.Event(), asyncio.Event()]
        async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=300) as session:

            async def whole_client() -> None:
                for _ in range(6):
                    body = {
                        "model": "orchestrator",
                        "messages": [{"role": "user", "content": QUESTION}],
                        "max_tokens": 16,
                    }
                    reply = await session.post("/v1/chat/completions", json=body)
                    whole.append(reply.status_code)

            async def stream_client(started: asyncio.Event) -> None:
                for _ in range(3):
                    body = {
                        "model": "orchestrator",
                        "messages": [{"role": "user", "content": QUESTION}],
                        "max_tokens": 160,
                        "temperature": 0.0,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                    lines: list[str] = []
                    async with session.stream("POST", "/v1/chat/completions", json=body) as reply:
                        async for line in reply.aiter_lines():
                            if line:
                                lines.append(line)
                            if '"content"' in line:
                                started.set()
                    streams.append({"status": reply.status_code, **read_stream(lines)})

            tasks = [asyncio.create_task(whole_client()) for _ in range(4)]
            tasks += [asyncio.create_task(stream_client(event)) for event in streaming]
            # Kill while both streams are mid-answer: they must go on on the next link.
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), 120)
            os.kill(victim, signal.SIGKILL)
            await asyncio.gather(*tasks)
        return whole, streams

    whole, streams = asyncio.run(load_with_a_kill())
    assert whole == [200] * len(whole)
    assert [s["status"] for s in streams] == [200] * len(streams)
    assert all(s["done"] and not s["errors"] for s in streams), streams
    assert all(len(s["ids"]) == 1 for s in streams), "a migrated stream changed its id"
    assert any(s["migrated"] for s in streams), streams
    metrics = http.get("/metrics").text
    assert 'gps_stream_migrations_total{from="orchestrator@local"' in metrics
    # The engine processes of the killed replica went with it.
    assert survivors(engines) == []
    wait_recovered(http, ORCHESTRATOR)


def test_a_replica_killed_while_its_engine_starts_leaves_no_engine_behind(
    gateway: str, http: httpx.Client
) -> None:
    deployment = f"model:{CODING}"
    victim = replica_pid(deployment)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    # Serve starts a replacement; catch it while its engine loads, before it serves.
    starting: list[psutil.Process] = []

    def engine_loading() -> bool:
        pid = replica_pid(deployment)
        if pid is None or pid == victim or running_replicas(deployment):
            return False
        starting[:] = [psutil.Process(pid), *engine_processes(pid)]
        return any("EngineCore" in _title(p) for p in starting[1:])

    wait_for(engine_loading, 240, "a replacement replica whose engine is starting")
    os.kill(starting[0].pid, signal.SIGKILL)
    assert survivors(starting) == []
    wait_recovered(http, CODING)


def test_the_fallback_engine_killed_mid_answer_still_answers(gateway: str) -> None:
    fallback = serve.get_deployment_handle("model:cpu-fallback", app_name="gateway")
    pid = replica_pid("model:cpu-fallback")
    assert pid is not None
    [server] = [p for p in engine_processes(pid) if "llama_server" in _title(p)]
    request = ChatCompletionRequest(
        model="cpu-fallback",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=400,
        temperature=0.0,
        stream=True,
    )
    lines: list[str] = []
    for item in fallback.options(stream=True).chat.remote(request):
        lines.extend(str(part).strip() for part in item)
        if len(lines) == 4:
            server.send_signal(signal.SIGKILL)
    stream = read_stream([x for x in lines if x])
    assert stream["done"], lines[-3:]
    assert not stream["errors"], lines[-3:]
    assert not _running(server)
    # The replica never died: the same worker answers, with a new engine child, which took the
    # rest of the answer (the kill came after four lines of up to 400 tokens).
    assert replica_pid("model:cpu-fallback") == pid
    [restarted] = [p for p in engine_processes(pid) if "llama_server" in _title(p)]
    assert restarted.pid != server.pid
    assert fallback.check_health.remote().result() is None
    assert ray.is_initialized()
