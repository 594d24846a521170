"""Seeded bad and odd requests for the agents' APIs: POST /v1/responses (`fuzz_responses`) and
POST /v1/messages (`fuzz_messages`), each labelled `<endpoint>.<class>`.

As fuzz_requests.py (whose generic classes they share): pure, every request drawn from one
random.Random(seed); each starts from a valid body (a short question, or a tool round trip as
the agents send it), which most classes break and some only make odd. Valid ones ask for at
most MAX_TOKENS tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

from tests.chaos.fuzz_requests import (
    BAD_UTF8,
    DEPTHS,
    MAX_TOKEN_VALUES,
    MAX_TOKENS,
    MODELS,
    NUMBER_TOKENS,
    ODD_VALUES,
    PLACEHOLDER,
    PNG,
    PROMPTS,
    TEXTS,
    Body,
    FuzzRequest,
    _drawn,
    _with_raw,
    duplicate_keys,
    not_object,
    truncated,
)

__all__ = ["MESSAGES_PATH", "RESPONSES_PATH", "fuzz_messages", "fuzz_responses"]

Mutation = Callable[[random.Random, dict[str, Any]], Body]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

# -- /v1/responses ------------------------------------------------------------------------------

RESPONSES_PATH = "/v1/responses"
# fmt: off
RESPONSE_FIELDS = (
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
    "max_output_tokens", "temperature", "top_p", "text", "reasoning", "metadata", "user",
    "store", "previous_response_id", "truncation", "include", "prompt_cache_key",
    "service_tier", "stream", "background", "conversation", "prompt", "top_logprobs",
)
FUNCTION = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
RESPONSE_TOOLS: tuple[Any, ...] = (
    [FUNCTION], [{"type": "custom", "name": "apply_patch", "description": "A patch."}],
    [{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark",
                                                "definition": "start: /.+/"}}],
    [{"type": "web_search"}], [{"type": "file_search", "vector_store_ids": ["x"]}],
    [{"type": "namespace", "name": "ns", "tools": [FUNCTION]}], [{"type": "namespace"}],
    [{"type": "function"}], [{"type": "function", "name": ""}], [{"name": "f"}], [5], {}, "x",
    [{"type": "function", "name": "f", "parameters": "x"}], [FUNCTION, FUNCTION],
    [{"type": "local_shell"}], [{"type": "bogus"}],
)
RESPONSE_TOOL_CHOICES: tuple[Any, ...] = (
    "auto", "none", "required", "any", 5, [], {"type": "function", "name": "get_weather"},
    {"type": "function", "name": "nope"}, {"type": "function"}, {"type": "custom", "name": "p"},
    {"type": "allowed_tools", "mode": "auto", "tools": [FUNCTION]}, {"type": "web_search"},
)
ITEMS: tuple[Any, ...] = (
    {"type": "message", "role": "user", "content": "hi"},
    {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"role": "developer", "content": "Be brief."}, {"role": "system", "content": "Be brief."},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
    {"role": "user", "content": [{"type": "input_image", "image_url": PNG}]},
    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/a.png"}]},
    {"role": "user", "content": [{"type": "input_image"}]},
    {"role": "user", "content": [{"type": "input_file", "file_data": "AAAA"}]},
    {"role": "user", "content": [{"type": "bogus", "text": "hi"}]},
    {"role": "user", "content": [{"type": "input_text", "text": 5}]},
    {"role": "bogus", "content": "hi"}, {"role": "user"}, {"content": "hi"}, {"type": "message"},
    {"type": "function_call", "call_id": "c1", "name": "get_weather",
     "arguments": '{"city": "Oslo"}'},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{not json"},
    {"type": "function_call", "name": "get_weather"}, {"type": "function_call", "call_id": 5},
    {"type": "function_call_output", "call_id": "c1", "output": "Sunny."},
    {"type": "function_call_output", "call_id": "nope", "output": "Sunny."},
    {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text",
                                                               "text": "Sunny."}]},
    {"type": "function_call_output", "call_id": "c1"}, {"type": "function_call_output"},
    {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** x"},
    {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done."},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Thought."}]},
    {"type": "reasoning", "content": 5}, {"type": "item_reference", "id": "msg_1"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed"}, {"type": "bogus"},
    5, None, "hi", [],
)
TEXT_OPTIONS: tuple[Any, ...] = (
    {"format": {"type": "text"}}, {"format": {"type": "json_object"}},
    {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}},
    {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA, "strict": True}},
    {"format": {"type": "json_schema"}}, {"format": {"type": "json_schema", "schema": 5}},
    {"format": {"type": "xml"}}, {"format": "json"}, {"verbosity": "low"},
    {"verbosity": "extreme"}, "x", [], {},
)
REASONINGS: tuple[Any, ...] = (
    {"effort": "low"}, {"effort": "high"}, {"effort": "minimal"}, {"effort": "xhigh"},
    {"effort": "none"}, {"effort": 5}, {"summary": "auto"}, {"summary": "detailed"},
    {"effort": "medium", "summary": "concise"}, "high", [], None,
)
RESPONSE_OPTIONS: dict[str, tuple[Any, ...]] = {
    "store": (True, False, "yes", None, 1),
    "truncation": ("auto", "disabled", "middle", None, 5),
    "include": (["reasoning.encrypted_content"], ["message.output_text.logprobs"], ["bogus"],
                "x", [5], []),
    "service_tier": ("auto", "default", "flex", "priority", "scale", "bogus", 5),
    "previous_response_id": ("resp_" + "0" * 48, "", "resp_x", 5, None, "msg_1"),
    "parallel_tool_calls": (True, False, "yes"),
    "metadata": ({"a": "b"}, {"a": 5}, {"k" * 100: "v"}, [], "x"),
    "prompt_cache_key": ("session-1", "", 5, "k" * 1000),
    "stream": (True, False),
    "background": (True, False),
}
# fmt: on


def fuzz_responses(seed: int, count: int) -> Iterator[FuzzRequest]:
    return _drawn(seed, count, RESPONSE_MUTATIONS, base_response, RESPONSES_PATH)


def base_response(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": rng.choice(MODELS),
        "input": rng.choice(PROMPTS),
        "max_output_tokens": rng.randint(1, MAX_TOKENS),
    }
    if rng.random() < 0.3:  # Codex's shape: stateless, the whole history in items, tools
        call = {"type": "function_call", "call_id": "c1", "name": "get_weather"}
        call["arguments"] = '{"city": "Oslo"}'
        body |= {
            "input": [
                {"type": "message", "role": "user", "content": "Weather in Oslo?"},
                call,
                {"type": "function_call_output", "call_id": "c1", "output": "Sunny."},
            ],
            "tools": [FUNCTION],
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
    return body


def response_field_types(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(RESPONSE_FIELDS)] = rng.choice(ODD_VALUES)
    return body


def input_items(rng: random.Random, body: dict[str, Any]) -> Body:
    body["input"] = [
        *rng.sample(ITEMS, rng.randint(1, 4)),
        {"role": "user", "content": rng.choice(PROMPTS)},
    ]
    return body


def response_tools(rng: random.Random, body: dict[str, Any]) -> Body:
    body["tools"] = rng.choice(RESPONSE_TOOLS)
    if rng.random() < 0.5:
        body["tool_choice"] = rng.choice(RESPONSE_TOOL_CHOICES)
    return body


def text_and_reasoning(rng: random.Random, body: dict[str, Any]) -> Body:
    if rng.random() < 0.6:
        body["text"] = rng.choice(TEXT_OPTIONS)
    if rng.random() < 0.6:
        body["reasoning"] = rng.choice(REASONINGS)
    if rng.random() < 0.3:
        body["instructions"] = rng.choice((*TEXTS, 5, [], None, "Answer in one word."))
    return body


def response_options(rng: random.Random, body: dict[str, Any]) -> Body:
    """Valid-looking options in odd combinations (an unknown previous response: a 400)."""
    names = sorted(RESPONSE_OPTIONS)
    for name in rng.sample(names, rng.randint(1, len(names))):
        body[name] = rng.choice(RESPONSE_OPTIONS[name])
    return body


def output_tokens(rng: random.Random, body: dict[str, Any]) -> Body:
    body["max_output_tokens"] = rng.choice(MAX_TOKEN_VALUES)
    return body


def response_numbers(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(("temperature", "top_p", "max_output_tokens"))] = PLACEHOLDER
    return _with_raw(body, rng.choice(NUMBER_TOKENS))


def input_nesting(rng: random.Random, body: dict[str, Any]) -> Body:
    depth = rng.choice(DEPTHS)
    body["input"] = PLACEHOLDER
    return _with_raw(body, "[" * depth + '{"role": "user", "content": "hi"}' + "]" * depth)


def input_bytes(rng: random.Random, body: dict[str, Any]) -> Body:
    body["input"] = PLACEHOLDER
    raw = json.dumps(body).encode()
    return raw.replace(PLACEHOLDER.encode(), b'"say ' + rng.choice(BAD_UTF8) + b' hi"')


def chat_body_here(rng: random.Random, body: dict[str, Any]) -> Body:
    """Another API's body sent here: chat's messages, Anthropic's max_tokens."""
    return {
        "model": body["model"],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }


