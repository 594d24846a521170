"""Seeded bad and odd requests under load on the shared e2e app (fuzz_requests.py; the agents'
APIs, fuzz_agent_apis.py): no answer is a 5xx, every 4xx is an error in its API's own shape
(OpenAI's; Anthropic's on /v1/messages), every 200 is a whole answer, and afterwards no
breaker opened, no request failed over and no replica was replaced. A client's mistake never
costs a backend. Runs before test_kills.py (file order), which replaces replicas on purpose."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray.util.state import list_actors

from cluster.ray_runtime import this_cluster

API_KEY = "test-user-key"  # tests/e2e/gateway.yaml
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
SEED = int(os.environ.get("GPS_FUZZ_SEED", "13"))  # a failure replays from its seed and index
COUNT = 1200
COMPLETION_COUNT = 400
EMBEDDING_COUNT = 300
RESPONSES_COUNT = 300
MESSAGES_COUNT = 300
CONCURRENCY = 8
# Most requests are refused in milliseconds; the valid ones cost an engine at most 4 tokens
# (about a second each on 2 cores, two engines at a time), but a conversation of 10,001 or
# 20,000 turns is fitted to 4,000 tokens of prompt, whose prefill took tens of seconds on an
# AVX2-only machine beside the suites of phase 2, where eight of them queued at one engine:
# 2 and 8 of 1,900 requests ran past a timeout of 120 s (clean-clone run and CI's of b8df5d9),
# while the app lets a request wait 240 s for a slot alone (gateway.yaml's queue_timeout_s).
# The timeout is past what the app allows, so only a hang runs into it. Still bounded.
DEADLINE_S = 1800
REQUEST_TIMEOUT_S = 600
SETTLE_S = 300  # earlier tests may leave a breaker half-open; its probe closes it
# Counters that grow only when a backend is charged with a fault or a job moves down its chain.
FAULT_METRICS = ("gps_backend_faults_total", "gps_failovers_total", "gps_backend_oom_total")


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"gps_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fuzz_requests = _load(Path(__file__).with_name("fuzz_requests.py"))
fuzz_agent_apis = _load(Path(__file__).with_name("fuzz_agent_apis.py"))


def breakers(http: httpx.Client) -> dict[str, str]:
    backends = http.get("/v1/cluster/status").json()["backends"]
    return {name: state["breaker"] for name, state in backends.items() if "breaker" in state}


def replicas() -> set[str]:
    """The gateway's live replica actors (a replaced replica comes back under a new id)."""
    actors = list_actors(this_cluster(), filters=[("state", "=", "ALIVE")], limit=10_000)
    return {
        str(actor.get("name"))
        for actor in actors
        if str(actor.get("name") or "").startswith("SERVE_REPLICA::gateway#")
    }


