"""Tool calls read back from the fallback's Hermes text, and the schema a forced choice holds
the answer to."""

from __future__ import annotations

import json
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionResponse

from deployments.fallback.engine import Finish
from deployments.fallback.openai_format import ChatShaper
from deployments.fallback.tool_calls import call_text, forced_call_schema, read_calls

WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}
TIME = {"type": "function", "function": {"name": "time"}}


def test_calls_are_read_out_of_the_text_and_the_rest_is_the_content() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>{"name": "time", "arguments": "{}"}</tool_call>'
    )
    read = read_calls(text)
    assert read.content == "Let me look."
    assert [c["function"]["name"] for c in read.calls] == ["weather", "time"]
    assert json.loads(read.calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert read.calls[1]["function"]["arguments"] == "{}"
    assert len({c["id"] for c in read.calls}) == 2


def test_a_block_that_is_not_a_call_stays_text_and_a_cut_call_is_still_read() -> None:
    broken = "<tool_call>{not json}</tool_call>"
    assert read_calls(broken).calls == []
    assert read_calls(broken).content == broken
    cut = '<tool_call>\n{"name": "weather", "arguments": {}}'  # the stop token ended it
    assert [c["function"]["name"] for c in read_calls(cut).calls] == ["weather"]
    assert read_calls("plain answer").content == "plain answer"


def test_a_call_written_back_reads_as_the_same_call() -> None:
    [call] = read_calls(call_text("weather", {"city": "Rome"})).calls
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}


def test_only_required_and_a_named_function_force_a_call() -> None:
    assert forced_call_schema([WEATHER, TIME], "auto") is None
    assert forced_call_schema([WEATHER, TIME], None) is None
    assert forced_call_schema(None, "required") is None
    named = forced_call_schema([WEATHER, TIME], {"type": "function", "function": {"name": "time"}})
    assert named is not None
    assert named["properties"]["name"] == {"const": "time"}
    assert named["properties"]["arguments"] == {"type": "object"}  # no parameters given
    either = forced_call_schema([WEATHER, TIME], "required")
    assert either is not None
    assert [s["properties"]["name"]["const"] for s in either["anyOf"]] == ["weather", "time"]


def test_an_answer_with_calls_finishes_as_tool_calls_and_one_without_as_it_stopped() -> None:
    shaper = ChatShaper("cpu-fallback", include_usage=False)
    finish = Finish("stop", 10, 5)

    def whole(*args: Any, **kwargs: Any) -> Any:  # read as vLLM reads its own: same shape
        return ChatCompletionResponse.model_validate(shaper.whole(*args, **kwargs).body)

    called = whole(call_text("weather", {}), finish, tools=True)
    assert called.choices[0].finish_reason == "tool_calls"
    assert called.choices[0].message.content is None
    said = whole("It is sunny.", finish, tools=True)
    assert said.choices[0].finish_reason == "stop"
    assert said.choices[0].message.content == "It is sunny."
    cut = whole(call_text("weather", {}), Finish("length", 10, 5), tools=True)
    assert cut.choices[0].finish_reason == "length"
    forced = whole(call_text("weather", {}), finish, tools=True, named=True)
    assert forced.choices[0].finish_reason == "stop"  # OpenAI's end of a call forced by name
    assert forced.choices[0].message.tool_calls


def test_definitions_a_tools_parameters_refer_to_are_found_at_the_root() -> None:
    place = {
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/city"}},
        "$defs": {"city": {"type": "string"}},
    }
    tool = {"type": "function", "function": {"name": "go", "parameters": place}}
    schema = forced_call_schema([tool], "required")
    assert schema is not None
    assert schema["$defs"] == {"city": {"type": "string"}}
