"""Tool calling through the gateway with the official `openai` SDK, on vLLM's CPU engine with the
`hermes` parser and the ChatML tools template (tests/e2e/gateway.yaml): a call forced by name
and read back as `tool_calls`, its result sent back and answered, the same call streamed as
tool-call deltas, `required` with parallel calls, and `auto`, where the demo model decides."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            # An enum bounds the value: a free string may run past max_tokens unclosed.
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]}},
            "required": ["city"],
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def test_a_named_tool_choice_comes_back_as_a_parsed_call_and_its_result_is_answered(
    client: openai.OpenAI,
) -> None:
    first = client.chat.completions.create(
        model="smollm2",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice=NAMED,
        max_tokens=100,
        temperature=0,
    )
    message = first.choices[0].message
    assert message.tool_calls, first
    [call] = message.tool_calls
    assert call.type == "function"
    assert call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in {"Paris", "Oslo", "Rome"}
    assert first.usage is not None
    assert first.usage.prompt_tokens > 100

    history: Any = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21, "sky": "clear"}'},
    ]
    second = client.chat.completions.create(
        model="smollm2", messages=history, tools=[WEATHER, TIME], max_tokens=24
    )
    answer = second.choices[0]
    assert answer.finish_reason in {"stop", "length", "tool_calls"}
    assert answer.message.content or answer.message.tool_calls


def test_a_streamed_call_arrives_as_tool_call_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=ASK,
        tools=[WEATHER],
        tool_choice=NAMED,
        max_tokens=100,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    ids: set[str] = set()
    usage = None
    for chunk in stream:
        ids.add(chunk.id)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    names[delta.index] = delta.function.name
                if delta.function and delta.function.arguments:
                    arguments[delta.index] = (
                        arguments.get(delta.index, "") + delta.function.arguments
                    )
    assert names == {0: "get_weather"}
    assert json.loads(arguments[0])["city"] in {"Paris", "Oslo", "Rome"}
    assert len(ids) == 1
    assert usage is not None
    assert usage.completion_tokens > 0


def test_required_calls_only_the_tools_offered(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Weather in Oslo and the time in UTC?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=200,
        temperature=0,
    )
    calls = response.choices[0].message.tool_calls or []
    assert calls, response
    for call in calls:
        assert call.type == "function"
        assert call.function.name in {"get_weather", "get_time"}
        json.loads(call.function.arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_lets_the_model_decide_and_the_answer_has_a_valid_shape(
    client: openai.OpenAI, stream: bool
) -> None:
    fields: Any = {"model": "smollm2", "messages": ASK, "tools": [WEATHER], "max_tokens": 40}
    if not stream:
        message = client.chat.completions.create(**fields).choices[0].message
        assert message.content is not None or message.tool_calls
        for call in message.tool_calls or []:
            assert call.function.name == "get_weather"
        return
    finishes = [
        choice.finish_reason
        for chunk in client.chat.completions.create(**fields, stream=True)
        for choice in chunk.choices
        if choice.finish_reason
    ]
    assert finishes
    assert finishes[-1] in {"stop", "length", "tool_calls"}


@pytest.mark.parametrize(
    ("parameters", "statuses"),
    [
        # Not a JSON schema: the ingress refuses it.
        ({"type": "object", "properties": {"city": {"type": "strin"}}}, {400}),
        # A schema whose `$ref` leads nowhere: the engine's to answer, never a fault.
        ({"type": "object", "properties": {"city": {"$ref": "#/$defs/missing"}}}, {200, 400}),
    ],
)
def test_a_forced_call_with_a_broken_schema_is_a_client_error_and_costs_nothing(
    http: httpx.Client, client: openai.OpenAI, parameters: dict[str, Any], statuses: set[int]
) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    body = {
        "model": "smollm2",
        "messages": ASK,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "max_tokens": 8,
    }
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code in statuses, reply.text
    if reply.status_code == 400:
        assert reply.json()["error"]["message"]
    assert reply.headers.get("x-failovers", "0") == "0"
    after = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=4)
    assert after.choices[0].message.content is not None
