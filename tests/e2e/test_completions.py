"""`/v1/completions` through the gateway with the official `openai` SDK: a raw prompt on vLLM's
CPU engine, whole and streamed, echo and logprobs, an over-long prompt fitted by keeping its end,
fill-in-the-middle refused clearly by a model without FIM tokens, and a completion that fails
over down its chain like a chat."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from ray.serve.handle import DeploymentHandle

PROMPT = "def add(a, b):\n    "


def test_a_prompt_is_completed_with_usage(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0
    )
    completion = raw.parse()
    assert completion.object == "text_completion"
    [choice] = completion.choices
    assert choice.text
    assert choice.finish_reason in {"length", "stop"}
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 8
    assert raw.headers["x-backend"] == "orchestrator@local"
    assert raw.headers["x-context-fitted"] == "false"
    assert float(raw.headers["x-gateway-overhead-ms"]) >= 0


def test_a_streamed_completion_ends_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="smollm2",
        prompt=PROMPT,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None
    assert 0 < usage.completion_tokens <= 8
    assert len({c.id for c in chunks}) == 1


def test_echo_and_logprobs_come_back(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=4, echo=True, logprobs=2, temperature=0
    )
    [choice] = completion.choices
    assert choice.text.startswith(PROMPT)
    assert choice.logprobs is not None
    assert choice.logprobs.tokens
    assert choice.logprobs.top_logprobs


def test_an_over_long_prompt_keeps_its_end(http: httpx.Client) -> None:
    # vision's window is 1536 tokens (tests/e2e/gateway.yaml): this prompt is about 3000.
    lines = "".join(f"x{i} = {i}\n" for i in range(600))
    body = {"model": "vision", "prompt": lines + "total = x599 +", "max_tokens": 8, "echo": True}
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-context-fitted"] == "true"
    assert reply.json()["usage"]["prompt_tokens"] + 8 <= 1536
    echoed = reply.json()["choices"][0]["text"]  # the prompt as sent, then the completion
    assert "x599 = 599\ntotal = x599 +" in echoed  # the end stayed
    assert "x0 = 0\n" not in echoed  # the beginning went


def test_a_suffix_to_a_model_without_fim_tokens_is_a_clear_400(http: httpx.Client) -> None:
    body = {"model": "smollm2", "prompt": "def f(", "suffix": "):\n    pass", "max_tokens": 8}
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "fim_not_supported"
    assert "fill-in-the-middle" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "smollm2"}, "prompt"),
        ({"model": "smollm2", "prompt": ["one", "two"]}, "prompt"),
        ({"model": "smollm2", "prompt": [1, -2]}, "prompt[1]"),
        ({"model": "smollm2", "prompt": "x", "logprobs": 99}, "logprobs"),
        ({"model": "smollm2", "prompt": [1, 2], "suffix": "x"}, "suffix"),
    ],
)
def test_bad_completions_are_400s_naming_the_field(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


@pytest.fixture
def faulty_coding(probe: DeploymentHandle, http: httpx.Client) -> Iterator[None]:
    probe.set_faulty.remote(True).result()
    yield
    probe.set_faulty.remote(False).result()
    breaker = http.get("/v1/cluster/status").json()["backends"]["coding@local"]["breaker"]
    assert breaker == "closed"  # one fault opens no breaker


@pytest.mark.usefixtures("faulty_coding")
def test_a_completion_fails_over_down_its_chain(http: httpx.Client) -> None:
    body = {"model": "coding", "prompt": PROMPT, "max_tokens": 4}
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-backend"] != "coding@local"
    assert int(reply.headers["x-failovers"]) >= 1
    assert reply.json()["choices"][0]["text"] is not None
