"""The gateway through the official openai SDK and raw HTTP: happy paths and bad inputs."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import openai
import pytest

from core.config import ClusterConfig
from tests.e2e.gateway_calls import HELLO, assert_openai_error, assert_serves, chat_body

LIMITED_KEY = "test-orchestrator-only"  # gateway.yaml's orchestrator-only key


def test_lists_roles_aliases_and_auto(client: openai.OpenAI, config: ClusterConfig) -> None:
    ids = {model.id for model in client.models.list()}
    assert ids == {
        "orchestrator",
        "coding",
        "vision",
        "embedding",
        "smollm2",
        "smollm2-coder",
        "smollm2-embed",
        "vision-sql",
        "reasoning",
        "thinker",
        "thinker-small",
        "auto",
    }
    assert ids == set(config.served_names)


def test_completes_a_chat(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=HELLO, max_tokens=8
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 8
    assert completion.usage.prompt_tokens > 0
    assert raw.headers["x-backend"] == "orchestrator@local"


@pytest.mark.parametrize(
    ("model", "backend"),
    [("coding", "coding@local"), ("smollm2-coder", "coding@local"), ("auto", "orchestrator@local")],
)
def test_model_names_route_to_their_role(client: openai.OpenAI, model: str, backend: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=HELLO, max_tokens=4
    )
    assert raw.headers["x-backend"] == backend
    assert raw.parse().choices[0].message.content


def test_streams_chunks_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="coding",
        messages=HELLO,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2
    assert text
    assert chunks[-1].usage is not None
    assert 1 <= chunks[-1].usage.completion_tokens <= 8


def test_stream_ends_with_done_on_the_wire(http: httpx.Client) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-backend"] == "orchestrator@local"
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert "usage" in json.loads(events[-2].removeprefix("data: "))


def test_client_that_hangs_up_mid_stream_loses_nothing(http: httpx.Client) -> None:
    body = chat_body(stream=True, max_tokens=64)
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        next(response.iter_lines())
    assert_serves(http)


BAD_BODIES = {
    "malformed_json": (b'{"model": "smollm2", "messages": [', 400, "invalid_json"),
    "not_an_object": (b"[1, 2]", 400, "invalid_request"),
    "messages_wrong_type": (json.dumps(chat_body(messages="hi")).encode(), 400, "invalid_request"),
    "max_tokens_wrong_type": (
        json.dumps(chat_body(max_tokens="many")).encode(),
        400,
        "invalid_request",
    ),
    "missing_model": (json.dumps({"messages": HELLO}).encode(), 400, "missing_model"),
    "empty_messages": (json.dumps(chat_body(messages=[])).encode(), 400, "invalid_request"),
    "zero_max_tokens": (json.dumps(chat_body(max_tokens=0)).encode(), 400, "invalid_request"),
    "unknown_model": (json.dumps(chat_body(model="gpt-17")).encode(), 404, "model_not_found"),
}


@pytest.mark.parametrize("case", BAD_BODIES)
def test_bad_body_gets_openai_error_and_app_keeps_serving(http: httpx.Client, case: str) -> None:
    content, status, code = BAD_BODIES[case]
    response = http.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert_openai_error(response, status, code)
    assert_serves(http)


def test_one_model_card_and_an_unknown_id(client: openai.OpenAI, http: httpx.Client) -> None:
    card = client.models.retrieve("smollm2-coder")
    assert (card.id, card.owned_by) == ("smollm2-coder", "gpu-pool-serve")
    extra = card.model_extra or {}
    assert (extra["model"], extra["role"], extra["aliases"]) == (
        "coding",
        "coding",
        ["smollm2-coder"],
    )
    assert_openai_error(http.get("/v1/models/gpt-17"), 404, "model_not_found")


def test_a_key_limited_to_one_model_uses_it_and_nothing_else(gateway: str) -> None:
    """`api_keys[].models`: the orchestrator under its name and alias; any other name is a 403,
    whether it exists or not; the list shows only what the key may use."""
    limited = openai.OpenAI(
        base_url=f"{gateway}/v1", api_key=LIMITED_KEY, max_retries=0, timeout=120
    )
    assert {m.id for m in limited.models.list()} == {"orchestrator", "smollm2"}
    raw = limited.chat.completions.with_raw_response.create(
        model="smollm2", messages=HELLO, max_tokens=2
    )
    assert raw.headers["x-backend"] == "orchestrator@local"
    for name in ("coding", "gpt-17", "auto"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            limited.chat.completions.create(model=name, messages=HELLO, max_tokens=2)
        assert refused.value.code == "model_not_allowed", name


def test_unknown_model_through_the_sdk(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-17", messages=HELLO, max_tokens=4)
    assert "gpt-17" in str(raised.value)


def test_oversized_body_gets_413(http: httpx.Client, config: ClusterConfig) -> None:
    limit = config.gateway.max_body_bytes
    big = chat_body(messages=[{"role": "user", "content": "x" * (limit + 1)}])
    assert_openai_error(http.post("/v1/chat/completions", json=big), 413, "request_too_large")
    assert_serves(http)


def test_oversized_chunked_body_without_length_gets_413(
    http: httpx.Client, config: ClusterConfig
) -> None:
    def chunks() -> Any:
        yield b'{"model": "smollm2", "messages": [{"role": "user", "content": "'
        for _ in range(config.gateway.max_body_bytes // 65536 + 2):
            yield b"x" * 65536
        yield b'"}]}'

    response = http.post("/v1/chat/completions", content=chunks())
    assert "content-length" not in response.request.headers
    assert_openai_error(response, 413, "request_too_large")
    assert_serves(http)


@pytest.mark.parametrize(
    ("headers", "code"),
    [({}, "missing_api_key"), ({"Authorization": "Bearer not-a-key"}, "invalid_api_key")],
)
def test_missing_or_wrong_key_gets_401(
    gateway: str, http: httpx.Client, headers: dict[str, str], code: str
) -> None:
    response = httpx.post(f"{gateway}/v1/chat/completions", json=chat_body(), headers=headers)
    assert_openai_error(response, 401, code)
    assert httpx.get(f"{gateway}/v1/models", headers=headers).status_code == 401
    assert_serves(http)


def test_wrong_key_through_the_sdk(gateway: str) -> None:
    intruder = openai.OpenAI(base_url=f"{gateway}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        intruder.models.list()


@pytest.mark.parametrize(
    ("claimed", "granted"),
    [(None, "agent"), ("user", "user"), ("background", "background"), ("USER", "user")],
)
def test_priority_header_within_the_keys_cap(
    http: httpx.Client, claimed: str | None, granted: str
) -> None:
    headers = {"X-Priority": claimed} if claimed else {}
    response = http.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-priority"] == granted


def test_invalid_priority_gets_400(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=chat_body(), headers={"X-Priority": "vip"})
    assert_openai_error(response, 400, "invalid_priority")


def test_unknown_path_gets_openai_404(http: httpx.Client) -> None:
    assert_openai_error(http.get("/v1/nothing-here"), 404, "not_found")


def test_a_clients_request_id_comes_back_on_answers_and_errors(http: httpx.Client) -> None:
    ours = {"X-Request-ID": f"e2e-{uuid.uuid4()}"}
    answered = http.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=ours)
    assert answered.status_code == 200
    assert answered.headers["x-request-id"] == ours["X-Request-ID"]
    refused = http.post("/v1/chat/completions", json=chat_body(max_tokens=0), headers=ours)
    assert (
        assert_openai_error(refused, 400, "invalid_request")["request_id"] == ours["X-Request-ID"]
    )


def test_healthz_reports_every_backend_up(gateway: str) -> None:
    health = httpx.get(f"{gateway}/healthz").json()
    assert health["status"] == "ok"
    assert set(health["backends"]) == {
        "orchestrator@local",
        "coding@local",
        "vision@local",
        "embedding@local",
        "thinker@local",
        "thinker-small@local",
        "cpu-fallback",
    }
    assert health["backends"]["cpu-fallback"]["role"] is None  # it serves any role
    assert all(b["state"] == "up" for b in health["backends"].values())


def test_cluster_status_needs_a_key_and_shows_placements(gateway: str, http: httpx.Client) -> None:
    assert httpx.get(f"{gateway}/v1/cluster/status").status_code == 401
    status = http.get("/v1/cluster/status").json()
    assert status["placements"] == {
        "orchestrator@local": "local",
        "coding@local": "local",
        "vision@local": "local",
        "embedding@local": "local",
        "thinker@local": "local",
        "thinker-small@local": "local",
    }
    assert list(status["pools"]) == ["local"]
    # The cluster manager sees this machine's node in the pool, alive and sound, and Serve
    # coding's replica running (the manager's first round, or the router's read of Serve's
    # status, may still be under way on a loaded machine).
    for _ in range(240):
        status = http.get("/v1/cluster/status").json()
        local = status["pools"]["local"]
        if local["nodes"] and status["backends"]["coding@local"]["running_replicas"]:
            break
        time.sleep(0.5)
    assert local["state"] == "healthy"
    assert local["kind"] == "local"
    assert len(local["nodes"]) == 1, local
    assert isinstance(status["events"], list)
    assert status["backends"]["coding@local"]["running_replicas"] == 1, status["backends"]


def test_metrics_count_answers_by_status(http: httpx.Client) -> None:
    http.post("/v1/chat/completions", json=chat_body(model="gpt-17"))
    text = http.get("/metrics").text
    assert 'gps_requests_total{endpoint="chat",status="404"}' in text
    assert "gps_response_start_seconds_bucket" in text
