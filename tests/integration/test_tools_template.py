"""The ChatML tools template (ray_configs/templates/chatml_tools.jinja) with the demo model's
real tokenizer, and vLLM's own `hermes` parser reading back what it asks the model to write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

ROOT = Path(__file__).parents[2]
TEMPLATE = (ROOT / "ray_configs" / "templates" / "chatml_tools.jinja").read_text()
DEMO_MODEL = ROOT / ".models" / "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(DEMO_MODEL)


def render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text: str = tokenizer.apply_chat_template(
        messages, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return text


def test_without_tools_it_renders_as_the_models_own_template(tokenizer: Any) -> None:
    for messages in (
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "again"},
        ],
    ):
        own = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render(tokenizer, messages) == own


def test_a_tool_round_trip_renders_tools_calls_and_results(tokenizer: Any) -> None:
    call: dict[str, Any] = {"id": "c1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"},
    ]
    text = render(tokenizer, messages, tools=[WEATHER])
    assert "\n\n# Tools\n" in text
    assert json.dumps(WEATHER) in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text
    assert "Weather in Paris?" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_vllms_hermes_parser_reads_back_the_format_it_asks_for(tokenizer: Any) -> None:
    parser = ToolParserManager.get_tool_parser("hermes")(tokenizer)
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    output = f"Let me check.\n<tool_call>\n{call}\n</tool_call>"
    extracted = parser.extract_tool_calls(output, request=None)
    assert extracted.tools_called
    [call] = extracted.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert extracted.content == "Let me check.\n"
