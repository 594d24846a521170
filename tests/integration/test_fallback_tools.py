"""Tool calling on the CPU fallback, on the real llama.cpp engine and the demo model's GGUF,
rendered with the Hermes tools template: forced calls (a named function, `required`) come back
as OpenAI `tool_calls` whose arguments hold to the tool's schema, whole and streamed; a tool's
result in the history is answered; the prompt count is the router counter's exact count."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.requests import ChatRequest
from deployments.fallback.replica import CpuFallback, FallbackSettings
from deployments.fallback.tool_calls import CALL_OPEN
from policy.context.tokens import ChatTemplateCounter
from policy.request.rendered import rendered_tools

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = ROOT / "ray_configs" / "templates" / "chatml_tools.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run `make model` (make test does it)")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is part of the cpu extra")
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module", params=["llama_cpp", "llama_server"])
def fallback(
    loop: asyncio.AbstractEventLoop, request: pytest.FixtureRequest
) -> Iterator[CpuFallback]:
    """Both llama.cpp engines: the Python server and llama.cpp's own."""
    settings = FallbackSettings(
        engine=request.param,
        source=str(GGUF),
        model_id="cpu-fallback",
        context_window=1024,
        threads=1,
        ollama_model="unused",
        keep_alive="1m",
        chat_template=str(TEMPLATE),
    )
    replica = CpuFallback.__new__(CpuFallback)
    loop.run_until_complete(CpuFallback.__init__(replica, settings))  # Serve awaits it
    yield replica
    loop.run_until_complete(replica.aclose())


def ask(loop: asyncio.AbstractEventLoop, replica: CpuFallback, **fields: Any) -> list[Any]:
    request = ChatRequest(model="cpu-fallback", **{"messages": ASK, "temperature": 0.0, **fields})

    async def run() -> list[Any]:
        return [item async for item in replica.chat(request)]

    return loop.run_until_complete(run())


def chunks(items: list[Any]) -> list[dict[str, Any]]:
    lines = [line for item in items for line in (item if isinstance(item, list) else [item])]
    assert lines[-1] == "data: [DONE]\n\n"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_a_named_tool_choice_is_a_call_to_that_tool_with_arguments_of_its_schema(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    [response] = ask(loop, fallback, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=60)
    body = response.body
    answer = body["choices"][0]
    assert answer["finish_reason"] == "stop", answer  # as OpenAI ends a call forced by name
    [call] = answer["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert isinstance(arguments["city"], str)
    # The prompt the engine saw is the one the router counts: the same template, with tools.
    counter = ChatTemplateCounter.from_pretrained(GGUF, TEMPLATE)
    listed = rendered_tools([WEATHER, TIME])  # as vLLM's replica renders them
    # A forced call's answer begins in the prompt: `<tool_call>` and a newline.
    opening = counter.count_text(CALL_OPEN)
    assert body["usage"]["prompt_tokens"] == counter.count_prompt(ASK, listed) + opening


def test_required_makes_a_call_to_one_of_the_tools_and_streams_it_as_deltas(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    items = ask(
        loop,
        fallback,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=60,
        stream=True,
        stream_options={"include_usage": True},
    )
    parsed = chunks(items)
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [
        call
        for chunk in parsed
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or []
    ]
    assert [d["index"] for d in deltas] == [0]
    assert deltas[0]["function"]["name"] in {"get_weather", "get_time"}
    json.loads(deltas[0]["function"]["arguments"])
    finishes = [c["finish_reason"] for chunk in parsed for c in chunk["choices"]]
    assert finishes[-1] == "tool_calls"
    assert parsed[-1]["usage"]["completion_tokens"] > 0
    assert len({chunk["id"] for chunk in parsed}) == 1


def test_a_tool_result_in_the_history_is_answered(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21, "sky": "clear"}'},
    ]
    [response] = ask(loop, fallback, messages=history, tools=[WEATHER], max_tokens=16)
    answer = response.body["choices"][0]
    assert answer["finish_reason"] in {"stop", "length", "tool_calls"}
    assert answer["message"]["content"] or answer["message"].get("tool_calls")