RESPONSE_MUTATIONS: dict[str, Mutation] = {
    mutate.__name__: mutate
    for mutate in (
        response_field_types, input_items, response_tools, text_and_reasoning,
        response_options, output_tokens, response_numbers, input_nesting, input_bytes,
        chat_body_here, duplicate_keys, truncated, not_object,
    )
}  # fmt: skip


# -- /v1/messages -------------------------------------------------------------------------------

MESSAGES_PATH = "/v1/messages"
# fmt: off
MESSAGE_FIELDS = (
    "model", "messages", "system", "max_tokens", "tools", "tool_choice", "stop_sequences",
    "temperature", "top_p", "top_k", "metadata", "stream", "thinking", "service_tier",
    "context_management", "output_config", "mcp_servers", "container",
)
WEATHER = {"name": "get_weather", "description": "The weather now.", "input_schema": SCHEMA}
BLOCKS: tuple[Any, ...] = (
    {"type": "text", "text": "hi"}, {"type": "text", "text": 5}, {"type": "text"},
    {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                 "data": PNG.split(",", 1)[1]}},
    {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!"}},
    {"type": "image"}, {"type": "document", "source": {"type": "text", "data": "x"}},
    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": "Oslo"},
    {"type": "tool_use", "name": "get_weather"},
    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny."},
    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "Sun"}]},
    {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "Failed."},
    {"type": "tool_result", "tool_use_id": "nope", "content": "Sunny."},
    {"type": "tool_result", "content": 5},
    {"type": "thinking", "thinking": "Hmm.", "signature": "sig"}, {"type": "thinking"},
    {"type": "redacted_thinking", "data": "opaque"}, {"type": "server_tool_use"},
    {"type": "bogus"}, 5, None, "hi",
)
MESSAGE_ROLES: tuple[Any, ...] = ("user", "assistant", "system", "tool", "bogus", "", None, 5)
SYSTEMS: tuple[Any, ...] = (
    "Be brief.", [{"type": "text", "text": "Be brief."}],
    [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2; cch=00000;"},
     {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    [{"type": "image"}], [{"text": "x"}], [5], 5, {}, "", [],
)
MESSAGE_TOOLS: tuple[Any, ...] = (
    [WEATHER], [{**WEATHER, "cache_control": {"type": "ephemeral"}}], [{"name": "f"}],
    [{"name": "f", "input_schema": "x"}], [{"name": "", "input_schema": SCHEMA}],
    [{"type": "web_search_20250305", "name": "web_search"}], [{"type": "bash_20250124"}],
    [{"input_schema": SCHEMA}], [5], {}, "x", [WEATHER, WEATHER],
)
MESSAGE_TOOL_CHOICES: tuple[Any, ...] = (
    {"type": "auto"}, {"type": "any"}, {"type": "none"}, {"type": "tool", "name": "get_weather"},
    {"type": "tool", "name": "nope"}, {"type": "tool"}, {"type": "auto",
                                                        "disable_parallel_tool_use": True},
    {"type": "bogus"}, "auto", 5,
)
MESSAGE_OPTIONS: dict[str, tuple[Any, ...]] = {
    "stop_sequences": (["\n"], [], ["a"] * 10, "x", [5], [""]),
    "top_k": (1, 0, -1, 40, 10**9, 1.5, "5"),
    "thinking": ({"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"},
                 {"type": "disabled"}, {"type": "enabled"}, "x"),
    "metadata": ({"user_id": "u1"}, {"user_id": 5}, {"x": 1}, "x"),
    "context_management": ({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},),
    "output_config": ({"effort": "high"}, {"format": {"type": "json_schema", "schema": SCHEMA}}),
    "service_tier": ("auto", "standard_only", "bogus"),
    "stream": (True, False),
}
# fmt: on


def fuzz_messages(seed: int, count: int) -> Iterator[FuzzRequest]:
    return _drawn(seed, count, MESSAGE_MUTATIONS, base_message, MESSAGES_PATH)


def base_message(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": rng.choice(MODELS),
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": rng.randint(1, MAX_TOKENS),
    }
    if rng.random() < 0.3:  # Claude Code's shape: blocks, a tool round trip, a system note
        use = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}
        result = {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny."}
        body |= {
            "system": [{"type": "text", "text": "You are a coding agent."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
                {"role": "system", "content": "Working directory: /tmp."},
            ],
            "tools": [WEATHER],
            "thinking": {"type": "adaptive"},
        }
    return body


def message_field_types(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(MESSAGE_FIELDS)] = rng.choice(ODD_VALUES)
    return body


def blocks(rng: random.Random, body: dict[str, Any]) -> Body:
    turns = [
        {
            "role": rng.choice(("user", "assistant")),
            "content": rng.sample(BLOCKS, rng.randint(1, 3)),
        }
        for _ in range(rng.randint(1, 3))
    ]
    body["messages"] = [*turns, {"role": "user", "content": rng.choice(PROMPTS)}]
    return body


def message_roles(rng: random.Random, body: dict[str, Any]) -> Body:
    message = {"role": rng.choice(MESSAGE_ROLES), "content": rng.choice(PROMPTS)}
    body["messages"] = [message] if rng.random() < 0.5 else [message, *body["messages"]]
    return body


def system_shapes(rng: random.Random, body: dict[str, Any]) -> Body:
    body["system"] = rng.choice(SYSTEMS)
    return body


def message_tools(rng: random.Random, body: dict[str, Any]) -> Body:
    body["tools"] = rng.choice(MESSAGE_TOOLS)
    if rng.random() < 0.6:
        body["tool_choice"] = rng.choice(MESSAGE_TOOL_CHOICES)
    return body


def message_options(rng: random.Random, body: dict[str, Any]) -> Body:
    """Valid-looking options in odd combinations, and fields no one asked us to honour."""
    names = sorted(MESSAGE_OPTIONS)
    for name in rng.sample(names, rng.randint(1, len(names))):
        body[name] = rng.choice(MESSAGE_OPTIONS[name])
    if rng.random() < 0.3:
        body[f"future_field_{rng.randint(0, 9)}"] = rng.choice(ODD_VALUES)
    return body


def message_max_tokens(rng: random.Random, body: dict[str, Any]) -> Body:
    if rng.random() < 0.2:
        body.pop("max_tokens")  # required by Anthropic's API
    else:
        body["max_tokens"] = rng.choice(MAX_TOKEN_VALUES)
    return body


def message_numbers(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(("temperature", "top_p", "top_k", "max_tokens"))] = PLACEHOLDER
    return _with_raw(body, rng.choice(NUMBER_TOKENS))


def message_text(rng: random.Random, body: dict[str, Any]) -> Body:
    body["messages"] = [{"role": "user", "content": [{"type": "text", "text": rng.choice(TEXTS)}]}]
    return body


def content_nesting(rng: random.Random, body: dict[str, Any]) -> Body:
    depth = rng.choice(DEPTHS)
    body["messages"] = [{"role": "user", "content": PLACEHOLDER}]
    return _with_raw(body, "[" * depth + '{"type": "text", "text": "hi"}' + "]" * depth)


def responses_body_here(rng: random.Random, body: dict[str, Any]) -> Body:
    """Another API's body sent here: the Responses API's input."""
    return {"model": body["model"], "input": "hi", "max_output_tokens": 4}


MESSAGE_MUTATIONS: dict[str, Mutation] = {
    mutate.__name__: mutate
    for mutate in (
        message_field_types, blocks, message_roles, system_shapes, message_tools,
        message_options, message_max_tokens, message_numbers, message_text, content_nesting,
        responses_body_here, duplicate_keys, truncated, not_object,
    )
}  # fmt: skip
