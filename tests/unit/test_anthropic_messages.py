"""Anthropic's Messages API at the edge (deployments/ingress/anthropic): its requests as chat
bodies the chat path validates, chat answers and streams as Anthropic's Message and events, and
the gateway's errors in Anthropic's shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from core.config import GatewayConfig, hash_key, parse_config
from core.errors import ApiError, ErrorCode
from core.requests import ChatRequest
from deployments.ingress.anthropic.answer import to_message
from deployments.ingress.anthropic.errors import anthropic_body, anthropic_status
from deployments.ingress.anthropic.events import MessageEvents
from deployments.ingress.anthropic.http import anthropic_stream, authorization
from deployments.ingress.anthropic.request import BILLING_HEADER, to_chat, to_counted
from deployments.ingress.app import Ingress
from deployments.ingress.jobs import validate_chat
from deployments.keys.ledger import KeyLedger, LocalLedger, MemorySnapshots
from tests.fakes import serve_handle
from tests.fakes.http_request import response_text

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agent_requests"


def claude_code_request() -> dict[str, Any]:
    recorded = json.loads((FIXTURES / "claude_code_2.1.328_first.json").read_text())
    body: dict[str, Any] = recorded["body"]
    return body


def test_claude_codes_recorded_request_is_a_chat_the_chat_path_accepts() -> None:
    body = claude_code_request()
    chat = to_chat(body)
    validate_chat(dict(chat), GatewayConfig())  # vLLM's schema and ours: no 400
    system = chat["messages"][0]
    assert system["role"] == "system"
    assert not system["content"].startswith(BILLING_HEADER)
    assert BILLING_HEADER not in json.dumps(chat["messages"])
    assert system["content"].startswith("You are a Claude agent")
    # The system message between the turns keeps its place; the user's text its blocks.
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system"]
    assert chat["messages"][1]["content"].endswith("Reply OK")
    assert len(chat["tools"]) == len(body["tools"]) == 12
    first = chat["tools"][0]["function"]
    assert (first["name"], first["parameters"]) == (
        body["tools"][0]["name"],
        body["tools"][0]["input_schema"],
    )
    # What chat has no word for is not carried, nor refused.
    assert not {"thinking", "context_management", "output_config", "metadata"} & set(chat)
    assert chat["max_tokens"] == 32000  # clamped by fitting, as chat's is
    assert chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    assert chat["user"] == json.loads(json.dumps(body["metadata"]["user_id"]))


def test_a_tool_round_trip_becomes_tool_calls_and_a_tool_message_in_order() -> None:
    body = {
        "model": "coding",
        "max_tokens": 64,
        "system": [{"type": "text", "text": f"{BILLING_HEADER}: cc_version=1; nonce=9;"}],
        "messages": [
            {"role": "user", "content": "Read notes.txt"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "s"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "n"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"},
                    {"type": "text", "text": "What does it say?", "cache_control": {"t": 1}},
                ],
            },
        ],
        "tools": [
            {"name": "Read", "description": "Reads", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["\n\nHuman:"],
        "top_k": 5,
    }
    chat = to_chat(body)
    validate_chat(dict(chat), GatewayConfig())
    assert chat["messages"] == [  # the billing header alone was the system prompt: none left
        {"role": "user", "content": "Read notes.txt"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"path": "n"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "hello"},
        {"role": "user", "content": "What does it say?"},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["Read"]  # no engine searches
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == ("required", False)
    assert (chat["stop"], chat["top_k"]) == (["\n\nHuman:"], 5)
    assert "stream" not in chat


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}, "model"),
        ({"model": "coding", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": "coding", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "coding", "max_tokens": 5, "messages": [{"role": "bot"}]}, "messages.0.role"),
        (
            {"model": "coding", "max_tokens": 5, "messages": [{"role": "user", "content": [{}]}]},
            "messages.0.content.0.type",
        ),
        (
            {
                "model": "coding",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "a", "input_schema": {}}],
                "tool_choice": {"type": "tool", "name": "b"},
            },
            "tool_choice.name",
        ),
        # Images come inline: a url source would have an engine fetch it.
        (
            {"model": "coding", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/a.png"}},
            ]}]},
            "messages.0.content.0.source.url",
        ),
        (
            {"model": "coding", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "!!"}},
            ]}]},
            "messages.0.content.0.source.data",
        ),
    ],
)  # fmt: skip
def test_what_anthropics_api_refuses_is_a_400_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as raised:
        to_chat(body)
    assert (raised.value.status, raised.value.param) == (400, param)
    assert anthropic_body(raised.value)["error"]["type"] == "invalid_request_error"


def test_count_tokens_needs_no_max_tokens_and_counts_the_tools_too() -> None:
    body = claude_code_request()
    del body["max_tokens"]
    messages, tools = to_counted(body)
    assert (messages[0]["role"], len(tools)) == ("system", 12)


@pytest.mark.parametrize(
    ("status", "code", "shown", "kind"),
    [
        (400, ErrorCode.INVALID_REQUEST, 400, "invalid_request_error"),
        (401, ErrorCode.INVALID_API_KEY, 401, "authentication_error"),
        (403, ErrorCode.MODEL_NOT_ALLOWED, 403, "permission_error"),
        (404, ErrorCode.MODEL_NOT_FOUND, 404, "not_found_error"),
        (413, ErrorCode.REQUEST_TOO_LARGE, 413, "request_too_large"),
        (429, ErrorCode.RATE_LIMITED, 429, "rate_limit_error"),
        (429, ErrorCode.OVERLOADED, 529, "overloaded_error"),
        (503, ErrorCode.BACKEND_UNAVAILABLE, 529, "overloaded_error"),
        (500, ErrorCode.INTERNAL_ERROR, 500, "api_error"),
    ],
)
def test_errors_take_anthropics_types_and_statuses(
    status: int, code: ErrorCode, shown: int, kind: str
) -> None:
    error = ApiError(status, code, "why")
    assert anthropic_status(error.status, error.code) == shown
    assert anthropic_body(error, "req-1") == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
        "request_id": "req-1",
    }


def test_the_key_comes_from_x_api_key_or_a_bearer_header() -> None:
    assert authorization({"x-api-key": " k1 "}) == "Bearer k1"
    assert authorization({"authorization": "Bearer k2"}) == "Bearer k2"
    assert authorization({}) is None


def test_a_whole_answer_is_a_message_with_thinking_text_and_tool_use() -> None:
    completion: dict[str, Any] = {
        "id": "chatcmpl-abc",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "reasoning": "Think.",
                    "content": "Here.",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "Read", "arguments": '{"p": 1}'}},
                        {"id": "c2", "function": {"name": "Bad", "arguments": "{not json"}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7},
    }
    message = to_message(completion, "claude-sonnet-4")
    assert message["id"] == "msg_abc"
    assert message["model"] == "claude-sonnet-4"
    assert message["content"] == [
        {"type": "thinking", "thinking": "Think.", "signature": ""},
        {"type": "text", "text": "Here."},
        {"type": "tool_use", "id": "c1", "name": "Read", "input": {"p": 1}},
        {"type": "tool_use", "id": "c2", "name": "Bad", "input": {"raw": "{not json"}},
    ]
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)
    assert (message["usage"]["input_tokens"], message["usage"]["output_tokens"]) == (12, 7)
    stopped = {**completion["choices"][0], "finish_reason": "stop", "stop_reason": "END"}
    answer = to_message({**completion, "choices": [stopped]}, "m")
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("stop_sequence", "END")
    cut = {**completion["choices"][0], "finish_reason": "length"}
    assert to_message({**completion, "choices": [cut]}, "m")["stop_reason"] == "max_tokens"


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return "data: " + json.dumps({"id": "chatcmpl-s1", "choices": [choice]}) + "\n\n"


def events_of(text: str) -> list[dict[str, Any]]:
    """Each event's data, checked against its `event:` line."""
    found = []
    for raw in text.split("\n\n"):
        if not raw.strip():
            continue
        kind_line, data_line = raw.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert kind_line == f"event: {data['type']}"
        found.append(data)
    return found


