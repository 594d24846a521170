"""The router on real replicas: caps, breakers, KV pressure, overload shedding, replica death.

The coding backend is reached through the probe (probe.py), which counts what arrives and can
fail on demand; each role's chain fails over to the other (gateway.yaml). The replica-kill test
runs last: it takes thinker-small (a test engine) down and waits for Serve to bring it back.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from ray.serve.handle import DeploymentHandle

from tests.waiting import wait_for

ORCHESTRATOR, CODING = "orchestrator@local", "coding@local"
THINKER, THINKER_SMALL = "thinker@local", "thinker-small@local"  # the test engine
API_KEY = "test-user-key"  # its sha256 is in gateway.yaml
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def body(model: str = "coding", **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 4,
        **extra,
    }


def status(http: httpx.Client) -> dict[str, Any]:
    reply: dict[str, Any] = http.get("/v1/cluster/status").json()
    return reply


@pytest.fixture
def probe_reset(probe: DeploymentHandle, http: httpx.Client) -> Iterator[DeploymentHandle]:
    """The probe with fresh counts, switches off again afterwards, and a closed breaker."""
    probe.reset_counts.remote().result()
    yield probe
    probe.set_faulty.remote(False).result()
    probe.set_kv_cache_usage.remote(None).result()
    wait_for(
        lambda: (
            status(http)["backends"][CODING]["breaker"] == "closed"
            and not status(http)["backends"][CODING]["kv_cache_pressure"]
        ),
        60,
        "coding@local to take work again",
    )


async def concurrent(
    gateway: str, bodies: list[tuple[dict[str, Any], str]]
) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=180) as session:
        return await asyncio.gather(
            *(
                session.post("/v1/chat/completions", json=b, headers={"X-Priority": priority})
                for b, priority in bodies
            )
        )


def test_status_reports_breakers_queues_and_kv(http: httpx.Client) -> None:
    backend = status(http)["backends"][CODING]
    assert backend["breaker"] == "closed"
    assert backend["cap"] == 2
    assert backend["queue_depth"] == 0
    assert set(backend["queue_by_priority"]) == {"user", "agent", "background"}
    wait_for(
        lambda: status(http)["backends"][ORCHESTRATOR]["kv_cache_usage"] is not None,
        30,
        "a KV-cache reading from the real engine",
    )
    assert 0.0 <= status(http)["backends"][ORCHESTRATOR]["kv_cache_usage"] <= 1.0


def test_the_engines_own_counts_reach_status_and_metrics(http: httpx.Client) -> None:
    """The engine runs vLLM's priority scheduler (router.engine_priority) and answers requests
    that carry their class's number; a prompt sent twice is found in its prefix cache the
    second time (whole blocks of 128 tokens on CPU), and the router reports what the engine
    counted."""
    prompt = "Repeat after me: " + "alpha beta gamma delta " * 100
    for priority in ("background", "user"):
        reply = http.post(
            "/v1/chat/completions",
            json={**body("orchestrator"), "messages": [{"role": "user", "content": prompt}]},
            headers={"X-Priority": priority},
        )
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-backend"] == ORCHESTRATOR

    def counted() -> bool:
        backend = status(http)["backends"][ORCHESTRATOR]
        return (backend["prefix_cache_hit_rate"] or 0) > 0

    wait_for(counted, 60, "the engine's prefix-cache counts in the status")
    backend = status(http)["backends"][ORCHESTRATOR]
    assert backend["prefix_cache_queried_tokens"] >= 2 * 400
    assert isinstance(backend["engine_preemptions"], int)
    assert "engine_preemptions" not in status(http)["backends"]["cpu-fallback"]
    metrics = http.get("/metrics").text
    assert f'gps_prefix_cache_hit_tokens_total{{backend="{ORCHESTRATOR}"}}' in metrics
    assert f'gps_engine_preemptions_total{{backend="{ORCHESTRATOR}"}}' in metrics


def test_a_cap_of_two_holds_at_the_backend_and_nobody_fails(
    gateway: str, probe_reset: DeploymentHandle
) -> None:
    responses = asyncio.run(concurrent(gateway, [(body(), "user")] * 20))
    assert [r.status_code for r in responses] == [200] * 20
    assert {r.headers["x-backend"] for r in responses} == {CODING}
    counts = probe_reset.counts.remote().result()
    assert counts["calls"] == 20
    assert counts["max_running"] == 2


def test_a_failing_backend_trips_its_breaker_after_exactly_three_faults(
    http: httpx.Client, probe_reset: DeploymentHandle
) -> None:
    probe_reset.set_faulty.remote(True).result()
    replies = [http.post("/v1/chat/completions", json=body()) for _ in range(6)]
    assert [r.status_code for r in replies] == [200] * 6
    assert [r.headers["x-backend"] for r in replies] == [ORCHESTRATOR] * 6
    assert [r.headers["x-failovers"] for r in replies] == ["1"] * 3 + ["0"] * 3
    assert probe_reset.counts.remote().result()["calls"] == 3
    # Not closed: open, or half-open once the 5 s cooldown passed (the six answers above took
    # longer than that on an AVX2-only machine, in float32), until a probe or a call succeeds.
    assert status(http)["backends"][CODING]["breaker"] in ("open", "half_open")
    assert status(http)["status"] == "degraded"
    metrics = http.get("/metrics").text
    assert 'gps_breaker_transitions_total{backend="coding@local",state="open"}' in metrics
    assert 'gps_failovers_total{backend="coding@local"}' in metrics
    # Healthy again: the router's health probe closes the breaker.
    probe_reset.set_faulty.remote(False).result()
    wait_for(lambda: status(http)["backends"][CODING]["breaker"] == "closed", 30, "the breaker")
    assert http.post("/v1/chat/completions", json=body()).headers["x-backend"] == CODING


def test_kv_cache_pressure_sends_new_work_down_the_chain_until_it_falls(
    http: httpx.Client, probe_reset: DeploymentHandle
) -> None:
    probe_reset.set_kv_cache_usage.remote(0.95).result()
    wait_for(lambda: status(http)["backends"][CODING]["kv_cache_pressure"], 15, "pressure")
    assert http.post("/v1/chat/completions", json=body()).headers["x-backend"] == ORCHESTRATOR
    # Below the line but above 0.9 x 88%: hysteresis holds the pressure.
    probe_reset.set_kv_cache_usage.remote(0.85).result()
    time.sleep(3)
    assert status(http)["backends"][CODING]["kv_cache_pressure"]
    probe_reset.set_kv_cache_usage.remote(0.5).result()
    wait_for(lambda: not status(http)["backends"][CODING]["kv_cache_pressure"], 15, "relief")
    assert http.post("/v1/chat/completions", json=body()).headers["x-backend"] == CODING


def test_overload_sheds_background_with_429_and_users_see_no_errors(
    gateway: str, probe_reset: DeploymentHandle
) -> None:
    # Capacity at coding@local: 2 running + 24 queued. Background offers four times that.
    background_clients, seconds = 104, 20.0

    async def scenario() -> tuple[Counter[int], list[httpx.Response], list[str]]:
        background: Counter[int] = Counter()
        retry_after: list[str] = []
        users: list[httpx.Response] = []
        deadline = time.monotonic() + seconds
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(
            base_url=gateway, headers=HEADERS, timeout=180, limits=limits
        ) as session:

            async def background_loop() -> None:
                while time.monotonic() < deadline:
                    r = await session.post(
                        "/v1/chat/completions", json=body(), headers={"X-Priority": "background"}
                    )
                    background[r.status_code] += 1
                    if r.status_code == 429:
                        retry_after.append(r.headers.get("retry-after", ""))
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")))

            async def user_loop() -> None:
                await asyncio.sleep(2)  # let the background fill the queue first
                while time.monotonic() < deadline:
                    r = await session.post(
                        "/v1/chat/completions", json=body(), headers={"X-Priority": "user"}
                    )
                    users.append(r)

            await asyncio.gather(
                user_loop(), *(background_loop() for _ in range(background_clients))
            )
        return background, users, retry_after

    background, users, retry_after = asyncio.run(scenario())
    assert users, "no user request completed"
    assert [r.status_code for r in users] == [200] * len(users)
    assert background[429] > 0
    assert set(background) <= {200, 429}, background
    assert retry_after
    assert all(value.isdigit() for value in retry_after)


def replica_actor_names(deployment: str) -> list[str]:
    prefix = f"SERVE_REPLICA::gateway#{deployment}#"
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and actor["name"].startswith(prefix)
    ]


def breaker_openings(http: httpx.Client, backend: str) -> float:
    """How often `backend`'s breaker opened, read from the gateway's /metrics."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        for sample in family.samples
        if sample.name == "gps_breaker_transitions_total"
        and sample.labels == {"backend": backend, "state": "open"}
    )


