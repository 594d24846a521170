"""The whole chat-completions request body, checked before vLLM's schema sees it.

vLLM's ChatCompletionRequest is lenient where we cannot be, and its own validators raise what
pydantic does not wrap (VLLMValidationError for `tool_choice` without `tools`, KeyError for a
tool with no `function`). So every field the gateway or an engine reads is checked here: against
OpenAI's schema, and vLLM's limits where they are stricter. Unknown fields pass (vLLM ignores
them); the JSON depth limit bounds what they can hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy.request.fields import (
    check_optional,
    fail,
    is_int,
    is_number,
    json_kind,
    require,
    short,
)
from policy.request.json_schema import check_json_schema
from policy.request.messages import check_messages

__all__ = [
    "BOOL_FIELDS",
    "INT64_MAX",
    "INT64_MIN",
    "INT_RANGES",
    "LOGIT_BIAS_RANGE",
    "MAX_STOP_SEQUENCES",
    "NUMBER_RANGES",
    "RESPONSE_FORMATS",
    "STRING_FIELDS",
    "TOOL_CHOICES",
    "check_chat_request",
    "check_sampling",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # vLLM's bounds for seeds and token counts
# (low, high), inclusive: OpenAI's ranges. top_p may not be 0 either: vLLM wants (0, 1].
NUMBER_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
INT_RANGES = {
    "max_tokens": (1, INT64_MAX),
    "max_completion_tokens": (1, INT64_MAX),
    "n": (1, 128),
    "seed": (INT64_MIN, INT64_MAX),
    "top_logprobs": (0, 20),
}
BOOL_FIELDS = ("stream", "logprobs", "parallel_tool_calls")
STRING_FIELDS = ("user",)
MAX_STOP_SEQUENCES = 4  # OpenAI's limit, and vLLM's (VLLM_MAX_STOP_STRINGS)
LOGIT_BIAS_RANGE = (-100.0, 100.0)
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema", "structural_tag")


def check_chat_request(payload: Mapping[str, Any], *, max_messages: int) -> None:
    """Raise ApiError 400 for the first field a chat-completions request gets wrong."""
    check_messages(payload.get("messages"), max_messages)
    check_sampling(payload, INT_RANGES, BOOL_FIELDS)
    if (payload.get("top_logprobs") or 0) > 0 and payload.get("logprobs") is not True:
        fail("top_logprobs", "needs logprobs: true")
    # vLLM's own cross-field rules, which its JSON Schema cannot say (policy/request/engine_schema):
    # the edge refuses them before admission, as the engine would after it.
    if (
        payload.get("continue_final_message") is True
        and payload.get("add_generation_prompt") is True
    ):
        fail("continue_final_message", "cannot be true with add_generation_prompt: true")
    _check_structured_outputs(payload.get("structured_outputs"))
    _check_response_format(payload.get("response_format"))
    _check_tool_choice(payload.get("tool_choice"), _tool_names(payload.get("tools")))


def check_sampling(
    payload: Mapping[str, Any],
    int_ranges: Mapping[str, tuple[int, int]],
    bool_fields: tuple[str, ...],
) -> None:
    """The fields chats and completions share: sampling numbers, counts, flags, `stop`,
    `stream_options` and `logit_bias`."""
    for field, (low, high) in NUMBER_RANGES.items():
        _check_number(payload, field, low, high)
    for field, (low_int, high_int) in int_ranges.items():
        _check_int(payload, field, low_int, high_int)
    for field in bool_fields:
        check_optional(payload, field, bool, "a boolean")
    for field in STRING_FIELDS:
        check_optional(payload, field, str, "a string")
    if payload.get("top_p") == 0:
        fail("top_p", "must be greater than 0 (for greedy sampling, set temperature 0)")
    _check_stop(payload.get("stop"))
    _check_stream_options(payload)
    if payload.get("prompt_logprobs") is not None and payload.get("stream") is True:
        fail("prompt_logprobs", "are not available with stream: true")
    _check_logit_bias(payload.get("logit_bias"))


def _check_number(payload: Mapping[str, Any], field: str, low: float, high: float) -> None:
    value = payload.get(field)
    if value is None:
        return
    if not is_number(value):
        fail(field, f"must be a number, not {json_kind(value)}")
    if not low <= value <= high:
        fail(field, f"must be between {low:g} and {high:g}; got {short(value)}")


def _check_int(payload: Mapping[str, Any], field: str, low: int, high: int) -> None:
    value = payload.get(field)
    if value is None:
        return
    if not is_int(value):
        fail(field, f"must be an integer, not {json_kind(value)}")
    if value < low:
        fail(field, f"must be at least {low}; got {short(value)}")
    if value > high:
        fail(field, f"must be at most {high}")


def _check_stop(stop: Any) -> None:
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        fail("stop", "must be a string or an array of strings")
    if len(stop) > MAX_STOP_SEQUENCES:
        fail("stop", f"takes at most {MAX_STOP_SEQUENCES} sequences; got {len(stop)}")


def _check_stream_options(payload: Mapping[str, Any]) -> None:
    options = payload.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        fail("stream_options", f"must be an object or null, not {json_kind(options)}")
    for key in ("include_usage", "continuous_usage_stats"):
        check_optional(options, key, bool, "a boolean", "stream_options")
    if options and payload.get("stream") is not True:
        fail("stream_options", "is only allowed with stream: true")


def _check_logit_bias(bias: Any) -> None:
    if bias is None:
        return
    if not isinstance(bias, dict):
        fail("logit_bias", f"must be an object of token ids to numbers, not {json_kind(bias)}")
    low, high = LOGIT_BIAS_RANGE
    for token, value in bias.items():
        if not (token.isascii() and token.isdigit()):
            fail("logit_bias", f"keys must be token ids (digits); got {token[:40]!r}")
        if not is_number(value) or not low <= value <= high:
            fail(f"logit_bias.{token}", f"must be a number between {low:g} and {high:g}")


def _check_response_format(format_: Any) -> None:
    if format_ is None:
        return
    if not isinstance(format_, dict):
        fail("response_format", f"must be an object, not {json_kind(format_)}")
    if format_.get("type") not in RESPONSE_FORMATS:
        fail("response_format.type", f"must be one of {', '.join(RESPONSE_FORMATS)}")
    if format_["type"] == "json_schema":
        schema = require(format_, "json_schema", dict, "an object", "response_format")
        require(schema, "name", str, "a string", "response_format.json_schema")
        check_optional(schema, "schema", dict, "an object", "response_format.json_schema")
        check_optional(schema, "strict", bool, "a boolean", "response_format.json_schema")
        check_json_schema(schema.get("schema"), "response_format.json_schema.schema")


def _tool_names(tools: Any) -> set[str]:
    """The names of the tools offered (none when there are none)."""
    if tools is None:
        return set()
    if not isinstance(tools, list) or not tools:
        fail("tools", "must be a non-empty array of tools (or left out)")
    names = set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            fail(where, f"must be an object, not {json_kind(tool)}")
        if tool.get("type", "function") != "function":
            fail(f"{where}.type", "must be function")
        function = require(tool, "function", dict, "an object", where)
        name = require(function, "name", str, "a string", f"{where}.function")
        if not name:
            fail(f"{where}.function.name", "must not be empty")
        check_optional(function, "description", str, "a string", f"{where}.function")
        check_optional(function, "parameters", dict, "a JSON schema object", f"{where}.function")
        check_json_schema(function.get("parameters"), f"{where}.function.parameters")
        check_optional(function, "strict", bool, "a boolean", f"{where}.function")
        names.add(name)
    return names


def _check_tool_choice(choice: Any, names: set[str]) -> None:
    if choice is None or choice == "none":
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            fail("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a named function")
    elif isinstance(choice, dict):
        if choice.get("type", "function") != "function":
            fail("tool_choice.type", "must be function")
        function = require(choice, "function", dict, "an object with a name", "tool_choice")
        name = require(function, "name", str, "a string", "tool_choice.function")
        if names and name not in names:
            fail("tool_choice.function.name", f"names no tool in tools: {name[:64]!r}")
    else:
        fail("tool_choice", f"must be a string or an object, not {json_kind(choice)}")
    if not names:
        fail("tool_choice", "needs tools")


# vLLM's kinds of structured output constraint, of which a request may use one.
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def _check_structured_outputs(value: Any) -> None:
    if not isinstance(value, Mapping):
        return  # absent, or a type the engine's schema check refuses
    used = [kind for kind in STRUCTURED_KINDS if value.get(kind) is not None]
    if len(used) > 1:
        fail("structured_outputs", f"takes one kind of constraint, not {' and '.join(used)}")