def fault_counts(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    counts: dict[str, float] = {}
    for name in FAULT_METRICS:
        samples = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        counts[name] = sum(float(value) for value in samples)
    counts["breaker opened"] = sum(
        float(value)
        for value in re.findall(
            r'^gps_breaker_transitions_total{[^}]*state="open"[^}]*} (\S+)$', text, re.MULTILINE
        )
    )
    return counts


def settled(http: httpx.Client) -> dict[str, str]:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        states = breakers(http)
        if states and all(state == "closed" for state in states.values()):
            return states
        time.sleep(2)
    pytest.fail(f"breakers not closed before fuzzing: {breakers(http)}")


def problem(path: str, status: int, content_type: str, text: str) -> str | None:
    """What is wrong with an answer to a request for `path`, or None."""
    if status >= 500:
        return "a 5xx"
    if path == fuzz_agent_apis.MESSAGES_PATH:
        return anthropic_problem(status, content_type, text)
    if path == fuzz_agent_apis.RESPONSES_PATH and status < 400:
        return response_problem(content_type, text)
    if status >= 400:
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            return "a 4xx that is not OpenAI error JSON"
        complete = isinstance(error, dict) and error.get("message") and error.get("code")
        return None if complete and error.get("type") else "an incomplete OpenAI error"
    if content_type.startswith("text/event-stream"):
        if 'data: {"error"' in text:
            return "an SSE error event in a 200 stream"
        return None if text.rstrip().endswith("data: [DONE]") else "a stream without [DONE]"
    try:
        answer = json.loads(text)
        if answer.get("object") == "list":  # embeddings: one vector per input
            return None if answer["data"] else "embeddings without vectors"
        return None if answer["choices"] else "an answer without choices"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "a 200 that is not a completion or embeddings"


def anthropic_problem(status: int, content_type: str, text: str) -> str | None:
    if status >= 400:
        try:
            body = json.loads(text)
            error = body["error"]
            complete = body["type"] == "error" and error["type"] and error["message"]
        except (ValueError, KeyError, TypeError):
            return "a 4xx that is not Anthropic error JSON"
        return None if complete else "an incomplete Anthropic error"
    if content_type.startswith("text/event-stream"):
        events = re.findall(r"^event: (\S+)$", text, re.MULTILINE)
        if "error" in events:
            # A stream begun while it waited for a slot (pings) says a refusal as an error
            # event, the client's 4xx it would otherwise have been; never the gateway's own.
            waited = set(events[: events.index("error")]) <= {"message_start", "ping"}
            internal = '"type": "api_error"' in text
            return None if waited and not internal else "an error event in a 200 stream"
        ends = events[:1] == ["message_start"] and events[-1:] == ["message_stop"]
        return None if ends else "a stream not from message_start to message_stop"
    try:
        return None if json.loads(text)["type"] == "message" else "a 200 that is not a message"
    except (ValueError, KeyError, TypeError):
        return "a 200 that is not a message"


def response_problem(content_type: str, text: str) -> str | None:
    if content_type.startswith("text/event-stream"):
        events = re.findall(r"^event: (\S+)$", text, re.MULTILINE)
        if any(kind in ("error", "response.failed") for kind in events):
            return "a failure event in a 200 stream"
        ended = events[-1:] in (["response.completed"], ["response.incomplete"])
        return None if events[:1] == ["response.created"] and ended else "an unfinished stream"
    try:
        answer = json.loads(text)
        whole = answer["object"] == "response" and answer["status"] in ("completed", "incomplete")
    except (ValueError, KeyError, TypeError):
        return "a 200 that is not a response"
    return None if whole else "a 200 that is not a finished response"


async def send_all(gateway: str, requests: Any) -> tuple[list[str], dict[tuple[str, int], int]]:
    failures: list[str] = []
    outcomes: dict[tuple[str, int], int] = {}
    slots = asyncio.Semaphore(CONCURRENCY)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S)
    async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=timeout) as session:

        async def send(index: int, request: Any) -> None:
            async with slots:
                try:
                    reply = await session.post(
                        request.path, content=request.body, headers=request.headers
                    )
                except httpx.HTTPError as error:
                    failures.append(f"#{index} {request.kind}: no answer ({error!r})")
                    return
            key = (request.kind, reply.status_code)
            outcomes[key] = outcomes.get(key, 0) + 1
            kind = reply.headers.get("content-type", "")
            wrong = problem(request.path, reply.status_code, kind, reply.text)
            if wrong is not None:
                failures.append(f"#{index} {request.kind}: {wrong}: {reply.text[:300]!r}")

        await asyncio.gather(*(send(index, request) for index, request in enumerate(requests)))
    return failures, outcomes


def test_fuzzed_requests_get_no_5xx_and_cost_no_backend(gateway: str, http: httpx.Client) -> None:
    settled(http)
    before = (replicas(), fault_counts(http))

    started = time.monotonic()
    requests = [
        *fuzz_requests.fuzz(SEED, COUNT),
        *fuzz_requests.fuzz_completions(SEED, COMPLETION_COUNT),
        *fuzz_requests.fuzz_embeddings(SEED, EMBEDDING_COUNT),
        *fuzz_agent_apis.fuzz_responses(SEED, RESPONSES_COUNT),
        *fuzz_agent_apis.fuzz_messages(SEED, MESSAGES_COUNT),
    ]
    failures, outcomes = asyncio.run(asyncio.wait_for(send_all(gateway, requests), DEADLINE_S))
    by_status: dict[int, int] = {}
    for (_, status), count in outcomes.items():
        by_status[status] = by_status.get(status, 0) + count
    kinds = len({kind for kind, _ in outcomes})
    print(  # the figures, with `pytest tests/chaos/test_fuzz.py -s`
        f"fuzz seed {SEED}: {len(requests)} requests of {kinds} mutation classes in "
        f"{time.monotonic() - started:.0f} s: by status {dict(sorted(by_status.items()))}"
    )

    total = len(requests)
    assert not failures, f"{len(failures)} of {total} (seed {SEED}):\n" + "\n".join(failures[:20])
    assert sum(outcomes.values()) == total
    assert any(status == 200 for _, status in outcomes), "no valid request was served"
    assert set(breakers(http).values()) == {"closed"}
    assert (replicas(), fault_counts(http)) == before, "a client's mistake cost a backend"
    # The app still serves.
    hello = [{"role": "user", "content": "Hi."}]
    reply = http.post(
        "/v1/chat/completions", json={"model": "orchestrator", "messages": hello, "max_tokens": 4}
    )
    assert reply.status_code == 200, reply.text
