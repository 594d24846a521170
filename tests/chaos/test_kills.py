"""Faults we did not choose the timing of, on the shared e2e app: replicas killed with SIGKILL
under mixed whole and streamed load, a replica killed while its engine starts, the fallback's
engine killed mid-answer. What must hold: no whole request lost, every stream ends in [DONE]
with no error event, and no engine process outlives its replica."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import psutil
import pytest
import ray
from ray import serve
from ray.util.state import list_actors

from cluster.driver_handles import deployment_handle
from cluster.ray_runtime import this_cluster
from core.requests import ChatRequest

API_KEY = "test-user-key"  # tests/e2e/gateway.yaml
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
ORCHESTRATOR, CODING = "orchestrator@local", "coding@local"
QUESTION = "Write a long story about a lighthouse keeper and the sea, in many sentences."
# The agents' APIs, streamed through the same router (the translation at the edge).
API_STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "responses": (
        "/v1/responses",
        {"model": "orchestrator", "input": QUESTION, "max_output_tokens": 160, "stream": True,
         "temperature": 0.0},
    ),
    "messages": (
        "/v1/messages",
        {"model": "orchestrator", "max_tokens": 160, "stream": True, "temperature": 0.0,
         "messages": [{"role": "user", "content": QUESTION}]},
    ),
}  # fmt: skip
TEXT_EVENTS = re.compile(r'"type": ?"(content_block_delta|response\.output_text\.delta)"')
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


def fallback_engines(pid: int) -> list[psutil.Process]:
    """The fallback replica's engine child: llama.cpp's `llama-server` where make install built
    it (the e2e config's `auto`), else the Python one (`llama_cpp_python_server`)."""
    titles = r"llama-server|llama_cpp_python_server"
    return [p for p in engine_processes(pid) if re.search(titles, _title(p))]


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
    """Replaced, and the router would send new work there: its breaker closed, and no KV
    pressure. A passed probe clears the readings, but coding sits behind the suite's probe
    deployment, which never dies: the router sees coding's death only as its last reading
    going stale (pressure: work goes down the chain) until the replacement is read."""

    def serving() -> bool:
        if running_replicas(f"model:{backend}") != 1:
            return False
        seen = backends(http)[backend]
        return bool(seen["breaker"] == "closed" and not seen["kv_cache_pressure"])

    wait_for(serving, RECOVERY_S, f"{backend} to be replaced and taking work again")


async def api_stream(
    session: httpx.AsyncClient, api: str, started: asyncio.Event, streams: list[dict[str, Any]]
) -> None:
    """One long answer through the Responses or the Messages API, read into `streams` with
    when its first text came and when it ended; `started` set at its first text."""
    path, body = API_STREAMS[api]
    lines: list[str] = []
    first = None
    async with session.stream("POST", path, json=body) as reply:
        async for line in reply.aiter_lines():
            if line:
                lines.append(line)
            if first is None and TEXT_EVENTS.search(line):
                first = time.monotonic()
                started.set()
    read = (read_response_stream if api == "responses" else read_message_stream)(lines)
    streams.append(
        {"api": api, "status": reply.status_code, "first": first, "ended": time.monotonic(), **read}
    )


def check_api_streams(streams: list[dict[str, Any]], killed_at: float) -> None:
    """Each API's stream was mid-answer when its replica died, and went on to a whole end."""
    for api in API_STREAMS:
        [stream] = [s for s in streams if s.get("api") == api]
        assert stream["first"] < killed_at < stream["ended"], stream
        assert stream["ordered"], stream
        assert stream["adds_up"], stream


def _kinds_and_events(lines: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    kinds = [x[len("event: ") :] for x in lines if x.startswith("event: ")]
    return kinds, [json.loads(x[len("data: ") :]) for x in lines if x.startswith("data: {")]


def read_response_stream(lines: list[str]) -> dict[str, Any]:
    """A Responses stream: from response.created to its end, sequence numbers rising by one,
    one response id, the text deltas adding up to the final response's text."""
    kinds, events = _kinds_and_events(lines)
    ends = ("response.completed", "response.incomplete")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = [e["response"] for e in events if e["type"] in ends]
    whole = "".join(
        part.get("text", "")
        for item in (final[-1]["output"] if final else [])
        for part in item.get("content") or []
    )
    return {
        "done": kinds[:1] == ["response.created"] and bool(kinds) and kinds[-1] in ends,
        "errors": [k for k in kinds if k in ("error", "response.failed")],
        "ordered": [e.get("sequence_number") for e in events] == list(range(len(events))),
        "ids": {e["response"]["id"] for e in events if "response" in e},
        "adds_up": bool(text) and text == whole,
    }


def read_message_stream(lines: list[str]) -> dict[str, Any]:
    """A Messages stream: from message_start to message_stop, each block's deltas only while it
    is open and blocks one at a time, one message id, some text."""
    kinds, events = _kinds_and_events(lines)
    ordered, open_block = True, None
    for event in events:
        if event["type"] == "content_block_start":
            ordered &= open_block is None
            open_block = event["index"]
        elif event["type"] in ("content_block_delta", "content_block_stop"):
            ordered &= event["index"] == open_block
            open_block = None if event["type"] == "content_block_stop" else open_block
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    return {
        "done": kinds[:1] == ["message_start"] and kinds[-1:] == ["message_stop"],
        "errors": [k for k in kinds if k == "error"],
        "ordered": ordered,
        "ids": {e["message"]["id"] for e in events if e["type"] == "message_start"},
        "adds_up": bool(text),  # a Messages stream has no final copy to compare with
    }


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

    async def load_with_a_kill() -> tuple[list[int], list[str], list[dict[str, Any]]]:
        whole: list[int] = []
        refused: list[str] = []
        streams: list[dict[str, Any]] = []
        streaming = [asyncio.Event(), asyncio.Event()]
        translated = {api: asyncio.Event() for api in API_STREAMS}
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
                    if reply.status_code != 200:  # what the failure names
                        refused.append(f"{reply.status_code} {reply.text[:300]}")

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
            tasks += [
                asyncio.create_task(api_stream(session, a, e, streams))
                for a, e in translated.items()
            ]
            # Kill while every stream is mid-answer: they must go on on the next link.
            every = [*streaming, *translated.values()]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in every)), 180)
            killed_at.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)
            await asyncio.gather(*tasks)
        return whole, refused, streams

    killed_at: list[float] = []
    whole, refused, streams = asyncio.run(load_with_a_kill())
    assert whole == [200] * len(whole), refused
    assert [s["status"] for s in streams] == [200] * len(streams)
    assert all(s["done"] and not s["errors"] for s in streams), streams
    assert all(len(s["ids"]) == 1 for s in streams), "a migrated stream changed its id"
    chats = [s for s in streams if "api" not in s]
    assert any(s["migrated"] for s in chats), chats
    check_api_streams(streams, killed_at[0])
    metrics = http.get("/metrics").text
    assert 'gps_stream_migrations_total{from="orchestrator@local"' in metrics
    # The engine processes of the killed replica went with it.
    assert survivors(engines) == []
    # Its replacement loads while the next tests run (they need no orchestrator); the last
    # test waits for it.


