"""Every malformed chat request is a 400 (or 404, 413) with OpenAI error JSON before it reaches
the router; every well-formed one reaches it as our ChatRequest (or CompletionRequest,
EmbeddingRequest) that our own code can read, Ray can pickle, and the engine's replica reads as
vLLM's own request without a refusal (the edge keeps vLLM's strictness without importing it).
Driven through the ingress's own request handling, without Serve."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pickle
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
from pydantic import ValidationError
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest as VllmChat,
)
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.testclient import TestClient

from core.config import GatewayConfig, load_config
from core.errors import ApiError
from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest
from core.wire import ChatJob, Opening, Routed
from deployments.engine.requests import vllm_request
from deployments.fallback.engine import Finish
from deployments.fallback.openai_format import DONE, ChatShaper
from deployments.ingress import app as ingress_module
from deployments.ingress.app import Ingress
from deployments.ingress.jobs import validate_chat
from deployments.keys.ledger import KeyLedger, LocalLedger, MemorySnapshots
from policy.context.tokens import CharEstimateCounter, message_text
from policy.request import embedding_inputs, nesting_exceeds, parse_object
from policy.request.completion import single_prompt

TESTS = Path(__file__).parents[1]
GATEWAY = GatewayConfig()
API_KEY = "test-user-key"  # its sha256 is in tests/e2e/gateway.yaml


def _load(path: Path) -> Any:
    """A helper module imported by path: tests are not a package."""
    spec = importlib.util.spec_from_file_location(f"gps_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fuzz_requests = _load(TESTS / "chaos" / "fuzz_requests.py")
serve_handle = _load(TESTS / "fakes" / "serve_handle.py")


# -- the ingress, with a router that checks what reaches it ------------------------------------


class CheckingRouter:
    """What a router replica needs of a job: it pickles, and its messages read as text."""

    def __init__(self) -> None:
        self.jobs = 0
        self.chat = serve_handle.HandleMethod(self._stream)
        self.chat_once = serve_handle.HandleMethod(self._once)

    def options(self, **_: Any) -> CheckingRouter:
        return self

    def _check(self, job: ChatJob) -> tuple[Routed, ChatShaper]:
        pickle.loads(pickle.dumps(job))
        vllm_request(job.request)  # what the edge let through, the engine's replica takes
        prompt = 0
        if isinstance(job.request, ChatRequest):
            prompt = CharEstimateCounter().count_prompt(job.request.messages)
            assert all(isinstance(message_text(m), str) for m in job.request.messages)
        else:  # a completion or an embedding, with its inputs in shapes we read
            assert isinstance(job.request, CompletionRequest | EmbeddingRequest)
            if isinstance(job.request, EmbeddingRequest):
                assert embedding_inputs(job.request.input)
            else:
                assert single_prompt(job.request.prompt) is not None
        self.jobs += 1
        routed = Routed("orchestrator@local", 4, prompt, False, 0, False, False)
        return routed, ChatShaper(job.request.model or "auto", include_usage=True)

    async def _once(self, job: ChatJob) -> Opening:
        routed, shaper = self._check(job)
        return Opening(routed, shaper.whole("Hi.", Finish("stop", 1, 1)))

    def _stream(self, job: ChatJob) -> Any:
        routed, shaper = self._check(job)
        lines = [*shaper.opening("Hi."), *shaper.closing(Finish("stop", 1, 1))]
        return serve_handle.ItemStream([Opening(routed, lines)])


def http_request(body: bytes, headers: dict[str, str]) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)


async def answer(
    ingress: Ingress, body: bytes, headers: dict[str, str], path: str = "/v1/chat/completions"
) -> tuple[int, Any]:
    """(status, the error's body or the answer) as a client would get them."""
    request = http_request(body, {**headers, "Authorization": f"Bearer {API_KEY}"})
    handler = {
        "/v1/chat/completions": ingress._chat,
        "/v1/completions": ingress._complete,
        "/v1/embeddings": ingress._embed,
    }[path]
    try:
        response: Response = await handler(request, time.perf_counter())
    except ApiError as error:
        return error.status, error.body()
    if isinstance(response, StreamingResponse):
        return response.status_code, [part async for part in response.body_iterator]
    return response.status_code, json.loads(bytes(response.body))


@pytest.fixture(scope="module")
def router() -> CheckingRouter:
    return CheckingRouter()


@pytest.fixture(scope="module")
def ingress(router: CheckingRouter) -> Ingress:
    config = load_config(TESTS / "e2e" / "gateway.yaml", environ={})
    ledger = LocalLedger(KeyLedger("unit", store=MemorySnapshots()))
    return Ingress(config, router, lambda: ledger)


def assert_openai_error(body: Any) -> None:
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["code"], str)
    json.dumps(body)  # what the client gets is JSON


