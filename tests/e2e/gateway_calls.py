"""What the e2e tests of the shared app (tests/conftest.py) ask and check alike: a small chat's
body, the app still serving after a bad request, an error in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import httpx
from openai.types.chat import ChatCompletionMessageParam

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello in three words."}]


def chat_body(**overrides: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": HELLO, "max_tokens": 8, **overrides}


def assert_serves(http: httpx.Client) -> None:
    """The app still answers a good request (after a bad one)."""
    response = http.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert error["type"]
    assert "Traceback" not in response.text
    # The id Serve tagged the request's log lines with (made by its proxy unless the client
    # sent one): in the body as in the header.
    assert error["request_id"] == response.headers["x-request-id"]
    return dict(error)
