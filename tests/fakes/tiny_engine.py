"""A test engine for the suites whose subject is the control plane (placement moves, pool
recovery, autoscaling, a batch across a cluster restart, `ray up`, stopping an app with
Ctrl-C): it speaks ray.serve.llm's `LLMEngine` interface, so the production `ObservedLLMServer`
replica, Serve's handles, the router and the ingress all run as they do over vLLM, but it
starts in well under a second instead of half a minute to two minutes on this machine's two
cores, and needs no CPU of note while it answers.

Chosen per model by Ray's own seam: `env_vars: {RAYLLM_VLLM_ENGINE_CLS: <this class's path>}` in
a test config (ray.serve.llm reads it when the replica builds its engine). Never where the
engine path is tested: contract, context fitting, OOM, chaos, fuzz, capacity, monitoring's KV
alert and the stop suite's replica-shutdown test keep real vLLM.

What it does, so the suites see a replica that behaves like one:
- answers a chat scripted by its test (tests/fakes/scripted_reply.py: a tool call on cue, then
  the tool's result quoted) as scripted, in whole or streamed as vLLM's tool parser streams;
- answers chat and completions with `max_tokens` words (16 when unset), one every
  `TINY_ENGINE_TOKEN_S` seconds (default 0.02; 0: at once, as bench/pace.py's zero-cost
  engine), streamed as vLLM streams them (`data: {json}`
  chunks, usage when asked for, `[DONE]`), or whole;
- runs at most `engine_kwargs.max_num_seqs` requests at once (vLLM's default 256), the others
  wait, as they wait in vLLM's scheduler, so queue-driven autoscaling sees a queue;
- embeds text as a fixed-size vector derived from its hash;
- starts a child process titled `TINY::EngineCore` (tiny_engine_core.py) the way vLLM starts
  its EngineCore, and stops it from `_engine_client.shutdown()` as ObservedLLMServer stops
  vLLM's, so "the replica's engine is gone" means what it means with vLLM;
- reports no KV-cache readings (ObservedLLMServer then runs without its memory guard);
- or, with `TINY_ENGINE_GPU: <shape>` (tests/fakes/gpu_steps.py), generates as a GPU under vLLM
  would, by a model: a decode step nearly flat in its batch up to a knee, prefill at a rate,
  a KV cache that admits, queues and preempts as vLLM V1's scheduler does, each request at its
  `priority` under `engine_kwargs.scheduling_policy` (issue 56; bench.preemption and
  bench.pace run on it with `--engine gpu-model`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import os
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionResponse,
    CompletionResponse,
    EmbeddingResponse,
)
from ray.llm._internal.serve.core.engine.protocol import LLMEngine

from tests.fakes.gpu_cost import SHAPES
from tests.fakes.gpu_scheduler import Policy
from tests.fakes.gpu_steps import GPU_ENV, KV_TOKENS_ENV, GpuSteps
from tests.fakes.scripted_reply import ScriptedCall, ScriptedText, scripted_reply

DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's
EMBEDDING_SIZE = 64
TOKEN_S_ENV = "TINY_ENGINE_TOKEN_S"


def _prompt_tokens(text: str) -> int:
    return max(1, len(text) // 4)  # about a token per four characters, as in English text


def _chat_text(request: Any) -> str:
    parts = []
    for message in request.messages:
        content = message.get("content") if isinstance(message, dict) else message.content
        parts.append(content if isinstance(content, str) else json.dumps(content))
    return "\n".join(parts)


class _Core:
    """The EngineCore stand-in, stopped as ObservedLLMServer stops vLLM's (`shutdown()`)."""

    def __init__(self) -> None:
        from tests.fakes import tiny_engine_core

        self._process = multiprocessing.get_context("spawn").Process(
            target=tiny_engine_core.run, name="TinyEngineCore", daemon=True
        )
        self._process.start()

    def shutdown(self) -> None:
        self._process.kill()
        self._process.join(timeout=5)


