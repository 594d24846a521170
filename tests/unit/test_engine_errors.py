"""A client's mistake that only the engine sees still comes back as 400, never as a backend
fault: over vLLM's real exception types, its real error shapes, and the replica's own chat."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import jinja2
import pytest
from pydantic import BaseModel, ValidationError
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    ErrorInfo,
    ErrorResponse,
)
from ray.serve.llm import LLMServer
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import (
    GenerationError,
    LoRAAdapterNotFoundError,
    QueueOverflowError,
    RetryableRequestError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm.renderers.chat_utils import ChatTemplateResolutionError
from vllm.v1.engine.exceptions import EngineDeadError

from core.requests import ChatRequest
from deployments.engine.answers import EngineItemUnknown, plain
from deployments.engine.llm_server import ObservedLLMServer, judged
from deployments.ingress.answers import engine_error as _engine_error
from policy.engine_errors import (
    EngineError,
    Fault,
    exception_fault,
    exception_status,
    leading_error,
    readable_message,
    response_fault,
)
from policy.oom import OOM_CODE


class _Strict(BaseModel):
    n: int


def _pydantic_error() -> Exception:
    try:
        _Strict.model_validate({"n": "many"})
    except ValidationError as error:
        return error
    raise AssertionError("pydantic accepted it")


def _template_error() -> Exception:
    template = "{{ raise_exception('Conversation roles must alternate') }}"
    env = jinja2.Environment()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    try:
        env.from_string(template).render()
    except jinja2.exceptions.TemplateError as error:
        return error
    raise AssertionError("the template rendered")


def _vllm_schema_error() -> Exception:
    """What vLLM's own ChatCompletionRequest raises for stream_options without stream."""
    messages = [{"role": "user", "content": "hi"}]
    try:
        ChatCompletionRequest.model_validate(
            {"messages": messages, "stream_options": {"include_usage": True}}
        )
    except (ValueError, VLLMValidationError) as error:  # pydantic wraps one, not the other
        return error
    raise AssertionError("vLLM accepted it")


def _unicode_error() -> Exception:
    try:
        "\ud800".encode()
    except UnicodeEncodeError as error:
        return error
    raise AssertionError("encoded a lone surrogate")


CLIENT_ERRORS: dict[str, Callable[[], Exception]] = {
    "VLLMValidationError": lambda: VLLMValidationError(
        "top_p must be in (0, 1]", parameter="top_p"
    ),
    "VLLMValidationError from vLLM's schema": _vllm_schema_error,
    "VLLMUnprocessableEntityError": lambda: VLLMUnprocessableEntityError("image URL gave 404"),
    "chat template rejection (TemplateError)": _template_error,
    "UndefinedError": lambda: jinja2.exceptions.UndefinedError("'tools' is undefined"),
    "ChatTemplateResolutionError": lambda: ChatTemplateResolutionError("no chat template"),
    "pydantic ValidationError": _pydantic_error,
    "ValueError": lambda: ValueError("Unknown part type: bogus"),
    "TypeError": lambda: TypeError("can only concatenate str (not 'NoneType') to str"),
    "OverflowError": lambda: OverflowError("int too large to convert"),
    "UnicodeEncodeError (a lone surrogate)": _unicode_error,
}
BACKEND_ERRORS: dict[str, Callable[[], Exception]] = {
    "VLLMNotFoundError (the router names the model)": lambda: VLLMNotFoundError("no model x"),
    "LoRAAdapterNotFoundError": lambda: LoRAAdapterNotFoundError("a", "/nowhere"),
    "GenerationError": lambda: GenerationError(),
    "RetryableRequestError": lambda: RetryableRequestError(),
    "QueueOverflowError": lambda: QueueOverflowError(),
    "VLLMServerError": lambda: VLLMServerError("boom"),
    "EngineDeadError": lambda: EngineDeadError(),
    "RuntimeError": lambda: RuntimeError("CUDA error: an illegal memory access"),
    "KeyError": lambda: KeyError("function"),
    "NotImplementedError": lambda: NotImplementedError("beam search"),
    "MemoryError": lambda: MemoryError(),
}


