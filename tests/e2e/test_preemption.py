"""Preemption with continuation on a real engine (router.preempt, turned on by a reload for
this test and off again after it).

A background stream runs on coding@local (vLLM, cap 2, reached through the probe); two users
arrive. The first user's arrival pauses it: vLLM aborts it, the client's stream stays open
(SSE comments) while the users run, and it goes on as the same answer once they are done. The
client sees one answer: no error, one id, the text going on exactly where it stopped (the probe
saw the continuation asked for with the text the client had), `usage` counting what it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ray.serve.handle import DeploymentHandle

from cluster.reload import ServeApp, reload
from core.config import PreemptConfig
from core.types import PriorityClass
from tests.waiting import wait_for

API_KEY = "test-user-key"  # tester: agent by default, may claim user
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TOKENS = 96


CODING_TO_FALLBACK = ("coding@local", "cpu-fallback")
RULES = PreemptConfig(
    enabled=True,
    above_running=1,
    may_pause={PriorityClass.USER: 2},
    max_pauses=2,
    protect_last_tokens=8,
    keepalive_s=0.5,
)


def reloaded_with_preemption(chains: dict[str, tuple[str, ...]]) -> Iterator[None]:
    """`router.preempt` on (and `chains` changed) by a reload, as before again after."""
    app = ServeApp("gateway")
    before = app.running().config
    router = before.router.model_copy(update={"preempt": RULES})
    update = {"router": router, "chains": {**before.chains, **chains}}
    assert reload(before.model_copy(update=update), app) is not None
    try:
        yield
    finally:
        reload(before, app)


@pytest.fixture
def preempting(gateway: str) -> Iterator[None]:
    yield from reloaded_with_preemption({})


@pytest.fixture
def preempting_on_the_fallback(gateway: str, probe: DeploymentHandle) -> Iterator[None]:
    """Coding's answers on the CPU fallback: its chain is coding@local (where placement puts
    it, always first) and the fallback, and coding@local fails every request meanwhile."""
    with contextlib.contextmanager(reloaded_with_preemption)({"coding": CODING_TO_FALLBACK}):
        probe.set_faulty.remote(True).result()
        try:
            yield
        finally:
            probe.set_faulty.remote(False).result()
            closed_again(gateway, "coding@local")


def closed_again(gateway: str, backend: str) -> None:
    """Until `backend`'s breaker is closed (later tests find every backend up)."""

    def closed() -> bool:
        status = httpx.get(f"{gateway}/v1/cluster/status", headers=HEADERS).json()
        return bool(status["backends"][backend]["breaker"] == "closed")

    wait_for(closed, 60, f"{backend}'s breaker to close")


def chat(priority: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "coding",
        "messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # exactly max_tokens: the count is known
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


async def background_and_users(gateway: str) -> tuple[list[tuple[float, str]], list[float]]:
    seen: list[tuple[float, str]] = []  # each SSE line of the background stream, when it came
    async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=300) as client:

        async def background() -> None:
            body, priority = chat("background", TOKENS, stream=True), {"X-Priority": "background"}
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=priority
            ) as reply:
                assert reply.status_code == 200, await reply.aread()
                async for line in reply.aiter_lines():
                    if line:
                        seen.append((time.monotonic(), line))

        async def user() -> float:
            body = chat("user", 16, stream=False)
            reply = await client.post(
                "/v1/chat/completions", json=body, headers={"X-Priority": "user"}
            )
            assert reply.status_code == 200, reply.text
            return time.monotonic()

        running = asyncio.create_task(background())
        deadline = time.monotonic() + 120
        while len(_content(seen)) < 8 and time.monotonic() < deadline:  # noqa: ASYNC110 - lines land in `seen`
            await asyncio.sleep(0.05)
        users = await asyncio.gather(user(), user())
        await running
    return seen, list(users)


