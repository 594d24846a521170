"""The edge's copy of vLLM's request schemas (policy/request/engine_schema/) is the pinned
vLLM's own, and the edge refuses with it what vLLM's classes refuse, as the client's 400 naming
the field, before a body is admitted (the fuzz parity is tests/unit/test_request_schema.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import ApiError
from deployments.engine.request_schema import engine_schemas, schema_text
from policy.request.engine_schema import SCHEMA_DIR, check_engine_schema


@pytest.mark.parametrize("kind", ["chat", "completion", "embedding"])
def test_the_files_are_the_pinned_vllms_schemas(kind: str) -> None:
    written = (Path(SCHEMA_DIR) / f"{kind}.json").read_text()
    assert written == schema_text(engine_schemas()[kind]), (
        "vLLM's schema changed: run `python -m deployments.engine.request_schema`"
    )
    assert json.loads(written)["type"] == "object"


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", {"model": "m", "ignore_eos": "yes"}, "ignore_eos"),
        ("chat", {"model": "m", "chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ("chat", {"model": "m", "reasoning_effort": 5}, "reasoning_effort"),
        ("chat", {"model": "m", "structured_outputs": "json"}, "structured_outputs"),
        ("completion", {"model": "m", "prompt": "x", "max_tokens": "many"}, "max_tokens"),
        (
            "embedding",
            {"model": "m", "input": "x", "truncate_prompt_tokens": "all"},
            "truncate_prompt_tokens",
        ),
    ],
)
def test_what_vllms_schema_refuses_is_a_400_naming_the_field(
    kind: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as refused:
        check_engine_schema(kind, body)
    assert refused.value.status == 400
    assert refused.value.param == param


def test_vllms_extras_pass() -> None:
    body = {
        "model": "m",
        "ignore_eos": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "structured_outputs": {"choice": ["a", "b"]},
        "top_k": 5,
        "repetition_penalty": 1.1,
    }
    check_engine_schema("chat", body)


def test_messages_and_tools_are_left_to_our_own_rules() -> None:
    check_engine_schema("chat", {"model": "m", "messages": "not a list", "tools": 5})