LS_CALL = {"name": "Ls", "arguments": "{}"}
CHAT_STREAM = "".join(
    [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "Hm"}),
        chunk({"reasoning": "m."}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({"tool_calls": [{"index": 0, "id": "t0", "function": {"name": "Read"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": 1}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "t1", "function": LS_CALL}]}),
        chunk({}, "tool_calls"),
        'data: {"id": "chatcmpl-s1", "choices": [], "usage": {"prompt_tokens": 9, '
        '"completion_tokens": 6}}\n\n',
        "data: [DONE]\n\n",
    ]
)  # fmt: skip


@pytest.mark.parametrize("cut", [1, 7, 50, len(CHAT_STREAM)])
def test_a_stream_becomes_anthropics_events_in_order_however_it_is_cut(cut: int) -> None:
    events = MessageEvents("claude-x", 0)
    parts = [CHAT_STREAM[i : i + cut] for i in range(0, len(CHAT_STREAM), cut)]
    out = "".join(events.feed(part) for part in parts) + events.end()
    found = events_of(out)
    kinds = [e["type"] for e in found]
    assert (kinds[0], kinds[-2:]) == ("message_start", ["message_delta", "message_stop"])
    assert (found[0]["message"]["id"], found[0]["message"]["model"]) == ("msg_s1", "claude-x")
    blocks = [e for e in found if e["type"] == "content_block_start"]
    assert [(b["index"], b["content_block"]["type"]) for b in blocks] == [
        (0, "thinking"), (1, "text"), (2, "tool_use"), (3, "tool_use"),
    ]  # fmt: skip
    assert [b["content_block"].get("id") for b in blocks[2:]] == ["t0", "t1"]
    # Each block's deltas come between its start and its stop, of its own kind only.
    open_index = None
    deltas: dict[int, str] = {}
    for e in found:
        if e["type"] == "content_block_start":
            assert open_index is None
            open_index = e["index"]
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_index
            delta = e["delta"]
            piece = delta.get("thinking") or delta.get("text") or delta.get("partial_json")
            deltas[e["index"]] = deltas.get(e["index"], "") + piece
        elif e["type"] == "content_block_stop":
            assert e["index"] == open_index
            open_index = None
    assert open_index is None
    assert deltas == {0: "Hmm.", 1: "Hello", 2: '{"path": 1}', 3: "{}"}
    delta = found[-2]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 9, "output_tokens": 6}
    assert events.end() == ""  # over: nothing more


def test_an_error_after_the_stream_began_is_an_error_event_and_the_end() -> None:
    events = MessageEvents("m", 0)
    failed = 'data: {"error": {"message": "no link could finish", "code": "backend_failed"}}\n\n'
    out = events.feed(chunk({"content": "Hi"}) + failed + chunk({"content": "late"}))
    found = events_of(out + events.end())
    assert [e["type"] for e in found] == [
        "message_start", "content_block_start", "content_block_delta", "error",
    ]  # fmt: skip
    assert found[-1]["error"] == {"type": "api_error", "message": "no link could finish"}


def test_a_stream_that_said_nothing_still_opens_and_closes_the_message() -> None:
    events = MessageEvents("m", 0)
    found = events_of(events.feed(chunk({}, "length")) + events.end())
    assert [e["type"] for e in found] == ["message_start", "message_delta", "message_stop"]
    assert found[1]["delta"]["stop_reason"] == "max_tokens"


# --- through the ingress, with a router that answers like an engine ------------------------------

E2E = Path(__file__).parents[1] / "e2e"
KEY = "unit-key"


def ingress_of(router: serve_handle.EngineLikeRouter) -> Ingress:
    raw = yaml.safe_load((E2E / "gateway.yaml").read_text())
    raw["api_keys"] = [{"name": "unit", "sha256": hash_key(KEY)}]
    raw.setdefault("gateway", {})["model_patterns"] = {"claude-*": "orchestrator"}
    ledger = LocalLedger(KeyLedger("unit", store=MemorySnapshots()))
    return Ingress(parse_config(raw, base_dir=E2E, environ={}), router, lambda: ledger)


def post(body: dict[str, Any], headers: dict[str, str]) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/messages",
        "query_string": b"beta=true",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    chunks = [{"type": "http.request", "body": json.dumps(body).encode()}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)


def test_the_ingress_answers_a_message_as_the_chat_job_it_routed() -> None:
    router = serve_handle.EngineLikeRouter()
    ingress = ingress_of(router)
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 9,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    response = asyncio.run(ingress.messages(post(body, {"x-api-key": KEY})))
    message = json.loads(asyncio.run(response_text(response)))
    assert (response.status_code, message["type"], message["model"]) == (
        200,
        "message",
        "claude-sonnet-4-5",
    )
    assert message["content"] == [{"type": "text", "text": "Hi."}]
    assert message["usage"]["input_tokens"] > 0
    assert response.headers["x-backend"] == "orchestrator@local"
    [job] = router.jobs
    assert isinstance(job.request, ChatRequest)
    assert (job.model, job.caller, job.request.max_tokens) == ("orchestrator", "unit", 9)


def test_the_ingress_streams_a_message_as_anthropics_events() -> None:
    router = serve_handle.EngineLikeRouter()
    ingress = ingress_of(router)
    body = {
        "model": "claude-x",
        "max_tokens": 9,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    response = asyncio.run(ingress.messages(post(body, {"authorization": f"Bearer {KEY}"})))
    found = events_of(asyncio.run(response_text(response)))
    assert [e["type"] for e in found] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert found[2]["delta"] == {"type": "text_delta", "text": "Hi."}
    assert found[4]["usage"]["output_tokens"] > 0


def test_the_ingress_refuses_a_bad_key_in_anthropics_shape() -> None:
    ingress = ingress_of(serve_handle.EngineLikeRouter())
    body = {"model": "claude-x", "max_tokens": 9, "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(ApiError) as refused:
        asyncio.run(ingress.messages(post(body, {"x-api-key": "wrong"})))
    assert anthropic_body(refused.value)["error"]["type"] == "authentication_error"


def test_a_call_forced_by_name_is_a_tool_use_though_vllm_ends_it_as_stop() -> None:
    call = {"id": "c1", "function": {"name": "Read", "arguments": "{}"}}
    completion = {
        "id": "chatcmpl-f",
        "choices": [{"message": {"tool_calls": [call]}, "finish_reason": "stop"}],
    }
    assert to_message(completion, "m")["stop_reason"] == "tool_use"
    events = MessageEvents("m", 0)
    tool = {"index": 0, "id": "c1", "function": {"name": "Read", "arguments": "{}"}}
    found = events_of(events.feed(chunk({"tool_calls": [tool]}, "stop")) + events.end())
    assert found[-2]["delta"]["stop_reason"] == "tool_use"


def test_a_keep_alive_while_an_answer_waits_is_a_ping() -> None:
    events = MessageEvents("m", 0)
    found = events_of(events.feed(chunk({"content": "Hi"}) + ": gps-waiting\n\n"))
    assert found[-1] == {"type": "ping"}


def test_a_tool_choice_whose_name_is_not_a_string_is_a_400() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "a", "input_schema": {}}],
        "tool_choice": {"type": "tool", "name": []},
    }
    with pytest.raises(ApiError) as raised:
        to_chat(body)
    assert raised.value.status == 400


async def _after(seconds: float, outcome: Any) -> Any:
    await asyncio.sleep(seconds)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _chat_stream() -> StreamingResponse:
    parts = [chunk({"role": "assistant", "content": "Hi"}), chunk({}, "stop"), "data: [DONE]\n\n"]
    return StreamingResponse(iter(parts), media_type="text/event-stream", headers={"x-a": "1"})


def test_a_stream_whose_answer_comes_at_once_is_the_answer_with_its_headers() -> None:
    async def answered() -> Response:
        answer = asyncio.ensure_future(_after(0, _chat_stream()))
        return await anthropic_stream(answer, "m", ping_s=5)

    response = asyncio.run(answered())
    assert response.headers["x-a"] == "1"  # the router's own answer: its headers kept
    found = events_of(asyncio.run(response_text(response)))
    assert [e["type"] for e in found] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert found[0]["message"]["id"] == "msg_s1"  # named by the answer: it came at once


def test_a_stream_that_waits_in_a_queue_is_begun_and_pinged_until_its_answer_comes() -> None:
    async def waited() -> list[dict[str, Any]]:
        answer = asyncio.ensure_future(_after(0.35, _chat_stream()))
        response = await anthropic_stream(answer, "m", ping_s=0.1)
        return events_of(await response_text(response))

    found = asyncio.run(waited())
    kinds = [e["type"] for e in found]
    assert kinds[0] == "message_start"
    assert kinds[1:3] == ["ping", "ping"]  # while it waited
    assert kinds[kinds.index("content_block_start") :] == [
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop",
    ]  # fmt: skip
    assert "ping" not in kinds[kinds.index("content_block_start") :]
    # One message: the answer's events follow the early start, which named it.
    assert kinds.count("message_start") == 1
    assert found[0]["message"]["id"].startswith("msg_")
    assert found[0]["message"]["id"] != "msg_s1"


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        (ErrorCode.OVERLOADED, 429, "overloaded_error"),
        (ErrorCode.RATE_LIMITED, 429, "rate_limit_error"),
        (ErrorCode.CONTEXT_LENGTH_EXCEEDED, 400, "invalid_request_error"),
    ],
)
def test_a_refusal_after_the_stream_began_is_an_error_event_in_anthropics_shape(
    code: ErrorCode, status: int, kind: str
) -> None:
    async def refused() -> list[dict[str, Any]]:
        answer = asyncio.ensure_future(_after(0.25, ApiError(status, code, "No room.")))
        response = await anthropic_stream(answer, "m", ping_s=0.1)
        return events_of(await response_text(response))

    found = asyncio.run(refused())
    assert found[0]["type"] == "message_start"
    assert found[-1] == {"type": "error", "error": {"type": kind, "message": "No room."}}


