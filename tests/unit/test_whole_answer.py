"""A streamed answer put together as the whole answer the client asked for."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.requests import ChatRequest
from core.types import PriorityClass
from policy.preemption import PreemptRules, may_be_paused
from policy.whole_answer import streams_as_whole, whole_answer


def line(**chunk: Any) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


def delta(ident: str, finish: str | None = None, **fields: str) -> str:
    choice = {"index": 0, "delta": fields, "finish_reason": finish}
    return line(id=ident, created=5, model="m", choices=[choice])


def request(**fields: Any) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_the_chunks_make_one_answer_with_the_streams_usage() -> None:
    usage = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    lines = [
        delta("a", role="assistant", content=""),
        delta("a", content="Hello"),
        ": gps-paused on=x pauses=1\n\n",
        ": gps-resumed on=x pauses=1\n\n",
        ": gps-pauses n=1\n\n",
        delta("a", content=" there"),
        delta("a", finish="length"),
        line(id="a", created=5, model="m", choices=[], usage=usage),
        "data: [DONE]\n\n",
    ]
    answer = whole_answer(lines, prompt_tokens=99, fallback_model="m")
    assert answer.pauses == 1
    body = answer.body
    assert body == {
        "id": "a",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there"},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": usage,
    }


def test_the_stop_that_ended_it_and_the_last_links_fingerprint_are_the_answers() -> None:
    ending = {"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    lines = [
        line(id="a", model="m", system_fingerprint="fp-1", choices=[ending | {"delta": {
            "content": "Hi"}, "finish_reason": None, "stop_reason": None}]),
        ": gps-migrated from=x to=y\n\n",
        line(id="a", model="m", system_fingerprint="fp-2", choices=[ending]),
        line(id="a", model="m", choices=[], usage=usage),
    ]  # fmt: skip
    body = whole_answer(lines, prompt_tokens=1, fallback_model="m").body
    assert body is not None
    assert body["system_fingerprint"] == "fp-2"
    [choice] = body["choices"]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "END")


def test_without_a_usage_chunk_the_content_chunks_are_counted() -> None:
    lines = [delta("a", content="x"), delta("a", content="y"), delta("a", finish="stop")]
    body = whole_answer(lines, prompt_tokens=4, fallback_model="m").body
    assert body is not None
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


def test_reasoning_is_kept_apart_from_the_content() -> None:
    lines = [delta("a", reasoning_content="think"), delta("a", content="say", finish="stop")]
    body = whole_answer(lines, prompt_tokens=1, fallback_model="m").body
    assert body is not None
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "say",
        "reasoning_content": "think",
    }


def test_an_error_event_is_the_answer_not_the_text_before_it() -> None:
    lines = [delta("a", content="half"), line(error={"message": "it broke", "code": "x"})]
    answer = whole_answer(lines, prompt_tokens=1, fallback_model="m")
    assert answer.body is None
    assert answer.error == "it broke"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, True),
        ({"stream": True}, False),  # already a stream
        ({"n": 2}, False),
        ({"echo": True}, False),
        ({"prompt_logprobs": 1}, False),
        ({"structured_outputs": {"json": {"type": "object"}}}, False),
        ({"logprobs": True}, False),
        ({"response_format": {"type": "json_object"}}, False),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": "auto",
            },
            False,
        ),
    ],
)
def test_only_plain_text_single_choice_chats_are_generated_as_streams(
    fields: dict[str, Any], expected: bool
) -> None:
    assert streams_as_whole(request(**fields)) is expected


def test_only_a_class_some_higher_class_may_pause_is_paused() -> None:
    rules = PreemptRules(2, None, {PriorityClass.USER: 2, PriorityClass.AGENT: 0}, 2, 8)
    assert may_be_paused(PriorityClass.BACKGROUND, rules)
    assert may_be_paused(PriorityClass.AGENT, rules)
    assert not may_be_paused(PriorityClass.USER, rules)
    only_agents = PreemptRules(2, None, {PriorityClass.AGENT: 1}, 2, 8)
    assert not may_be_paused(PriorityClass.AGENT, only_agents)
    assert may_be_paused(PriorityClass.BACKGROUND, only_agents)


def test_the_link_it_ended_on_is_the_last_a_comment_names() -> None:
    lines = [
        delta("a", content="x"),
        ": gps-migrated from=one to=two\n\n",
        delta("a", content="y"),
        ": gps-paused on=two pauses=1\n\n",
        ": gps-resumed on=three pauses=1\n\n",
        delta("a", content="z", finish="stop"),
    ]
    answer = whole_answer(lines, prompt_tokens=1, fallback_model="m")
    assert (answer.served_by, answer.moves) == ("three", 1)
    plain = whole_answer([delta("a", content="x")], prompt_tokens=1, fallback_model="m")
    assert (plain.served_by, plain.moves) == (None, 0)


def test_an_answer_no_chunk_named_gets_its_models_name() -> None:
    lines = [line(choices=[{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}])]
    body = whole_answer(lines, prompt_tokens=1, fallback_model="coding").body
    assert body is not None
    assert body["model"] == "coding"