@pytest.mark.parametrize("name", [*CLIENT_ERRORS, *BACKEND_ERRORS])
def test_exception_status_is_the_one_vllms_own_server_answers(name: str) -> None:
    error = {**CLIENT_ERRORS, **BACKEND_ERRORS}[name]()
    assert exception_status(error) == create_error_response(error).error.code


@pytest.mark.parametrize("name", CLIENT_ERRORS)
def test_what_the_engine_rejects_is_the_clients_fault(name: str) -> None:
    assert exception_fault(CLIENT_ERRORS[name]()) is Fault.CLIENT


@pytest.mark.parametrize("name", BACKEND_ERRORS)
def test_what_breaks_in_the_engine_is_the_backends_fault(name: str) -> None:
    assert exception_fault(BACKEND_ERRORS[name]()) is Fault.BACKEND


def test_a_client_looking_error_caused_by_running_out_of_memory_is_the_backends() -> None:
    error = ValueError("could not build the batch")
    error.__cause__ = MemoryError("CUDA out of memory")  # as `raise ... from cause` sets it
    assert exception_fault(error) is Fault.BACKEND


@pytest.mark.parametrize(
    ("code", "kind", "fault"),
    [
        (400, "BadRequestError", Fault.CLIENT),
        (422, "UnprocessableEntityError", Fault.CLIENT),
        (400, "context_length_exceeded", Fault.CLIENT),
        (404, "NotFoundError", Fault.BACKEND),
        (429, "rate_limited", Fault.BACKEND),
        (500, "InternalServerError", Fault.BACKEND),
        (503, OOM_CODE, Fault.BACKEND),
        (None, "odd", Fault.BACKEND),
    ],
)
def test_an_answer_is_judged_by_its_code(code: int | None, kind: str, fault: Fault) -> None:
    assert response_fault(EngineError(code, kind, "x")) is fault


def vllm_stream_error(error: Exception) -> str:
    """An SSE error line exactly as vLLM's chat stream generator writes one."""
    return f"data: {json.dumps(create_error_response(error).model_dump())}\n\n"


def test_errors_are_read_from_responses_and_from_a_stream_that_opens_with_one() -> None:
    response = ErrorResponse(error=ErrorInfo(message="bad", type="BadRequestError", code=400))
    assert leading_error(plain(response)) == EngineError(400, "BadRequestError", "bad")
    assert leading_error(plain([response])) == EngineError(400, "BadRequestError", "bad")
    line = vllm_stream_error(VLLMValidationError("too long", parameter="max_tokens"))
    assert leading_error([line, "data: [DONE]\n\n"]) == EngineError(
        400, "BadRequestError", "too long (parameter=max_tokens)", "max_tokens"
    )
    chunk = {"choices": [{"delta": {"content": 'an "error" in the text'}}]}
    assert leading_error([f"data: {json.dumps(chunk)}\n\n", line]) is None  # mid-stream
    assert leading_error("data: [DONE]\n\n") is None


def test_the_replicas_first_item_becomes_400_or_a_fault_the_router_fails_over_on() -> None:
    client = judged([vllm_stream_error(VLLMValidationError("bad logit_bias")), "data: [DONE]"])
    assert isinstance(client, list)
    assert client[0] == EngineError(400, "invalid_request_error", "bad logit_bias", None)
    backend = judged([vllm_stream_error(GenerationError()), "data: [DONE]\n\n"])
    assert isinstance(backend, list)
    assert backend[0].code == 500
    not_served = judged(EngineError(404, "NotFound", "no"))
    assert isinstance(not_served, EngineError)
    assert not_served.code == 502
    lines = ["data: {}\n\n"]
    assert judged(lines) is lines


# -- the replica's chat, over a fake engine -----------------------------------------------------


class _Replica(ObservedLLMServer):
    # Serve awaits the real (async) hook at shutdown; here the garbage collector calls it, and
    # a coroutine it cannot await would only warn. There is no engine to stop.
    def __del__(self) -> None:  # type: ignore[override]
        pass