def test_a_killed_replica_loses_no_request_and_its_breaker_closes_when_it_is_back(
    gateway: str, http: httpx.Client
) -> None:
    """On thinker-small, a test engine: the router and Serve's replacement are the subject
    (tests/chaos/test_kills.py SIGKILLs vLLM replicas under load and waits for them back)."""
    deployment = f"model:{THINKER_SMALL}"
    [victim] = replica_actor_names(deployment)
    opened_before = breaker_openings(http, THINKER_SMALL)
    # About a second each on the test engine (50 words at 0.02 s): the loops outlast the kill.
    slow = body("thinker-small", max_tokens=50)

    async def load_with_a_kill() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=180) as session:

            async def loop(results: list[httpx.Response], rounds: int) -> None:
                for _ in range(rounds):
                    results.append(await session.post("/v1/chat/completions", json=slow))

            results: list[httpx.Response] = []
            loops = [asyncio.create_task(loop(results, 8)) for _ in range(4)]
            await asyncio.sleep(1.0)
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            await asyncio.gather(*loops)
            return results

    results = asyncio.run(load_with_a_kill())
    assert [r.status_code for r in results] == [200] * len(results)
    served_by = Counter(r.headers["x-backend"] for r in results)
    # The other model of its role took the work (gateway.yaml: no chain given for reasoning).
    assert served_by[THINKER] > 0, served_by
    assert breaker_openings(http, THINKER_SMALL) > opened_before

    def back() -> bool:
        app = serve.status().applications["gateway"].deployments[deployment]
        running: bool = app.replica_states.get("RUNNING", 0) == 1
        return running and status(http)["backends"][THINKER_SMALL]["breaker"] == "closed"

    wait_for(back, 480, "Serve to replace the replica and the breaker to close")
    assert replica_actor_names(deployment) != [victim]
    reply = http.post("/v1/chat/completions", json=body("thinker-small"))
    assert (reply.status_code, reply.headers["x-backend"]) == (200, THINKER_SMALL)
