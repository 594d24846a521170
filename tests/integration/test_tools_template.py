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


def test_a_long_conversation_with_tools_is_fitted_by_the_exact_count_with_them(
    tokenizer: Any,
) -> None:
    from policy.context.fit import fit_messages
    from policy.context.tokens import ChatTemplateCounter

    counter = ChatTemplateCounter(tokenizer, TEMPLATE)
    tools = [WEATHER] * 4  # about 200 tokens of listing
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 60}
        for i in range(21)
    ]
    window = 1024
    fit = fit_messages(turns, window=window, requested_max_tokens=200, counter=counter, tools=tools)
    assert fit.dropped_messages > 0
    # What the engine will see, tools included, is what the fit says; and it fits.
    assert fit.prompt_tokens == counter.count_prompt(fit.messages, tools)
    assert fit.prompt_tokens + fit.max_tokens <= window
    without = fit_messages(turns, window=window, requested_max_tokens=200, counter=counter)
    assert len(fit.messages) < len(without.messages)  # the listing took a turn's room