def replica(monkeypatch: pytest.MonkeyPatch, items: list[Any], fail: Exception | None) -> Any:
    async def engine_chat(self: Any, request: Any, raw: Any = None) -> AsyncIterator[Any]:
        async def stream() -> AsyncIterator[Any]:
            for item in items:
                yield item
            if fail is not None:
                raise fail

        return stream()

    monkeypatch.setattr(LLMServer, "chat", engine_chat)
    server = object.__new__(_Replica)
    server._failure = server._stats = server._capacity = server._counter = None
    return server


def served(server: Any) -> list[Any]:
    async def collect() -> list[Any]:
        request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
        return [item async for item in server.chat(request)]

    return asyncio.run(collect())


@pytest.mark.parametrize("name", ["VLLMValidationError", "chat template rejection (TemplateError)"])
def test_an_engine_that_raises_a_client_error_answers_400(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    [answer] = served(replica(monkeypatch, [], CLIENT_ERRORS[name]()))
    assert isinstance(answer, EngineError)
    assert answer.code == 400


def test_an_engine_that_breaks_still_raises_for_the_router_to_fail_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(KeyError):
        served(replica(monkeypatch, [], KeyError("function")))


def test_an_error_after_the_answer_began_is_not_turned_into_a_400(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="late"):
        served(replica(monkeypatch, [["data: {}\n\n"]], ValueError("late")))


def test_an_engine_answer_of_400_stays_400_and_running_out_of_memory_stays_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = ErrorResponse(error=ErrorInfo(message="bad n", type="BadRequestError", code=400))
    assert served(replica(monkeypatch, [bad], None))[0].code == 400
    [contained] = served(replica(monkeypatch, [], MemoryError("CUDA out of memory")))
    assert (contained.code, contained.kind) == (503, OOM_CODE)


# -- what the client sees -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind", "message", "status", "client_code"),
    [
        (400, "BadRequestError", "top_p must be in (0, 1]", 400, "invalid_request"),
        (422, "UnprocessableEntityError", "image URL gave 404", 400, "invalid_request"),
        (400, "BadRequestError", "maximum context length is 8192", 400, "context_length_exceeded"),
        (400, "context_length_exceeded", "the prompt is too long", 400, "context_length_exceeded"),
        (503, OOM_CODE, "ran out of memory", 503, OOM_CODE),
        (500, "InternalServerError", "boom", 500, "backend_error"),
        (404, "NotFoundError", "no such model", 502, "backend_error"),
    ],
)
def test_the_ingress_answers_engine_errors_by_whose_fault_they_are(
    code: int, kind: str, message: str, status: int, client_code: str
) -> None:
    error = _engine_error(EngineError(code, kind, message))
    assert (error.status, error.code) == (status, client_code)


def test_a_text_model_sent_images_says_so_in_those_words() -> None:
    message = readable_message("vision is not a multimodal model")
    assert "'vision' cannot take images" in message
    assert "not a multimodal model" in message
    assert readable_message("max_tokens must be at least 1") == "max_tokens must be at least 1"


def test_vllms_tool_flags_are_never_shown_to_clients() -> None:
    message = readable_message(
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    )
    assert "--" not in message
    assert "models[]" in message
    assert "tools" in message


def test_vllms_own_request_is_answered_in_vllms_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    # ray.serve.llm's own OpenAiIngress (bench's anchors) sends vLLM's request and reads vLLM's
    # objects back; the gateway's requests get plain data (the tests above).
    bad = ErrorResponse(error=ErrorInfo(message="bad n", type="BadRequestError", code=400))
    server = replica(monkeypatch, [bad], None)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])

    async def collect() -> list[Any]:
        return [item async for item in server.chat(request)]

    [answer] = asyncio.run(collect())
    assert isinstance(answer, ErrorResponse)
    assert (answer.error.code, answer.error.type) == (400, "invalid_request_error")
    lines = ["data: {}\n\n"]
    assert asyncio.run(_first(replica(monkeypatch, [lines], None), request)) is lines


async def _first(server: Any, request: Any) -> Any:
    async for item in server.chat(request):
        return item
    raise AssertionError("no item")


def test_an_engine_item_the_replica_cannot_read_is_the_backends_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Raised, so the router fails over and charges the backend; a TypeError would read as 400.
    with pytest.raises(EngineItemUnknown):
        served(replica(monkeypatch, [object()], None))