def test_a_replica_killed_while_its_engine_starts_leaves_no_engine_behind(gateway: str) -> None:
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
    # Serve starts another; the last test waits for it, with orchestrator's.


def test_the_fallback_engine_killed_mid_answer_still_answers(gateway: str) -> None:
    fallback = deployment_handle("model:cpu-fallback", "gateway")
    pid = replica_pid("model:cpu-fallback")
    assert pid is not None
    [server] = fallback_engines(pid)
    request = ChatRequest(
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
    [restarted] = fallback_engines(pid)
    assert restarted.pid != server.pid
    assert fallback.check_health.remote().result() is None
    assert ray.is_initialized()


# -- Backends that died while idle, and a stream longer than the next link's window ------------

LONG_STORY = "Write a very long story about a lighthouse keeper, the sea and its ships."
FALLBACK_WINDOW = 1024  # tests/e2e/gateway.yaml: the CPU fallback's context_window
# Past the fallback's whole window: the continuation must be fitted to go on there at all.
LONG_STREAM_CHUNKS = FALLBACK_WINDOW + 100


class Replacement:
    """Watches a deployment whose replica is about to be killed: when Serve saw it gone (no
    RUNNING replica), and when a replacement's engine was up (RUNNING again)."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment
        self.gone_at: float | None = None
        self.running_at: float | None = None

    async def watch(self) -> None:
        while self.running_at is None:
            running = await asyncio.to_thread(running_replicas, self.deployment)
            if not running and self.gone_at is None:
                self.gone_at = time.monotonic()
            elif running and self.gone_at is not None:
                self.running_at = time.monotonic()
            await asyncio.sleep(0.2)


async def answer(session: httpx.AsyncClient, model: str, stream: bool) -> dict[str, Any]:
    """One short user request: who answered, after how many failovers, when it was over."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "stream": stream,
    }
    sent = time.monotonic()
    user = {"X-Priority": "user"}  # the story is background: a slot of its link is the user's
    async with session.stream("POST", "/v1/chat/completions", json=body, headers=user) as reply:
        lines = [line async for line in reply.aiter_lines() if line]
    return {
        "status": reply.status_code,
        "backend": reply.headers.get("x-backend"),
        "failovers": int(reply.headers.get("x-failovers", -1)),
        "seconds": round(time.monotonic() - sent, 2),
        "ended_at": time.monotonic(),
        **(read_stream(lines) if stream else {"done": True, "errors": []}),
    }


