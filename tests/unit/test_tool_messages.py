"""What the tools path does to messages and schemas before any engine sees them: call arguments
parsed as vLLM parses them for a template, schemas checked against the meta-schema, bounds a
llama.cpp grammar cannot spell out left out, and Ollama's tool answers read as Hermes calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.errors import ApiError
from deployments.fallback.engine import ChatParams
from deployments.fallback.llama_cpp_python_server import MAX_GRAMMAR_BOUND, loosened_schema
from deployments.fallback.ollama import _Reader, chat_body
from deployments.fallback.replica import choose_engine
from deployments.fallback.tool_calls import read_calls
from policy.context.tokens import template_message
from policy.request.json_schema import check_json_schema

CALL: Any = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_call_arguments_reach_the_template_as_objects_as_vllm_gives_them() -> None:
    message: Any = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    rendered = template_message(message)
    assert rendered["content"] == ""
    assert rendered["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert message["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # not changed
    broken = {**CALL, "function": {"name": "f", "arguments": "{not json"}}
    empty = {**CALL, "function": {"name": "f", "arguments": ""}}
    for call in (broken, empty):
        [parsed] = template_message({"role": "assistant", "tool_calls": [call]})["tool_calls"]
        assert parsed["function"]["arguments"] == {}
    assert "tool_calls" not in template_message({"role": "assistant", "tool_calls": []})


def test_a_schema_that_is_not_one_is_a_400_naming_the_field() -> None:
    check_json_schema({"type": "object", "properties": {"a": {"type": "string"}}}, "x")
    check_json_schema(None, "x")
    with pytest.raises(ApiError) as refused:
        check_json_schema({"type": "object", "properties": {"a": {"type": "strin"}}}, "t.p")
    assert refused.value.status == 400
    assert refused.value.param == "t.p"
    assert "not a valid JSON schema" in str(refused.value)


def test_bounds_a_grammar_would_spell_out_rule_by_rule_are_left_out() -> None:
    schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": 100_000, "minLength": 1},
            "items": {"type": "array", "minItems": 10**8, "maxItems": MAX_GRAMMAR_BOUND},
        },
    }
    loose = loosened_schema(schema)
    assert loose["properties"]["text"] == {"type": "string", "minLength": 1}
    assert loose["properties"]["items"] == {"type": "array", "maxItems": MAX_GRAMMAR_BOUND}


def test_ollama_gets_the_tools_and_a_forced_calls_schema_as_its_format() -> None:
    forced = ChatParams(
        messages=[{"role": "assistant", "content": "", "tool_calls": [CALL]}],
        max_tokens=8,
        tools=[WEATHER],
        tool_choice="required",
    )
    body = chat_body("m", forced, {"num_ctx": 2048}, "1m")
    assert body["tools"] == [WEATHER]
    assert body["format"]["properties"]["name"] == {"const": "weather"}
    assert body["messages"][0]["tool_calls"] == [{"function": {"name": "f", "arguments": {"a": 1}}}]
    free = chat_body(
        "m", ChatParams(messages=[], max_tokens=8, tools=[WEATHER]), {"num_ctx": 2048}, "1m"
    )
    assert "format" not in free


def _text(reader: _Reader, lines: list[dict[str, Any]]) -> str:
    return "".join(piece.text for line in lines for piece in reader.pieces(line))


def test_ollamas_answers_read_back_as_one_call_each() -> None:
    args = '{"name": "weather", "arguments": {}}'
    forced = _text(_Reader(forced=True), [{"message": {"content": args}}, {"done": True}])
    parsed: Any = {"message": {"tool_calls": [{"function": {"name": "weather", "arguments": {}}}]}}
    parsed_too = _text(_Reader(forced=True), [parsed, {"message": {"content": args}, "done": True}])
    free = _text(_Reader(forced=False), [{"message": {"content": "Sunny."}, "done": True}])
    assert [c["function"]["name"] for c in read_calls(forced).calls] == ["weather"]
    assert [c["function"]["name"] for c in read_calls(parsed_too).calls] == ["weather"]
    assert json.loads(read_calls(parsed_too).calls[0]["function"]["arguments"]) == {}
    assert read_calls(free).content == "Sunny."


def test_a_jinja_tools_template_makes_auto_choose_llama_cpp() -> None:
    assert choose_engine("auto", "/usr/bin/ollama", source_is_file=True) == "ollama"
    chosen = choose_engine("auto", "/usr/bin/ollama", source_is_file=True, jinja_template=True)
    assert chosen == "llama_cpp"
