"""A coding agent's request fitted into a small window with the demo model's tokenizer and the
ChatML tools template: Claude Code's recorded first request (12 tools, about 13,000 tokens by
this tokenizer) is mostly tool definitions, which get shorter before anything else goes, and
never lose a name, a parameter or a requirement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployments.ingress.anthropic.request import to_chat
from policy.context.fit import ContextOverflow, Fit, fit_messages
from policy.context.tokens import ChatTemplateCounter
from policy.context.tool_fit import FIRST_SENTENCE_CHARS, shortened_tools
from tests.integration.conftest import DEMO_MODEL

ROOT = Path(__file__).parents[2]
TEMPLATE = ROOT / "ray_configs" / "templates" / "chatml_tools.jinja"
NOTE_WORDS = "the model serves requests on pools of GPUs and falls back to a CPU".split()
RECORDED = ROOT / "tests" / "fixtures" / "agent_requests" / "claude_code_2.1.328_first.json"


@pytest.fixture(scope="module")
def counter() -> ChatTemplateCounter:
    return ChatTemplateCounter.from_pretrained(str(DEMO_MODEL), str(TEMPLATE))


@pytest.fixture(scope="module")
def claude_code() -> dict[str, Any]:
    chat: dict[str, Any] = to_chat(json.loads(RECORDED.read_text())["body"])
    return chat


def skeleton(tools: list[dict[str, Any]]) -> list[Any]:
    """What a call is checked against: names, parameter names, types and requirements."""

    def strip(schema: Any) -> Any:
        if isinstance(schema, dict):
            return {k: strip(v) for k, v in schema.items() if k != "description"}
        if isinstance(schema, list):
            return [strip(v) for v in schema]
        return schema

    return [(t["function"]["name"], strip(t["function"].get("parameters"))) for t in tools]


@pytest.mark.parametrize("window", [8192, 6144])
def test_claude_codes_request_fits_with_its_tools_shortened_and_whole(
    counter: ChatTemplateCounter, claude_code: dict[str, Any], window: int
) -> None:
    messages, tools = claude_code["messages"], claude_code["tools"]
    sent_tools = counter.count_tools(tools)
    assert sent_tools > window  # the tools alone, as sent, would fill the window
    fit = fit_messages(
        messages, window=window, requested_max_tokens=32000, counter=counter, tools=tools
    )
    assert fit.tools is not None
    assert fit.tools_shortened >= 1
    assert fit.fitted
    # Counted exactly, with the tools the engine gets: inside the window with its output.
    assert counter.count_prompt(fit.messages, fit.tools) == fit.prompt_tokens
    assert fit.prompt_tokens + fit.max_tokens <= window
    assert fit.max_tokens >= 16
    # Every tool is there, callable as before; only descriptions changed.
    assert skeleton(fit.tools) == skeleton(tools)
    for tool in fit.tools:
        description = tool["function"].get("description", "")
        assert len(description) <= FIRST_SENTENCE_CHARS
    # The user's own message is kept whole.
    assert fit.messages[-2]["content"] == messages[-2]["content"]


@pytest.mark.parametrize("window", [4096, 2048])
def test_in_a_smaller_window_claude_codes_environment_note_is_compressed_too(
    counter: ChatTemplateCounter, claude_code: dict[str, Any], window: int
) -> None:
    """Claude Code appends its environment (a system message of ~2,000 tokens) after the
    user's words: in the demo's smaller windows that note is compressed, the words are not."""
    messages, tools = claude_code["messages"], claude_code["tools"]
    assert [m["role"] for m in messages[-2:]] == ["user", "system"]
    fit = fit_messages(
        messages, window=window, requested_max_tokens=32000, counter=counter, tools=tools
    )
    assert fit.tools_shortened == 2
    assert fit.system_compressed
    assert counter.count_prompt(fit.messages, fit.tools) == fit.prompt_tokens
    assert fit.prompt_tokens + fit.max_tokens <= window
    assert fit.max_tokens >= 16
    assert fit.messages[-2] == messages[-2]
    note = fit.messages[-1]["content"]
    assert 0 < len(note) < len(messages[-1]["content"])


def test_tools_are_shortened_before_a_system_note_is_compressed(
    counter: ChatTemplateCounter,
) -> None:
    described = ". ".join([" ".join(NOTE_WORDS)] * 6)
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Do a thing. " + described,
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "string", "description": "The x. " + described}},
                },
            },
        }
        for i in range(2)
    ]
    note = {
        "role": "system",
        "content": "\n".join(f"env {i}: " + " ".join(NOTE_WORDS) for i in range(12)),
    }
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Which replica?"},
        note,
    ]

    def fitted(window: int) -> Fit:
        return fit_messages(
            conversation, window=window, requested_max_tokens=50, counter=counter, tools=tools
        )

    shortened = fitted(600)  # first sentences make room: the note stays as sent
    assert (shortened.tools_shortened, shortened.messages[-1]) == (1, note)
    last = fitted(450)  # no room even beside the shortest tools: the note gives way too
    assert (last.tools_shortened, last.system_compressed) == (2, True)
    assert last.messages[-1] != note
    assert last.messages[-2] == conversation[1]


def test_a_window_too_small_even_for_the_shortest_tools_names_the_window_and_the_tools(
    counter: ChatTemplateCounter, claude_code: dict[str, Any]
) -> None:
    messages, tools = claude_code["messages"], claude_code["tools"]
    with pytest.raises(ContextOverflow) as overflow:
        fit_messages(messages, window=1024, requested_max_tokens=64, counter=counter, tools=tools)
    shortest = counter.count_tools(shortened_tools(tools, 2))
    assert overflow.value.tools_tokens == shortest
    assert "1024 tokens" in str(overflow.value)
    assert f"{shortest} tokens" in str(overflow.value)


def test_tools_within_their_share_are_sent_as_they_are(counter: ChatTemplateCounter) -> None:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city now. Uses the national service.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    long_history = [
        {"role": ("user", "assistant")[i % 2], "content": f"turn {i} " + "words " * 60}
        for i in range(40)
    ] + [{"role": "user", "content": "And now?"}]
    fit = fit_messages(
        long_history, window=2048, requested_max_tokens=64, counter=counter, tools=[weather]
    )
    assert (fit.tools, fit.tools_shortened) == (None, 0)
    assert fit.dropped_messages > 0  # old turns went, the small tool list stayed whole