def test_a_refusal_within_the_ping_interval_keeps_its_http_status() -> None:
    async def refused() -> None:
        answer = asyncio.ensure_future(_after(0, ApiError(429, ErrorCode.RATE_LIMITED, "Slow.")))
        await anthropic_stream(answer, "m", ping_s=5)

    with pytest.raises(ApiError) as raised:
        asyncio.run(refused())
    assert raised.value.status == 429


def test_a_client_that_leaves_while_its_stream_waits_cancels_the_job() -> None:
    async def left() -> bool:
        answer = asyncio.ensure_future(_after(30, _chat_stream()))
        response = await anthropic_stream(answer, "m", ping_s=0.05)
        assert isinstance(response, StreamingResponse)
        events = response.body_iterator
        assert isinstance(events, AsyncGenerator)
        await anext(events)  # message_start
        await anext(events)  # a ping
        await events.aclose()
        return answer.cancelled()

    assert asyncio.run(left())


class ClientGoneError(Exception):
    """The connection went before the first event was sent."""


def test_a_client_gone_before_the_begun_stream_was_sent_cancels_the_job() -> None:
    async def gone() -> bool:
        answer = asyncio.ensure_future(_after(30, _chat_stream()))
        response = await anthropic_stream(answer, "m", ping_s=0.05)

        async def send(message: Any) -> None:
            raise ClientGoneError

        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        with pytest.raises(ClientGoneError):
            await response({"type": "http", "method": "POST", "headers": []}, receive, send)
        return answer.cancelled()

    assert asyncio.run(gone())