def swept(
    ingress: Ingress, router: CheckingRouter, requests: Any, monkeypatch: pytest.MonkeyPatch
) -> Counter[tuple[str, int]]:
    """Each request's (kind, status); every refusal OpenAI error JSON with a client's status,
    every 200 a job the router got, and none refused by vLLM's schema as a last resort."""
    outcomes: Counter[tuple[str, int]] = Counter()
    last_resort = Mock()
    monkeypatch.setattr(ingress_module.logger, "warning", last_resort)

    async def sweep() -> None:
        for request in requests:
            status, body = await answer(ingress, request.body, request.headers, request.path)
            outcomes[request.kind, status] += 1
            if status == 200 and request.path == "/v1/chat/completions":
                streamed = isinstance(body, list)
                assert "".join(body).endswith(DONE) if streamed else body["choices"], request
            elif status != 200:
                assert status in (400, 404, 413), (request, body)
                assert_openai_error(body)

    jobs = router.jobs
    asyncio.run(sweep())
    assert sum(n for (_, status), n in outcomes.items() if status == 200) == router.jobs - jobs
    assert not last_resort.call_args_list, "vLLM's schema refused what our rules let through"
    return outcomes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_fuzzed_request_is_answered_or_refused_with_openai_error(
    ingress: Ingress, router: CheckingRouter, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = swept(ingress, router, fuzz_requests.fuzz(seed, 1000), monkeypatch)
    kinds = {kind for kind, _ in outcomes}
    assert kinds == set(fuzz_requests.MUTATIONS), "a mutation class was never drawn"
    refused = {kind for (kind, status) in outcomes if status != 200}
    assert refused == kinds, "a class that never fails"


@pytest.mark.parametrize("draw", ["fuzz_completions", "fuzz_embeddings"])
def test_every_fuzzed_completion_and_embedding_is_served_or_refused_by_our_rules(
    ingress: Ingress, router: CheckingRouter, draw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = swept(ingress, router, getattr(fuzz_requests, draw)(7, 600), monkeypatch)
    assert {status for _, status in outcomes} >= {200, 400}


# -- one rule at a time -------------------------------------------------------------------------


def chat(**overrides: Any) -> dict[str, Any]:
    body = {"model": "orchestrator", "messages": [{"role": "user", "content": "Hi."}]}
    return {**body, "max_tokens": 4, **overrides}


def user(content: Any) -> dict[str, Any]:
    return chat(messages=[{"role": "user", "content": content}])


def refusal(payload: dict[str, Any], gateway: GatewayConfig = GATEWAY) -> ApiError:
    with pytest.raises(ApiError) as raised:
        validate_chat(payload, gateway)
    assert raised.value.status == 400
    return raised.value


# A 1x1 PNG.
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
TOOL = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}

REFUSED = {
    # vLLM's cross-field rules, which its JSON Schema cannot say: refused here as its classes do.
    "continue and a generation prompt": (
        chat(continue_final_message=True, add_generation_prompt=True),
        "continue_final_message",
    ),
    "two structured output kinds": (
        chat(structured_outputs={"json": {"type": "object"}, "regex": "a+"}),
        "structured_outputs",
    ),
    "prompt logprobs streamed": (chat(prompt_logprobs=1, stream=True), "prompt_logprobs"),
    "messages not a list": (chat(messages={"role": "user"}), "messages"),
    "no messages": (chat(messages=[]), "messages"),
    "message not an object": (chat(messages=["hi"]), "messages[0]"),
    "unknown role": (chat(messages=[{"role": "bogus", "content": "x"}]), "messages[0].role"),
    "role of the wrong case": (
        chat(messages=[{"role": "User", "content": "x"}]),
        "messages[0].role",
    ),
    "no content": (chat(messages=[{"role": "user"}]), "messages[0].content"),
    "content an object": (user({"text": "hi"}), "messages[0].content"),
    "content a number": (user(5), "messages[0].content"),
    "part a string": (user(["hi"]), "messages[0].content[0]"),
    "part of no type": (user([{"text": "hi"}]), "messages[0].content[0].type"),
    "part of an odd type": (user([{"type": "bogus"}]), "messages[0].content[0].type"),
    "file part": (
        user([{"type": "file", "file": {"file_id": "f"}}]),
        "messages[0].content[0].type",
    ),
    "text not a string": (user([{"type": "text", "text": 5}]), "messages[0].content[0].text"),
    "text missing": (user([{"type": "text"}]), "messages[0].content[0].text"),
    "image url not an object": (
        user([{"type": "image_url", "image_url": "http://x"}]),
        "messages[0].content[0].image_url",
    ),
    "image detail": (
        user([{"type": "image_url", "image_url": {"url": PNG, "detail": "max"}}]),
        "messages[0].content[0].image_url.detail",
    ),
    # No door into the network: an image comes inline, never as a URL an engine would fetch.
    **{
        f"image url {url[:24]}": (
            user([{"type": "image_url", "image_url": {"url": url}}]),
            "messages[0].content[0].image_url.url",
        )
        for url in (
            "http://169.254.169.254/latest/meta-data/",
            "https://example.com/cat.png",
            "file:///etc/passwd",
            "HTTP://[::1]/a.png",
            "data:,",
            "data:text/plain;base64,aGk=",
            "data:image/png,rawbytes",
            "data:image/png;base64,!!not base64!!",
        )
    },
    "audio format": (
        user([{"type": "input_audio", "input_audio": {"data": "AA", "format": "ogg"}}]),
        "messages[0].content[0].input_audio.format",
    ),
    "image in a system message": (
        chat(messages=[{"role": "system", "content": [{"type": "image_url"}]}]),
        "messages[0].content[0].type",
    ),
    "assistant without content or calls": (
        chat(messages=[{"role": "assistant", "content": None}]),
        "messages[0].content",
    ),
    "tool without its call id": (
        chat(messages=[{"role": "tool", "content": "12:00"}]),
        "messages[0].tool_call_id",
    ),
    "tool call without id": (
        chat(messages=[{"role": "assistant", "tool_calls": [{**CALL, "id": None}]}]),
        "messages[0].tool_calls[0].id",
    ),
    "name not a string": (
        chat(messages=[{"role": "user", "content": "x", "name": 5}]),
        "messages[0].name",
    ),
    "temperature above 2": (chat(temperature=2.5), "temperature"),
    "temperature a string": (chat(temperature="0.5"), "temperature"),
    "top_p above 1": (chat(top_p=1.5), "top_p"),
    "top_p zero": (chat(top_p=0), "top_p"),
    "presence_penalty": (chat(presence_penalty=-3), "presence_penalty"),
    "frequency_penalty": (chat(frequency_penalty=2.5), "frequency_penalty"),
    "max_tokens zero": (chat(max_tokens=0), "max_tokens"),
    "max_tokens a float": (chat(max_tokens=2.0), "max_tokens"),
    "max_tokens a boolean": (chat(max_tokens=True), "max_tokens"),
    "max_tokens past int64": (chat(max_tokens=2**63), "max_tokens"),
    "max_completion_tokens negative": (chat(max_completion_tokens=-1), "max_completion_tokens"),
    "n zero": (chat(n=0), "n"),
    "n above 128": (chat(n=129), "n"),
    "seed a string": (chat(seed="42"), "seed"),
    "seed past int64": (chat(seed=2**64), "seed"),
    "logprobs a number": (chat(logprobs=1), "logprobs"),
    "top_logprobs above 20": (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    "top_logprobs without logprobs": (chat(top_logprobs=2), "top_logprobs"),
    "stream a string": (chat(stream="true"), "stream"),
    "stream_options a list": (chat(stream=True, stream_options=[1]), "stream_options"),
    "stream_options without stream": (
        chat(stream_options={"include_usage": True}),
        "stream_options",
    ),
    "include_usage a string": (
        chat(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
    ),
    "stop a number": (chat(stop=5), "stop"),
    "stop of numbers": (chat(stop=[1]), "stop"),
    "five stops": (chat(stop=["a"] * 5), "stop"),
    "logit_bias a list": (chat(logit_bias=[1]), "logit_bias"),
    "logit_bias key not a token id": (chat(logit_bias={"x": 1}), "logit_bias"),
    "logit_bias out of range": (chat(logit_bias={"15": 101}), "logit_bias.15"),
    "response_format a string": (chat(response_format="json"), "response_format"),
    "response_format type": (chat(response_format={"type": "xml"}), "response_format.type"),
    "json_schema without schema": (
        chat(response_format={"type": "json_schema"}),
        "response_format.json_schema",
    ),
    "tools empty": (chat(tools=[]), "tools"),
    "tool without function": (chat(tools=[{"type": "function"}]), "tools[0].function"),
    "tool of another type": (chat(tools=[{**TOOL, "type": "code"}]), "tools[0].type"),
    "tool parameters a string": (
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        "tools[0].function.parameters",
    ),
    "tool_choice a list": (chat(tools=[TOOL], tool_choice=["auto"]), "tool_choice"),
    "tool_choice unknown": (chat(tools=[TOOL], tool_choice="any"), "tool_choice"),
    "tool_choice without tools": (chat(tool_choice="required"), "tool_choice"),
    "tool_choice naming no tool": (
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "later"}}),
        "tool_choice.function.name",
    ),
    "tool_choice without a function": (
        chat(tools=[TOOL], tool_choice={"type": "function"}),
        "tool_choice.function",
    ),
    "user a number": (chat(user=5), "user"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_each_rule_refuses_its_field_by_name(case: str) -> None:
    payload, param = REFUSED[case]
    error = refusal(json.loads(json.dumps(payload)))
    assert (error.code, error.param) == ("invalid_request", param)
    assert param in error.message


ACCEPTED = {
    "plain": chat(),
    "text parts": user([{"type": "text", "text": "Hi."}, {"type": "text", "text": ""}]),
    "image part": user([{"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}]),
    "image part, scheme in capitals": user(
        [{"type": "image_url", "image_url": {"url": PNG.replace("data:image", "DATA:image")}}]
    ),
    "audio part": user([{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]),
    "developer and system": chat(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
            {"role": "user", "content": "Hi."},
        ]
    ),
    "tool round trip": chat(
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "now"}},
        messages=[
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
        ],
    ),
    "assistant refusal part": chat(
        messages=[
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
            {"role": "user", "content": "Please."},
        ]
    ),
    "edges of every range": chat(
        temperature=0,
        top_p=1,
        presence_penalty=-2,
        frequency_penalty=2.0,
        n=2,
        seed=-(2**63),
        logprobs=True,
        top_logprobs=20,
        logit_bias={"15": -100},
        stop=["a", "b", "c", "d"],
        max_completion_tokens=1,
    ),
    "nulls where optional": chat(temperature=None, stop=None, stream_options=None, tools=None),
    "stream options with stream": chat(stream=True, stream_options={"include_usage": True}),
    "empty stream options": chat(stream_options={}),
    "json schema": chat(response_format={"type": "json_schema", "json_schema": {"name": "a"}}),
    "unknown fields pass": chat(metadata={"a": "b"}, service_tier="auto"),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_well_formed_requests_pass(case: str) -> None:
    request = validate_chat(json.loads(json.dumps(ACCEPTED[case])), GATEWAY)
    assert isinstance(request, ChatRequest)
    pickle.dumps(request)
    assert isinstance(vllm_request(request), VllmChat)


@pytest.mark.parametrize(
    "limits", [{"max_json_depth": 4}, {"max_json_depth": 513}, {"max_messages": 0}]
)
def test_the_limits_are_validated_config(limits: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        GatewayConfig(**limits)


def test_message_count_is_a_limit_of_its_own_from_config() -> None:
    few = GatewayConfig(max_messages=2)
    messages = [{"role": "user", "content": "x"}] * 3
    error = refusal(chat(messages=messages), few)
    assert (error.code, error.param) == ("too_many_messages", "messages")
    assert validate_chat(chat(messages=messages[:2]), few).messages


# -- the body as JSON ---------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    """A chat body whose deepest value sits `depth` levels down (the body itself is one)."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return json.dumps(chat(metadata="X")).replace('"X"', inner).encode()


def parse_error(body: bytes, gateway: GatewayConfig = GATEWAY) -> ApiError:
    with pytest.raises(ApiError) as raised:
        parse_object(body, gateway.max_json_depth)
    assert raised.value.status == 400
    return raised.value


def test_nesting_up_to_the_limit_passes_and_one_more_is_refused() -> None:
    limit = GATEWAY.max_json_depth
    assert parse_object(nested(limit), GATEWAY.max_json_depth)["model"] == "orchestrator"
    assert parse_error(nested(limit + 1)).code == "json_too_deep"


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_nesting_deeper_than_python_recurses_is_refused_without_recursion(depth: int) -> None:
    for body in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        assert parse_error(body).code == "json_too_deep"
    assert parse_error(b"[" * depth).code == "json_too_deep"  # never closed


def test_brackets_inside_strings_do_not_count() -> None:
    text = '"[[[[[[[[[[ \\" {{{{{{{{{{ \\\\"'
    assert not nesting_exceeds(f'{{"a": [{text}, {text}]}}'.encode(), 3)
    assert nesting_exceeds(b'{"a": [[["]"]]]}', 3)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000])
def test_numbers_no_field_can_hold_are_invalid_json(token: str) -> None:
    body = json.dumps(chat(temperature="X")).replace('"X"', token).encode()
    error = parse_error(body)
    assert error.code == "invalid_json"
    assert "Traceback" not in error.message


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff x", "\\udc00\\ud800"])
def test_a_lone_surrogate_is_invalid_json_and_a_pair_is_fine(escape: str) -> None:
    body = json.dumps(user("X")).replace('"X"', f'"{escape}"').encode()
    assert parse_error(body).code == "invalid_json"
    pair = json.dumps(user("X")).replace('"X"', '"\\ud83d\\ude00"').encode()
    assert parse_object(pair, GATEWAY.max_json_depth)["messages"][0]["content"] == "\U0001f600"


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf"])
def test_bytes_that_are_not_utf8_are_invalid_json(bad: bytes) -> None:
    body = json.dumps(user("X")).encode().replace(b"X", bad)
    assert "not UTF-8" in parse_error(body).message


def test_a_utf8_byte_order_mark_is_tolerated() -> None:
    assert parse_object(b"\xef\xbb\xbf" + json.dumps(chat()).encode(), GATEWAY.max_json_depth)[
        "messages"
    ]


@pytest.mark.parametrize("body", [b"[]", b'"x"', b"1", b"null", b""])
def test_only_an_object_is_a_request(body: bytes) -> None:
    assert parse_error(body).code in {"invalid_request", "invalid_json"}


# -- what the framework refuses before our code runs --------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("PUT", "/v1/chat/completions", 405, "method_not_allowed"),
        ("POST", "/v1/chat/complete", 404, "not_found"),
    ],
)
def test_routing_refusals_are_openai_errors_too(
    method: str, path: str, status: int, code: str
) -> None:
    reply = TestClient(ingress_module.app).request(method, path)
    assert reply.status_code == status
    assert reply.json()["error"]["code"] == code


def test_an_error_names_the_request_id_serve_tagged_its_log_lines_with() -> None:
    # Serve's proxy puts X-Request-ID on every request (the client's, or one it makes).
    client = TestClient(ingress_module.app)
    named = client.post("/v1/chat/complete", headers={"X-Request-ID": "req-7f3a"})
    assert named.status_code == 404
    assert named.json()["error"]["request_id"] == "req-7f3a"
    assert named.json()["error"]["code"] == "not_found"
    assert "request_id" not in client.post("/v1/chat/complete").json()["error"]


@pytest.mark.parametrize(
    "case",
    ["continue and a generation prompt", "two structured output kinds", "prompt logprobs streamed"],
)
def test_the_cross_field_rules_are_vllms_own(case: str) -> None:
    payload, _ = REFUSED[case]
    request = ChatRequest.model_validate(payload)  # our type takes it; vLLM's classes do not
    refused = False
    try:
        vllm_request(request)
    except Exception:  # noqa: BLE001 - VLLMValidationError, or pydantic's
        refused = True
    assert refused
