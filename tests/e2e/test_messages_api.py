"""Anthropic's Messages API through the gateway with the official `anthropic` SDK, on the shared
app's vLLM engines: the same router, keys and fitting as chat. A whole message, a stream read
event by event (its block lifecycle and the deltas adding up to the final message), a tool call
forced by name and its result answered, `count_tokens` equal to what the engine counted, and
each error in Anthropic's own shape and status."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import API_KEY

MODEL = "smollm2"  # orchestrator's alias (tests/e2e/gateway.yaml): tools on, the hermes parser
HI: Any = [{"role": "user", "content": "Say hello to Ada."}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city now.",
    # An enum bounds the value: a free string may run past max_tokens unclosed.
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def claude(gateway: str) -> anthropic.Anthropic:
    """The SDK as Claude Code's is set up: its key in `x-api-key`, the gateway's address."""
    return anthropic.Anthropic(base_url=gateway, api_key=API_KEY, max_retries=0, timeout=120)


def test_a_message_is_answered_through_the_router_with_its_headers(
    claude: anthropic.Anthropic,
) -> None:
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, messages=HI, extra_body={"temperature": 0}
    )
    message = raw.parse()
    assert message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    [block] = message.content
    assert block.type == "text"
    assert block.text
    assert message.stop_reason in {"end_turn", "max_tokens"}
    assert message.usage.input_tokens > 5
    assert 0 < message.usage.output_tokens <= 8
    # The gateway's own headers: the same path as a chat.
    assert raw.headers["x-backend"] == "orchestrator@local"
    assert raw.headers["x-priority"] in {"user", "agent", "background"}
    assert "x-gateway-overhead-ms" in raw.headers


def test_a_stream_keeps_anthropics_block_lifecycle_and_adds_up_to_its_message(
    claude: anthropic.Anthropic,
) -> None:
    kinds: list[str] = []
    text = ""
    with claude.messages.stream(model=MODEL, max_tokens=16, messages=HI) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = stream.get_final_message()
    # The SDK's own events: ours, and those it derives (`text` from each text delta).
    ours = [k for k in kinds if k not in ("text", "input_json", "thinking", "signature")]
    assert ours[0] == "message_start"
    assert ours[1] == "content_block_start"
    assert set(ours[2:-3]) == {"content_block_delta"}
    assert ours[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.id.startswith("msg_")
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason in {"end_turn", "max_tokens"}
    assert final.usage.input_tokens > 5
    assert final.usage.output_tokens > 0


def test_a_tool_forced_by_name_comes_back_as_tool_use_and_its_result_is_answered(
    claude: anthropic.Anthropic,
) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = claude.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    )
    calls = [b for b in first.content if b.type == "tool_use"]
    assert calls, first
    call = calls[0]
    assert call.name == "get_weather"
    assert call.id
    assert call.input["city"] in {"Paris", "Oslo", "Rome"}
    assert first.stop_reason == "tool_use"
    result: Any = {"type": "tool_result", "tool_use_id": call.id, "content": "21 C, clear"}
    second = claude.messages.create(
        model=MODEL,
        max_tokens=16,
        messages=[
            *ask,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
        tools=[WEATHER],
    )
    assert second.stop_reason in {"end_turn", "max_tokens", "tool_use"}
    assert second.content


def test_count_tokens_is_what_the_engine_counted(claude: anthropic.Anthropic) -> None:
    system = "You answer in one word."
    counted = claude.messages.count_tokens(model=MODEL, system=system, messages=HI)
    answered = claude.messages.create(model=MODEL, max_tokens=2, system=system, messages=HI)
    assert counted.input_tokens == answered.usage.input_tokens > 0


def test_errors_come_in_anthropics_shape(gateway: str, claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=gateway, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=4, messages=HI
        )
    assert refused.value.status_code == 401
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=HI)
    assert missing.value.body["type"] == "error"  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=gateway, headers=headers, timeout=60) as http:
        no_max = http.post("/v1/messages?beta=true", json={"model": MODEL, "messages": HI})
        not_json = http.post(
            "/v1/messages", content=b"{", headers={"content-type": "application/json"}
        )
        unknown_route = http.post("/v1/messages/batches", json={})
    for reply in (no_max, not_json):
        assert reply.status_code == 400, reply.text
        body = reply.json()
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"]
    assert "max_tokens" in no_max.json()["error"]["message"]
    assert unknown_route.status_code in {404, 405}
    assert unknown_route.json()["type"] == "error"


def test_fields_the_gateway_cannot_honour_are_accepted_and_ignored(gateway: str) -> None:
    """As Claude Code sends them: `?beta=true`, betas, thinking, cache_control, a billing
    header, context management and whatever comes next."""
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; nonce=1;"},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": json.dumps({"session_id": "s-1"})},
        "a_field_from_next_year": {"anything": [1, 2]},
    }
    headers = {
        "authorization": f"Bearer {API_KEY}",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    }
    reply = httpx.post(f"{gateway}/v1/messages?beta=true", json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["type"] == "message"
