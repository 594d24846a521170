"""OpenAI's Responses API through the gateway with the official `openai` SDK, on the shared
app's vLLM engines: the same router, keys and fitting as chat. A whole response, a stream read
through the SDK's own stream state (which checks order and item identities) with its deltas
adding up to the final text, a function call forced by name and its output answered, a
`text.format` json_schema honoured, and a stored response continued by another request,
retrieved, listed and deleted."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

MODEL = "smollm2"  # orchestrator's alias (tests/e2e/gateway.yaml): tools on, the hermes parser
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    # An enum bounds the value: a free string may run past max_tokens unclosed.
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]}},
        "required": ["city"],
    },
}


def test_a_response_is_answered_through_the_router_with_its_headers(
    client: openai.OpenAI,
) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Say hello to Ada.", max_output_tokens=8, store=False
    )
    response = raw.parse()
    assert response.id.startswith("resp_")
    assert response.status in {"completed", "incomplete"}
    assert response.output_text
    assert response.usage is not None
    assert response.usage.input_tokens > 5
    assert 0 < response.usage.output_tokens <= 8
    assert raw.headers["x-backend"] == "orchestrator@local"
    assert "x-gateway-overhead-ms" in raw.headers


def test_a_stream_passes_the_sdks_own_checks_and_adds_up_to_its_response(
    client: openai.OpenAI,
) -> None:
    kinds: list[str] = []
    text = ""
    last: Any = None
    with client.responses.stream(
        model=MODEL,
        instructions="You are brief.",
        input=[{"role": "user", "content": "Say hello to Ada."}],
        max_output_tokens=16,
        store=False,
    ) as stream:
        for event in stream:  # the SDK's stream state checks each event as it comes
            kinds.append(event.type)
            last = event
            if event.type == "response.output_text.delta":
                text += event.delta
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # Cut by max_output_tokens it is incomplete (as OpenAI's), else completed.
    assert kinds[-1] in {"response.completed", "response.incomplete"}
    final = last.response
    assert [e for e in kinds if e.startswith("response.output_item")] == [
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert final.output_text == text
    assert final.id.startswith("resp_")
    assert final.usage is not None
    assert final.usage.output_tokens > 0


def test_a_function_forced_by_name_comes_back_as_a_call_and_its_output_is_answered(
    client: openai.OpenAI,
) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(
        model=MODEL,
        input=ask,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=100,
        temperature=0,
        store=False,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first
    call = calls[0]
    assert call.name == "get_weather"
    assert call.call_id
    assert json.loads(call.arguments)["city"] in {"Paris", "Oslo", "Rome"}
    # The stateless way Codex goes on: the whole conversation, the call and its output.
    history: Any = [
        *ask,
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, clear"},
    ]  # fmt: skip
    second = client.responses.create(
        model=MODEL, input=history, tools=[WEATHER], max_output_tokens=16, store=False
    )
    assert second.status in {"completed", "incomplete"}
    assert second.output


def test_a_json_schema_text_format_is_honoured(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=MODEL,
        input="Name a city.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
        max_output_tokens=40,
        store=False,
    )
    assert json.loads(response.output_text)["city"] in {"Paris", "Oslo"}


def test_a_stored_response_is_continued_retrieved_listed_and_deleted(
    client: openai.OpenAI,
) -> None:
    first = client.responses.create(
        model=MODEL, input="My name is Ada. Say hi.", max_output_tokens=8
    )
    second = client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=8
    )
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).output_text == second.output_text
    items = client.responses.input_items.list(second.id, order="asc")
    texts = [part.text for item in items.data for part in getattr(item, "content", [])]
    assert texts[0] == "My name is Ada. Say hi."
    assert texts[-1] == "What is my name?"
    assert len(items.data) == 3  # the first's input and answer, then the second's input
    client.responses.delete(first.id)  # the SDK answers nothing; a 404 would raise
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as refused:  # a 400, as OpenAI's
        client.responses.create(model=MODEL, input="Go on.", previous_response_id=first.id)
    assert (refused.value.param, refused.value.code) == (
        "previous_response_id",
        "previous_response_not_found",
    )
    assert client.responses.retrieve(second.id).id == second.id  # its own row stays