class TinyEngine(LLMEngine):  # type: ignore[misc]
    def __init__(self, llm_config: Any) -> None:
        self._model = llm_config.model_id
        self._max_num_seqs = int(llm_config.engine_kwargs.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS))
        self._token_s = float(os.environ.get(TOKEN_S_ENV, "0.02"))
        self._gpu: GpuSteps | None = None
        if shape := os.environ.get(GPU_ENV):
            cost = SHAPES[shape]
            policy = Policy(llm_config.engine_kwargs.get("scheduling_policy", "fcfs"))
            seqs = int(llm_config.engine_kwargs.get("max_num_seqs", cost.max_num_seqs))
            self._gpu = GpuSteps(cost, seqs, policy, int(os.environ.get(KV_TOKENS_ENV, "0")))
        self._slots: asyncio.Semaphore | None = None
        self._engine_client: _Core | None = None  # the name ObservedLLMServer shuts down

    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self._max_num_seqs)  # on the replica's loop
        # On this thread, as vLLM does: the parent-death signal follows the starting thread.
        self._engine_client = _Core()

    def routing_stats(self) -> dict[str, Any]:
        return {}

    async def resolve_lora(self, lora_model: Any) -> None:
        pass

    async def check_health(self) -> None:
        pass

    async def reset_prefix_cache(self) -> None:
        pass  # it keeps no cache

    async def transcriptions(
        self, request: Any, raw_request_info: Any = None
    ) -> AsyncGenerator[Any, None]:
        raise NotImplementedError("no audio in the control-plane suites")
        yield  # an async generator, as the interface declares

    async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        script = scripted_reply(_messages(request), _tool_names(request))
        if script is not None:
            async for item in self._scripted(request, script):
                yield item
            return
        async for item in self._generate(request, _chat_text(request), chat=True):
            yield item

    async def _scripted(
        self, request: Any, script: ScriptedCall | ScriptedText
    ) -> AsyncGenerator[Any, None]:
        prompt_tokens = _prompt_tokens(_chat_text(request))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time())}
        head["model"] = self._model
        if isinstance(script, ScriptedCall):
            call: dict[str, Any] = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
            call["function"] = {"name": script.name, "arguments": script.arguments}
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            reason, completion = "tool_calls", _prompt_tokens(script.arguments)
        else:
            message = {"role": "assistant", "content": script.text}
            reason, completion = "stop", _prompt_tokens(script.text)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion}
        usage["total_tokens"] = prompt_tokens + completion
        assert self._slots is not None, "start() first"
        async with self._slots:
            await asyncio.sleep(self._token_s * completion)
            if not request.stream:
                choice = {"index": 0, "finish_reason": reason, "message": message}
                body = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
                yield ChatCompletionResponse.model_validate(body)
                return
            for delta, finish in _scripted_deltas(message, reason):
                choice = {"index": 0, "finish_reason": finish, "delta": delta}
                yield _sse({**head, "object": "chat.completion.chunk", "choices": [choice]})
            options = getattr(request, "stream_options", None)
            if options is not None and getattr(options, "include_usage", False):
                yield _sse(
                    {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
                )
            yield "data: [DONE]\n\n"

    async def completions(
        self, request: Any, raw_request_info: Any = None
    ) -> AsyncGenerator[Any, None]:
        prompt = request.prompt if isinstance(request.prompt, str) else json.dumps(request.prompt)
        async for item in self._generate(request, prompt, chat=False):
            yield item

    async def embeddings(
        self, request: Any, raw_request_info: Any = None
    ) -> AsyncGenerator[Any, None]:
        inputs = request.input if isinstance(request.input, list) else [request.input]
        data = [
            {"object": "embedding", "index": i, "embedding": _vector(json.dumps(text))}
            for i, text in enumerate(inputs)
        ]
        tokens = sum(_prompt_tokens(json.dumps(text)) for text in inputs)
        yield EmbeddingResponse.model_validate(
            {
                "id": f"embd-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": self._model,
                "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _generate(
        self, request: Any, prompt: str, *, chat: bool
    ) -> AsyncGenerator[Any, None]:
        wanted = getattr(request, "max_completion_tokens", None) or request.max_tokens
        count = int(wanted or DEFAULT_MAX_TOKENS)
        reason = "length" if wanted else "stop"
        prompt_tokens = _prompt_tokens(prompt)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": count,
            "total_tokens": prompt_tokens + count,
        }
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self._model,
        }
        # Closed with this generator, not at its collection: the modelled GPU aborts the
        # request then, as vLLM does when its caller goes.
        async with aclosing(self._tokens(request, prompt_tokens, count)) as tokens:
            if not request.stream:
                async for _ in tokens:
                    pass
                text = "".join(_word(i) for i in range(count))
                yield _whole(head, text, reason, usage, chat=chat)
                return
            i = 0
            async for _ in tokens:
                yield _chunk(head, _word(i), reason if i == count - 1 else None, chat=chat)
                i += 1
        options = getattr(request, "stream_options", None)
        if options is not None and getattr(options, "include_usage", False):
            yield _sse({**head, **_object(chat, stream=True), "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"

    async def _tokens(
        self, request: Any, prompt_tokens: int, count: int
    ) -> AsyncGenerator[None, None]:
        """Once per token, when it is due: as the GPU modelled samples it, or one every
        token_s within max_num_seqs (a whole answer in one sleep: bench.pace's zero-cost
        engine yields nothing per token)."""
        if self._gpu is not None:
            priority = int(getattr(request, "priority", 0) or 0)
            async with aclosing(self._gpu.generate(prompt_tokens, count, priority)) as steps:
                async for _ in steps:
                    yield
            return
        assert self._slots is not None, "start() first"
        async with self._slots:
            if not request.stream:
                await asyncio.sleep(self._token_s * count)
                for _ in range(count):
                    yield
                return
            started = time.monotonic()
            for i in range(count):
                # Each token is due at its own time from the start (bench/pace.py sets a GPU's
                # rate): a late wake-up does not delay the tokens after it.
                await asyncio.sleep(max(0.0, started + (i + 1) * self._token_s - time.monotonic()))
                yield


def _messages(request: Any) -> list[dict[str, Any]]:
    return [m if isinstance(m, dict) else m.model_dump() for m in request.messages]


def _tool_names(request: Any) -> list[str]:
    return [tool.function.name for tool in getattr(request, "tools", None) or ()]


def _scripted_deltas(
    message: dict[str, Any], reason: str
) -> list[tuple[dict[str, Any], str | None]]:
    """A scripted answer as vLLM streams it: a call's name first, then its arguments in two
    parts; text in two parts; the finish reason on the last."""
    calls = message.get("tool_calls")
    if calls:
        call = calls[0]
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        named = {"index": 0, "id": call["id"], "type": "function"}
        named["function"] = {"name": call["function"]["name"], "arguments": ""}
        parts = [
            {"index": 0, "function": {"arguments": a}} for a in (arguments[:half], arguments[half:])
        ]
        deltas = [{"role": "assistant", "tool_calls": [named]}]
        deltas += [{"tool_calls": [part]} for part in parts]
    else:
        text = message["content"]
        half = len(text) // 2
        deltas = [{"role": "assistant", "content": text[:half]}, {"content": text[half:]}]
    return [(delta, reason if i == len(deltas) - 1 else None) for i, delta in enumerate(deltas)]


def _word(i: int) -> str:
    return f" tiny{i}"


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [(digest[i % len(digest)] - 128) / 128 for i in range(EMBEDDING_SIZE)]


def _object(chat: bool, *, stream: bool) -> dict[str, str]:
    if chat:
        return {"object": "chat.completion.chunk" if stream else "chat.completion"}
    return {"object": "text_completion"}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _chunk(head: dict[str, Any], text: str, reason: str | None, *, chat: bool) -> str:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
    if chat:
        choice["delta"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return _sse({**head, **_object(chat, stream=True), "choices": [choice]})


def _whole(
    head: dict[str, Any], text: str, reason: str, usage: dict[str, int], *, chat: bool
) -> Any:
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    body = {**head, **_object(chat, stream=False), "choices": [choice], "usage": usage}
    response = ChatCompletionResponse if chat else CompletionResponse
    return response.model_validate(body)
