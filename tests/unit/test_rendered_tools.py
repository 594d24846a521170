"""The router counts tools as vLLM renders them for the chat template: equal to vLLM's own dump
of its ChatCompletionToolsParam, field by field and in order, for what clients send."""

from __future__ import annotations

from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

from policy.request.rendered import rendered_tools

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "read", "description": "d", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "bare"}},
    {"function": {"name": "untyped", "description": None}},
    {"type": "function", "function": {"name": "s", "strict": True, "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "s", "strict": False}},
    {"type": "function", "function": {"name": "s", "strict": None}},
    {"type": "function", "function": {"name": "d", "defer_loading": True}, "defer_loading": False},
    {"type": "function", "function": {"name": "d"}, "defer_loading": True},
    {"type": "function", "function": {"name": "x", "x_vendor": 1}, "x_extra": {"a": 1}},
    {"type": "function", "function": {"parameters": SCHEMA, "name": "reordered"}},
]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_renders_as_vllm_dumps_it(tool: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [tool]}
    [vllm_tool] = ChatCompletionRequest.model_validate(body).tools
    [ours] = rendered_tools([tool])
    assert ours == vllm_tool.model_dump()
    assert list(ours["function"]) == list(vllm_tool.model_dump()["function"])  # the order too
