"""Keys with limits on a real app: two ingress and two router replicas over the session's
engines, the official openai SDK as the client, the ledger actor shared by every replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import ray
from openai.types.chat import ChatCompletionMessageParam
from ray import serve

from cluster.app import build_gateway
from core.config import ApiKeyConfig, ClusterConfig, GatewayConfig, hash_key
from deployments.keys.ledger import SNAPSHOT_S, ensure_key_ledger, ledger_actor_name
from deployments.keys.metering import FLUSH_S
from policy.key_limits import KeyLimits

APP = "limits"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
LONG: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}
]
KEYS: dict[str, tuple[str, dict[str, Any]]] = {
    "five": ("five-a-minute", {"rpm": 5}),
    "tpm": ("sixty-tokens", {"tpm": 60}),
    "meter": ("metered", {}),
    "budget": ("one-token-a-day", {"budget_tokens": 1, "budget_period": "day"}),
    "ops": ("ops-admin", {"admin": True}),
}


@pytest.fixture(scope="module")
def limits_url(gateway: str, config: ClusterConfig) -> Iterator[str]:
    """A second gateway app (2 ingress + 2 router replicas) over the session's running
    engines, with keys that carry limits. The router as its own deployment: with the router in
    the ingress (the default) the ledger is the only state the replicas share, and this app
    shows it holds for routers that are not in the ingress either."""
    keys = tuple(
        ApiKeyConfig(name=name, sha256=hash_key(secret), **limits)
        for name, (secret, limits) in KEYS.items()
    )
    gateway_config = GatewayConfig(**{
        **config.gateway.model_dump(), "ingress_replicas": 2, "router_replicas": 2,
        "router_in_ingress": False,
    })  # fmt: skip
    limited = config.model_copy(update={"api_keys": keys, "gateway": gateway_config})
    handles = {
        name: serve.get_deployment_handle(target.deployment_name, app_name="gateway")
        for name, target in config.targets.items()
    }
    serve.run(build_gateway(limited, handles), name=APP, route_prefix=f"/{APP}")
    yield f"{gateway}/{APP}"
    serve.delete(APP)


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS[key][0], max_retries=0, timeout=120)


def ask(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="orchestrator", messages=HELLO, max_tokens=4, **extra
    )


def test_both_replicas_of_ingress_and_router_run(limits_url: str) -> None:
    app = serve.status().applications[APP]
    for name in ("ingress", "router"):
        assert app.deployments[name].replica_states.get("RUNNING") == 2, name


def test_sixth_request_in_a_minute_is_429_with_openai_headers(limits_url: str) -> None:
    # Six at once: the ledger's decisions are made as they arrive, all within the minute however
    # long the answers take on a loaded machine (one after another, a first answer slower than
    # 60 s let the next one in: run of f17e99f); the two ingress replicas race for one count.
    client = sdk(limits_url, "five")
    with ThreadPoolExecutor(max_workers=6) as pool:
        outcomes = list(pool.map(lambda _: answer_or_refusal(client), range(6)))
    answers = [o for o in outcomes if not isinstance(o, openai.RateLimitError)]
    refusals = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    remaining = sorted(a.headers["x-ratelimit-remaining-requests"] for a in answers)
    assert remaining == ["0", "1", "2", "3", "4"]  # one count across both ingress replicas
    assert all(float(a.headers["x-gateway-overhead-ms"]) >= 0 for a in answers)
    [error] = refusals
    assert error.code == "rate_limited"
    headers = error.response.headers
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(headers["retry-after"]) <= 60
    assert "x-gateway-overhead-ms" in headers


def answer_or_refusal(client: openai.OpenAI) -> Any:
    try:
        return ask(client)
    except openai.RateLimitError as refused:
        return refused


def test_a_spent_budget_survives_a_restart_of_the_ledger_and_a_router(limits_url: str) -> None:
    client = sdk(limits_url, "budget")
    first = ask(client)
    assert first.headers["x-budget-limit-tokens"] == "1"
    # Booked within FLUSH_S of the answer (by the next admission on the same ingress replica,
    # or a batch); the next request may go to the other replica.
    time.sleep(FLUSH_S * 2)
    with pytest.raises(openai.RateLimitError) as spent:
        ask(client)
    assert spent.value.code == "budget_exceeded"
    time.sleep(SNAPSHOT_S + 1)  # the ledger's snapshot is in the GCS
    before = ledger_started(limits_url)
    ray.kill(ray.get_actor(ledger_actor_name(APP), namespace="serve"), no_restart=False)
    [router, *_] = [
        r for r in ray.util.list_named_actors(all_namespaces=True) if f"{APP}#router#" in r["name"]
    ]
    ray.kill(ray.get_actor(router["name"], namespace=router["namespace"]), no_restart=False)
    deadline = time.monotonic() + 120
    while ledger_started(limits_url) == before:  # the next answer comes from a new incarnation
        assert time.monotonic() < deadline, "the ledger actor was not restarted"
        time.sleep(0.5)
    ledger = admin_usage(limits_url)["ledger"]
    assert ledger["restored_from_snapshot"] is True
    while True:
        try:
            ask(client)
        except openai.RateLimitError as error:
            code = error.code
            break
        except openai.APIError:  # a replica is being replaced
            assert time.monotonic() < deadline
            time.sleep(1)
            continue
        pytest.fail("a restarted ledger forgot the key's spent budget")
    assert code == "budget_exceeded"


def admin_usage(url: str) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {KEYS['ops'][0]}"}
    answer = httpx.get(f"{url}/v1/keys/usage", headers=admin, timeout=60)
    assert answer.status_code == 200, answer.text
    usage: dict[str, Any] = answer.json()
    return usage


def ledger_started(url: str) -> float:
    started: float = admin_usage(url)["ledger"]["started_at"]
    return started


def test_one_long_answer_crosses_the_tpm_and_the_next_is_refused(limits_url: str) -> None:
    client = sdk(limits_url, "tpm")
    raw = client.chat.completions.with_raw_response.create(
        model="orchestrator", messages=LONG, max_tokens=64
    )
    usage = raw.parse().usage
    assert usage is not None
    assert usage.total_tokens > 60
    assert raw.headers["x-ratelimit-limit-tokens"] == "60"
    time.sleep(FLUSH_S * 2)  # booked (see the budget test)
    with pytest.raises(openai.RateLimitError) as refused:
        ask(client)
    assert "tokens per minute" in refused.value.message
    assert refused.value.response.headers["x-ratelimit-remaining-tokens"] == "0"


def test_stream_usage_is_booked_without_showing_it(limits_url: str) -> None:
    client = sdk(limits_url, "meter")
    stream = client.chat.completions.create(
        model="orchestrator", messages=HELLO, max_tokens=6, stream=True
    )
    chunks = list(stream)
    assert all(chunk.usage is None for chunk in chunks)  # not asked for, not shown
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    deadline = time.monotonic() + 10
    while True:  # settling is sent after the stream's end, not awaited
        usage = admin_usage(limits_url)["keys"]["meter"]
        if usage["completion_tokens"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert usage["requests"] == 1
    # The engine's count, not the chunks': tokens that end mid-character (or that a tool
    # parser holds back) share a chunk, so there are at most as many chunks as tokens.
    booked = usage["completion_tokens"]
    assert len(content) <= booked <= 6
    assert usage["prompt_tokens"] > 0
    assert usage["in_flight"] == 0
    metrics = httpx.get(f"{limits_url}/metrics").text
    assert f'gps_key_tokens_total{{key="meter",kind="completion"}} {booked}.0' in metrics


def test_usage_is_for_admin_keys_only(limits_url: str) -> None:
    answer = httpx.get(
        f"{limits_url}/v1/keys/usage", headers={"Authorization": f"Bearer {KEYS['meter'][0]}"}
    )
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "admin_only"


def test_a_ledger_of_an_older_protocol_is_stopped_and_its_meters_carry_on(
    limits_url: str,
) -> None:
    @ray.remote(num_cpus=0)
    class OldLedger:
        def admit(self, key: str, limits: Any, lease: str, lease_s: float, settled: Any) -> None:
            pass  # protocol 1: no `want`; new replicas must never call it

    app = "upgraded"
    old = OldLedger.options(  # type: ignore[attr-defined]
        name=ledger_actor_name(app, protocol=1), namespace="serve", lifetime="detached"
    ).remote()
    ray.get(old.admit.remote("k", None, "l", 1.0, ()))
    ledger = ensure_key_ledger(app, "serve", {})
    verdict = asyncio.run(ledger.admit("k", KeyLimits(rpm=3), "lease", 60.0, (), 1))
    assert verdict.admitted
    assert not _named(ledger_actor_name(app, protocol=1))  # stopped, and not restarted
    ray.kill(ray.get_actor(ledger_actor_name(app), namespace="serve"))


def _named(name: str, wait_s: float = 30) -> bool:
    """Whether an actor of that name is alive, once a kill had time to land."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace="serve")
        except ValueError:
            return False
        time.sleep(0.5)
    return True
