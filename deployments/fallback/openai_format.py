"""The fallback's answers as a vLLM replica gives them (core/answers.py): SSE lines of OpenAI's
chunks, whole answers as OpenAI's JSON, errors as EngineError; the router and the ingress handle
them exactly as they handle a vLLM replica's. Written here with orjson: vLLM's response classes
would load vLLM and torch into the fallback's process."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from core.answers import EngineError, WholeAnswer
from core.requests import ChatRequest, CompletionRequest
from deployments.fallback.engine import ChatParams, CompletionParams, Finish
from deployments.fallback.tool_calls import ReadCalls, read_calls
from policy.context.tokens import template_message
from policy.request.completion import single_prompt
from policy.request.messages import carries_images
from policy.request.rendered import rendered_tools

DONE = "data: [DONE]\n\n"


def chat_params(request: ChatRequest, default_max_tokens: int) -> ChatParams:
    """What the engines need of an OpenAI request (the router has fitted and clamped it)."""
    max_tokens = request.max_completion_tokens or request.max_tokens or default_max_tokens
    stop = (
        request.stop if isinstance(request.stop, list) else [request.stop] if request.stop else []
    )
    messages = [_plain(m) for m in request.messages]
    continue_text = ""
    # vLLM's way to continue a partial answer (mid-stream failover sends one): the last
    # message is the assistant's text so far, which the engine goes on from.
    if request.continue_final_message and messages[-1].get("role") == "assistant":
        continue_text = str(messages.pop()["content"])
    choice = request.tool_choice
    return ChatParams(
        messages=messages,
        max_tokens=int(max_tokens),
        temperature=request.temperature,
        top_p=request.top_p,
        stop=[str(s) for s in stop],
        seed=request.seed,
        continue_text=continue_text,
        tools=rendered_tools(request.tools) if request.tools else None,
        tool_choice=choice,
    )


def completion_params(request: CompletionRequest, default_max_tokens: int) -> CompletionParams:
    """What the engines need of a completions request (the router fitted the prompt)."""
    stop = (
        request.stop if isinstance(request.stop, list) else [request.stop] if request.stop else []
    )
    prompt = single_prompt(request.prompt)
    return CompletionParams(
        prompt=prompt if isinstance(prompt, str) else [int(t) for t in prompt],
        max_tokens=int(request.max_tokens or default_max_tokens),
        temperature=request.temperature,
        top_p=request.top_p,
        stop=[str(s) for s in stop],
        seed=request.seed,
        echo=bool(request.echo),
    )


def _plain(original: Any) -> dict[str, Any]:
    """A message as vLLM gives it to a template (text content, call arguments as objects), so
    the fallback renders what the router counted; one with images keeps its parts (the router
    sends images here only where llama-server reads them: fallback.mmproj)."""
    message = template_message(dict(original))
    if carries_images([original]):
        message["content"] = original["content"]
    return message


def error_response(status: int, kind: str, message: str) -> EngineError:
    return EngineError(status, kind, message)


def _sse(chunk: dict[str, Any]) -> str:
    return f"data: {orjson.dumps(chunk).decode()}\n\n"


class ChatShaper:
    """One response's chunks (streaming) or whole answer, with one id and creation time."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self._model = model
        self._include_usage = include_usage
        self._id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return _sse(
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self._model,
                "choices": choices,
                **extra,
            }
        )

    def opening(self, text: str) -> list[str]:
        """The role chunk and the first text, sent together once the engine has answered."""
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        return [self._chunk([role]), self.text(text)]

    def text(self, text: str) -> str:
        return self._chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])

    def closing(self, finish: Finish, reason: str | None = None) -> list[str]:
        ending = reason or finish.reason
        lines = [self._chunk([{"index": 0, "delta": {}, "finish_reason": ending}])]
        if self._include_usage:
            lines.append(self._chunk([], usage=_usage(finish)))
        return [*lines, DONE]

    def with_calls(self, text: str, finish: Finish, named: bool = False) -> list[str]:
        """A whole answer read for tool calls, streamed as OpenAI does: the role, the content,
        a delta per call (whole: the fallback sends them once read), and the end."""
        read = read_calls(text)
        lines = self.opening(read.content or "")
        for index, call in enumerate(read.calls):
            delta = {"tool_calls": [{"index": index, **call}]}
            lines.append(self._chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
        return [*lines, *self.closing(finish, _reason(finish, read, named))]

    def whole(
        self, text: str, finish: Finish, tools: bool = False, named: bool = False
    ) -> WholeAnswer:
        """The answer; with `tools`, its calls read out of the text (`named`: a call the
        request forced by name, which OpenAI ends with `stop`)."""
        read = read_calls(text) if tools else ReadCalls(text, [])
        message: dict[str, Any] = {"role": "assistant", "content": read.content}
        if read.calls:
            message["tool_calls"] = read.calls
        elif read.content is None:
            message["content"] = ""
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _reason(finish, read, named),
        }
        return WholeAnswer(
            {
                "id": self._id,
                "object": "chat.completion",
                "created": self._created,
                "model": self._model,
                "choices": [choice],
                "usage": _usage(finish),
            }
        )


class CompletionShaper:
    """A completion's chunks or whole answer, in vLLM's `text_completion` shapes."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self._model = model
        self._include_usage = include_usage
        self._id = f"cmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())

    def _head(self) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "text_completion",
            "created": self._created,
            "model": self._model,
        }

    def text(self, text: str, reason: str | None = None) -> str:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return _sse({**self._head(), "choices": [choice]})

    def closing(self, finish: Finish) -> list[str]:
        lines = [self.text("", finish.reason)]
        if self._include_usage:
            lines.append(_sse({**self._head(), "choices": [], "usage": _usage(finish)}))
        return [*lines, DONE]

    def whole(self, text: str, finish: Finish) -> WholeAnswer:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish.reason}
        return WholeAnswer({**self._head(), "choices": [choice], "usage": _usage(finish)})


def _reason(finish: Finish, read: ReadCalls, named: bool) -> str:
    """As OpenAI (and vLLM) end an answer: `tool_calls` when the model called tools by its own
    choice or under `required`, `stop` after a call forced by name."""
    called = read.calls and finish.reason == "stop" and not named
    return "tool_calls" if called else finish.reason


def _usage(finish: Finish) -> dict[str, int]:
    return {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.completion_tokens,
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
    }
