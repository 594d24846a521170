"""The fallback's request reading, response shapes and engine choice (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionResponse

from core.requests import ChatRequest
from deployments.fallback.engine import Finish
from deployments.fallback.openai_format import ChatShaper, chat_params
from deployments.fallback.replica import NoEngine, choose_engine


def test_chat_params_take_the_fitted_limits_and_flatten_text_parts() -> None:
    request = ChatRequest(
        model="cpu-fallback",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
        max_completion_tokens=12,
        temperature=0.0,
        stop="END",
        seed=7,
    )
    params = chat_params(request, default_max_tokens=500)
    assert params.max_tokens == 12
    assert params.messages[1] == {"role": "user", "content": "Hi"}
    assert (params.temperature, params.stop, params.seed) == (0.0, ["END"], 7)
    bare = ChatRequest(model="m", messages=[{"role": "user", "content": "Hi"}])
    assert chat_params(bare, default_max_tokens=500).max_tokens == 500


def lines_json(lines: list[str]) -> list[Any]:
    """Each SSE line's JSON body, or the "[DONE]" terminator."""
    out: list[Any] = []
    for line in lines:
        assert line.startswith("data: ")
        assert line.endswith("\n\n")
        body = line[len("data: ") : -2]
        out.append(body if body == "[DONE]" else json.loads(body))
    return out


def test_a_stream_opens_with_the_role_and_closes_with_reason_usage_and_done() -> None:
    shaper = ChatShaper("cpu-fallback", include_usage=True)
    opening = lines_json(shaper.opening("Hel"))
    closing = lines_json(shaper.closing(Finish("length", prompt_tokens=9, completion_tokens=4)))
    role, first = opening
    assert isinstance(role, dict)
    assert isinstance(first, dict)
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["delta"] == {"content": "Hel"}
    assert role["id"] == first["id"]
    assert str(role["id"]).startswith("chatcmpl-")
    end, usage, done = closing
    assert end["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["total_tokens"] == 13
    assert done == "[DONE]"


def test_without_include_usage_there_is_no_usage_chunk() -> None:
    closing = ChatShaper("m", include_usage=False).closing(Finish("stop", 1, 1))
    assert len(closing) == 2


def test_a_whole_answer_is_a_chat_completion_with_usage() -> None:
    whole = ChatShaper("cpu-fallback", include_usage=False).whole("Hi there", Finish("stop", 5, 2))
    body = json.loads(json.dumps(whole.body))
    ChatCompletionResponse.model_validate(body)  # the shape vLLM's replica answers in
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {**body["choices"][0]["message"], "content": "Hi there"}
    assert body["usage"] == {**body["usage"], "prompt_tokens": 5, "completion_tokens": 2}


def test_auto_prefers_ollama_then_llama_server_then_llama_cpp() -> None:
    server = "/venv/bin/llama-server"
    assert choose_engine("auto", "/usr/bin/ollama", True, llama_server_binary=server) == "ollama"
    assert choose_engine("auto", None, True, llama_server_binary=server) == "llama_server"
    assert choose_engine("auto", None, source_is_file=True) == "llama_cpp"
    # A Jinja template for tools: llama.cpp renders it, Ollama does not.
    assert (
        choose_engine(
            "auto", "/usr/bin/ollama", True, jinja_template=True, llama_server_binary=server
        )
        == "llama_server"
    )
    assert choose_engine("auto", "/usr/bin/ollama", True, jinja_template=True) == "llama_cpp"
    # Asked by name: kept, whatever else is there.
    assert choose_engine("llama_cpp", "/usr/bin/ollama", True, llama_server_binary=server) == (
        "llama_cpp"
    )
    assert choose_engine("ollama", "/usr/bin/ollama", source_is_file=False) == "ollama"
    # An Ollama model name: only Ollama can serve it.
    assert choose_engine("auto", "/usr/bin/ollama", False, llama_server_binary=server) == "ollama"


def test_llama_cpp_without_its_optional_package_is_refused_with_how_to_install_it() -> None:
    # llama-cpp-python is an optional extra (`make llama-cpp-python`); llama-server is the default.
    server = "/venv/bin/llama-server"
    assert (
        choose_engine("auto", None, True, llama_server_binary=server, llama_cpp_installed=False)
        == "llama_server"
    )
    for requested in ("auto", "llama_cpp"):
        with pytest.raises(NoEngine, match="make llama-cpp-python"):
            choose_engine(requested, None, True, llama_cpp_installed=False)


def test_an_engine_that_cannot_run_here_says_what_to_change() -> None:
    with pytest.raises(NoEngine, match="no `ollama` binary"):
        choose_engine("ollama", None, source_is_file=True)
    with pytest.raises(NoEngine, match=r"point source at a \.gguf file"):
        choose_engine("auto", None, source_is_file=False)
    with pytest.raises(NoEngine, match="no `llama-server` binary"):
        choose_engine("llama_server", None, source_is_file=True)