def test_an_answer_no_one_reads_any_more_is_closed_so_its_slot_is_settled() -> None:
    settled: list[bool] = []

    async def relay() -> AsyncGenerator[str, None]:
        try:
            yield chunk({"role": "assistant", "content": "Hi"})
            yield "data: [DONE]\n\n"
        finally:
            settled.append(True)  # relay_sse settles its key's slot and usage here

    async def left() -> None:
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        response = await anthropic_stream(answer, "m", ping_s=0.05)
        assert isinstance(response, StreamingResponse)
        events = response.body_iterator
        assert isinstance(events, AsyncGenerator)
        await anext(events)  # message_start; the answer comes while the client reads it
        answer.set_result(StreamingResponse(relay(), media_type="text/event-stream"))
        await events.aclose()

    asyncio.run(left())
    assert settled == [True]


def test_a_failure_of_the_gateway_after_the_stream_began_is_an_api_error_event() -> None:
    async def failed() -> list[dict[str, Any]]:
        answer = asyncio.ensure_future(_after(0.15, RuntimeError("the router died")))
        response = await anthropic_stream(answer, "m", ping_s=0.05)
        return events_of(await response_text(response))

    found = asyncio.run(failed())
    assert found[0]["type"] == "message_start"
    assert found[-1]["type"] == "error"
    assert found[-1]["error"]["type"] == "api_error"