async def long_stream(session: httpx.AsyncClient, seen: dict[str, Any]) -> None:
    """A story streamed past the fallback's window; `seen` counts its text chunks as they come,
    and notes where the migration comment fell among them."""
    body = {
        "model": "coding",
        "messages": [{"role": "user", "content": LONG_STORY}],
        # Room to go on past the kills (they take seconds), and little more for the fallback.
        "max_tokens": LONG_STREAM_CHUNKS + 900,
        "ignore_eos": True,  # vLLM's: the story may not end before the kill
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    seen.update(chunks=0, lines=[], migrated_after=None)
    background = {"X-Priority": "background"}
    async with session.stream(
        "POST", "/v1/chat/completions", json=body, headers=background
    ) as reply:
        seen["status"] = reply.status_code
        seen["backend"] = reply.headers.get("x-backend")
        async for line in reply.aiter_lines():
            if not line:
                continue
            seen["lines"].append(line)
            if line.startswith(": gps-migrated"):
                seen["migrated_after"] = seen["chunks"]
            elif line.startswith("data: {") and '"content"' in line:
                seen["chunks"] += sum(
                    bool(c.get("delta", {}).get("content"))
                    for c in json.loads(line[len("data: ") :]).get("choices", [])
                )


IDLE_WAIT_S = 60  # the story runs minutes: it is still streaming when the wait ends


async def until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)


async def story_past_the_window(story: dict[str, Any], streaming: asyncio.Task[None]) -> None:
    """Until the story streamed past the fallback's window from coding. One that began
    elsewhere, or ended short, fails at once with where it stood (the line CI keeps)."""

    def past() -> bool:
        if story.get("chunks", 0) >= LONG_STREAM_CHUNKS:
            return True
        begun = story.get("backend")
        if begun not in (None, CODING) or streaming.done():
            lines = story.get("lines", [])
            pytest.fail(
                f"the story (status {story.get('status')}) began on {begun} and had "
                f"{story.get('chunks')} chunks, done: {streaming.done()}; its first and last "
                f"lines: {lines[:2]} ... {lines[-3:]}"
            )
        return False

    await until(past, 900, "the story")