def _content(seen: list[tuple[float, str]]) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for _, line in seen if line.startswith("data: {")]


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_a_background_stream_paused_for_users_goes_on_as_the_same_answer(
    gateway: str, preempting: None, probe: DeploymentHandle
) -> None:
    probe.reset_counts.remote().result()
    seen, users_done = asyncio.run(background_and_users(gateway))

    lines = [line for _, line in seen]
    assert lines[-1] == "data: [DONE]"
    assert lines[-2].startswith(": gps-pauses n=")  # how often, said last
    assert not any('"error"' in line for line in lines)
    paused = [t for t, line in seen if line.startswith(": gps-paused")]
    resumed = [t for t, line in seen if line.startswith(": gps-resumed")]
    assert paused, lines[:20]
    assert resumed
    assert paused[0] < min(users_done)  # paused while the users ran
    assert resumed[-1] > min(users_done)  # and went on after them

    chunks = _content(seen)
    assert len({c["id"] for c in chunks}) == 1  # one answer
    roles = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert len(roles) == 1
    # The engine was asked to go on after exactly the text the client had at the pause.
    cut = lines.index(next(line for line in lines if line.startswith(": gps-paused")))
    before_pause = _text(_content([(0.0, line) for line in lines[:cut]]))
    continued = [m for m in probe.last_messages.remote().result() if m["continue"]]
    assert continued
    assert continued[0]["role"] == "assistant"
    assert continued[0]["content"] == before_pause
    assert _text(chunks).startswith(before_pause)
    # One usage, counting every token the client got: all it asked for (ignore_eos).
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    received = sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert usage["completion_tokens"] == TOKENS
    assert received <= TOKENS


async def whole_background_and_users(gateway: str, probe: DeploymentHandle) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=300) as client:

        async def user() -> None:
            body = chat("user", 16, stream=False)
            reply = await client.post(
                "/v1/chat/completions", json=body, headers={"X-Priority": "user"}
            )
            assert reply.status_code == 200, reply.text

        background = asyncio.create_task(
            client.post(
                "/v1/chat/completions",
                json=chat("background", TOKENS, stream=False),
                headers={"X-Priority": "background"},
            )
        )
        deadline = time.monotonic() + 120
        while not (await probe.counts.remote())["running"] and time.monotonic() < deadline:  # noqa: ASYNC110 - the engine's count
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # a few of its tokens made: there is text to go on from
        await asyncio.gather(user(), user())
        reply = await background
    assert reply.status_code == 200, reply.text
    return reply


def test_a_whole_background_answer_paused_for_users_comes_back_whole(
    gateway: str, preempting: None, probe: DeploymentHandle
) -> None:
    probe.reset_counts.remote().result()
    reply = asyncio.run(whole_background_and_users(gateway, probe))
    answer = reply.json()
    assert int(reply.headers["X-Pauses"]) >= 1

    assert answer["object"] == "chat.completion"
    text = answer["choices"][0]["message"]["content"]
    # It was paused and went on: the engine was asked to continue the text made before the pause,
    # and the answer is that text, then the rest.
    continued = [m for m in probe.last_messages.remote().result() if m["continue"]]
    assert continued
    assert continued[0]["content"]
    assert text.startswith(continued[0]["content"])
    assert len(text) > len(continued[0]["content"])
    assert answer["usage"]["completion_tokens"] == TOKENS  # all of it, over both parts


def test_a_background_stream_on_the_cpu_fallback_is_paused_and_goes_on_there(
    gateway: str, preempting_on_the_fallback: None, http: httpx.Client
) -> None:
    """The same pause and continuation on llama.cpp's server: the fallback aborts the stream,
    is asked to continue the text the client had (counted as re-prefilled tokens) and the
    client sees one answer."""
    seen, users_done = asyncio.run(background_and_users(gateway))

    lines = [line for _, line in seen]
    assert lines[-1] == "data: [DONE]"
    assert not any('"error"' in line for line in lines)
    paused = [t for t, line in seen if line.startswith(": gps-paused on=cpu-fallback")]
    resumed = [t for t, line in seen if line.startswith(": gps-resumed on=cpu-fallback")]
    assert paused, lines[:20]
    assert resumed
    assert paused[0] < min(users_done) < resumed[-1]
    assert lines[-2].startswith(": gps-pauses n=")
    chunks = _content(seen)
    assert len({c["id"] for c in chunks}) == 1
    assert sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]) == 1
    cut = lines.index(next(line for line in lines if line.startswith(": gps-paused")))
    before_pause = _text(_content([(0.0, line) for line in lines[:cut]]))
    assert before_pause
    assert len(_text(chunks)) > len(before_pause)  # it went on after the pause
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    received = sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert received <= usage["completion_tokens"] <= TOKENS  # the parts' tokens, summed
    metrics = http.get("/metrics").text
    assert 'gps_preempt_reprefill_tokens_total{backend="cpu-fallback"}' in metrics
