"""`/v1/completions` bodies checked before vLLM sees them: each mistake a 400 naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ApiError
from policy.request import check_completion_request


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "def f():"},
        {"prompt": [1, 2, 3], "echo": True, "logprobs": 5},
        {"prompt": ["one prompt"], "suffix": "tail", "stream": True},
        {"prompt": [[1, 2]], "n": 1, "best_of": 1},
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
        {"prompt": [1, 2], "suffix": ""},  # an empty suffix is none (the cursor at the end)
    ],
)
def test_what_openai_clients_send_passes(body: dict[str, Any]) -> None:
    check_completion_request(body)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, "2"]}, "prompt[1]"),
        ({"prompt": [1, True]}, "prompt[1]"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "suffix": 3}, "suffix"),
        ({"prompt": [1], "suffix": "x"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "temperature": 9}, "temperature"),
        ({"prompt": "x", "stop": ["a"] * 5}, "stop"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "messages": []}, "messages"),  # a chat's body: never half-read
        ({"prompt": "x", "input": "y"}, "input"),
        ({"prompt": "x", "suffix": "y", "echo": True}, "echo"),
    ],
)
def test_each_mistake_is_a_400_naming_its_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        check_completion_request(body)
    assert refused.value.status == 400
    assert refused.value.param == param