def test_dead_backends_cost_no_wait_and_a_long_stream_goes_on_in_the_fallbacks_window(
    gateway: str, http: httpx.Client
) -> None:
    """Two deaths in a row. A story streams from coding past the fallback's whole window.
    Orchestrator's only replica is killed while idle: requests for it, sent at once and after
    Serve saw it gone, are answered by the next link before its replacement runs. Then, while
    orchestrator is still being replaced, coding's replica is killed mid-story: the story
    passes over orchestrator (no replica) and goes on on the CPU fallback, fitted to its
    window, to [DONE]."""
    # The replacements the kills above left loading, side by side: a replica and its breaker
    # back is what those tests check (wait_recovered).
    wait_recovered(http, ORCHESTRATOR)
    wait_recovered(http, CODING)
    orchestrator = Replacement(f"model:{ORCHESTRATOR}")
    story: dict[str, Any] = {}

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=600) as session:
            streaming = asyncio.create_task(long_stream(session, story))
            await story_past_the_window(story, streaming)
            # Idle: a request an earlier test left on it may still be ending (a clean-clone
            # run of 611d3e1 found one in flight here); a slot it never gave back stays.
            status = await asyncio.to_thread(backends, http)
            settled = time.monotonic() + IDLE_WAIT_S
            while status[ORCHESTRATOR]["in_flight"] and time.monotonic() < settled:
                await asyncio.sleep(1)
                status = await asyncio.to_thread(backends, http)
            assert status[ORCHESTRATOR]["in_flight"] == 0, f"not idle: {status[ORCHESTRATOR]}"
            victim = replica_pid(f"model:{ORCHESTRATOR}")
            assert victim is not None
            engines = engine_processes(victim)
            watching = asyncio.create_task(orchestrator.watch())
            os.kill(victim, signal.SIGKILL)
            # At once (Serve may not know yet), then once Serve saw the replica gone.
            early = list(
                await asyncio.gather(
                    answer(session, "orchestrator", False), answer(session, "orchestrator", True)
                )
            )
            await until(lambda: orchestrator.gone_at is not None, 120, "Serve to see it gone")
            late = list(
                await asyncio.gather(
                    *(answer(session, "orchestrator", s) for s in (False, True, False, True))
                )
            )
            assert orchestrator.running_at is None, "replaced before the second death"
            assert not streaming.done(), "the story ended before its replica was killed"
            second = replica_pid(f"model:{CODING}")
            assert second is not None
            engines += engine_processes(second)
            story["killed_after"] = story["chunks"]
            os.kill(second, signal.SIGKILL)
            await streaming
            watching.cancel()
        return early, late, survivors(engines)

    early, late, left = asyncio.run(scenario())
    replaced_at = orchestrator.running_at or float("inf")
    print(  # the figures behind the assertions (pytest -s)
        "answers:", [(r["backend"], r["failovers"], r["seconds"]) for r in (*early, *late)],
        f"story: {story['killed_after']} chunks at the kill, {story['migrated_after']} at the "
        f"migration, {story['chunks']} in all",
    )  # fmt: skip
    for reply in (*early, *late):
        assert reply["status"] == 200, reply
        assert reply["backend"] != ORCHESTRATOR, reply
        assert reply["done"], reply
        assert not reply["errors"], reply
        # Answered while the replacement was loading: none waited for it.
        assert reply["ended_at"] < replaced_at, reply
    # Once Serve's handle knew, orchestrator was passed over without a try.
    assert [r["failovers"] for r in late] == [0] * len(late)
    assert all(r["failovers"] <= 1 for r in early)

    lines = story["lines"]
    stream = read_stream(lines)
    assert story["status"] == 200
    assert stream["done"], lines[-3:]
    assert not stream["errors"], stream["errors"]
    assert len(stream["ids"]) == 1, "the migrated story changed its id"
    notes = [x for x in lines if x.startswith(": gps-migrated")]
    assert notes == [f": gps-migrated from={CODING} to=cpu-fallback"], notes
    assert story["chunks"] > story["migrated_after"], "no text after the kill"
    [usage] = [e["usage"] for e in map(_event, lines) if e.get("usage")]
    # Every token the client received, counted once: at least one per text chunk (a chunk may
    # hold more: a character of several byte tokens, text held back while it could begin a stop
    # string; a token of no text, such as a special one, has none), the first link's part as
    # the client saw it, and the fallback's no more than its window holds. Counting the first
    # part twice (at least LONG_STREAM_CHUNKS, past the window) breaks the upper bound.
    counted = (usage, story["chunks"], story["migrated_after"])
    assert usage["completion_tokens"] >= story["chunks"], counted
    assert usage["completion_tokens"] < story["migrated_after"] + FALLBACK_WINDOW, counted
    assert left == []
    # No wait for this test's replacements: it is the session's last, and replacement after a
    # kill (a replica and its breaker back) is what its start checked of the kills above.


def _event(line: str) -> dict[str, Any]:
    if not line.startswith("data: {"):
        return {}
    event: dict[str, Any] = json.loads(line[len("data: ") :])
    return event
