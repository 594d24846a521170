"""`ray.serve.llm`'s LLMServer, plus KV-cache readings and out-of-memory containment.

KV-cache usage: vLLM computes `SchedulerStats.kv_cache_usage` (0..1) in its EngineCore process
and hands it to the frontend's stat loggers after every engine step; the Prometheus gauge
`vllm:kv_cache_usage_perc` is fed the same way but cannot be read back in-process. So we add one
stat logger of our own to the running engine and serve its last value by handle. An idle engine
sends no stats, and its last value (taken after its blocks were freed) stays true.

Containment: an engine that runs out of memory (`torch.OutOfMemoryError`, or vLLM's
`EngineDeadError` when its EngineCore died of it) would fail every request on the replica with a
stack trace. Here each request gets a 503 `backend_oom` instead, which the router takes as a
backend fault and fails over on; from then on the replica refuses work the same way and tells
Serve it is unhealthy, so Serve replaces it. The memory-pressure guard (`kv_room`) refuses, with
the same code, a request the KV cache has no room for now.

Client errors: whatever the engine rejects as the client's mistake (policy.engine_errors),
raised or answered, goes back as a 400 that the router does not count against this backend.

Start: with Ray's usage stats off, no ray.llm usage-telemetry report (and so no telemetry actor).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from ray import serve
from ray._common.usage.usage_lib import usage_stats_enabled  # Ray's own test; ray is pinned
from ray.serve.llm import LLMServer

from core.answers import EngineError, Item
from core.errors import ErrorCode, invalid_fields
from core.requests import PromptCount, Request
from deployments.engine.adapters import ConfiguredAdapterLoader
from deployments.engine.answers import plain, vllm_item
from deployments.engine.cpu_features import node_has_native_bf16
from deployments.engine.image_tokens import image_tokens
from deployments.engine.quiet_polls import quiet_polls
from deployments.engine.requests import vllm_request
from policy.context.tokens import ChatTemplateCounter, TokenCounter
from policy.cpu_dtype import CPU_DTYPE_ENV, configured_dtype, cpu_serving_dtype
from policy.engine_errors import Fault, exception_fault, leading_error, response_fault
from policy.kv_room import KvRoom, admits
from policy.oom import OOM_CODE, error_kind, item_kind

logger = logging.getLogger("ray.serve")

CLIENT_ERROR_TYPE = "invalid_request_error"  # OpenAI's type for a 400


def oom_response(message: str) -> EngineError:
    return EngineError(503, OOM_CODE, message)


def client_error(message: str, param: str | None = None) -> EngineError:
    """A request the engine rejected: 400, which the router neither fails over on nor counts."""
    return EngineError(400, CLIENT_ERROR_TYPE, message, param)


def judged(item: Item) -> Item:
    """The engine's first item; if it is an error, answered by whose fault it is: a client's
    as 400, a backend's as 5xx (so the router fails over, even from a stream that opened with
    an error event after HTTP 200, or from a 4xx that is not about the request)."""
    error = leading_error(item)
    if error is None:
        return item
    if response_fault(error) is Fault.CLIENT:
        response = client_error(error.message, error.param)
    else:
        code = error.code if error.code is not None and error.code >= 500 else 502
        response = EngineError(code, error.kind or ErrorCode.BACKEND_ERROR, error.message)
    return [response] if isinstance(item, list) else response


def refused(error: Exception) -> EngineError:
    """A body vLLM's own request classes refused, as the client's 400. The edge checks vLLM's
    schema first (policy/request/engine_schema), so this is a validator the schema cannot
    say (a cross-field rule): logged, for a rule of the gateway's own."""
    logger.warning("request refused by vLLM's schema, not the gateway's: %r", error)
    if isinstance(error, ValidationError):
        api = invalid_fields(error)
        return client_error(api.message, api.param)
    param = getattr(error, "parameter", None)
    return client_error(f"Invalid request: {error}", param if isinstance(param, str) else None)


class _EngineStats:
    """A vLLM stat logger (duck-typed StatLoggerBase) that keeps the last scheduler readings
    and sums the engine's own per-step counts: preemptions, prefix-cache tokens queried and
    hit (what vLLM's `vllm:num_preemptions` and `vllm:prefix_cache_*` counters add up)."""

    def __init__(self) -> None:
        self.usage = 0.0
        self.running = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.usage = float(scheduler_stats.kv_cache_usage)
            self.running = int(scheduler_stats.num_running_reqs)
            prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
            if prefix is not None:  # this step's lookups (vLLM resets them after each step)
                self.prefix_queries += int(prefix.queries)
                self.prefix_hits += int(prefix.hits)
        if iteration_stats is not None:
            self.preemptions += int(iteration_stats.num_preempted_reqs)

    def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
        pass  # called on every logger where the engine bounds its queue; no count of ours

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


def _kv_capacity_tokens(engine_client: Any) -> int | None:
    """KV blocks x block size, as the engine sized its cache at start."""
    cache = getattr(getattr(engine_client, "vllm_config", None), "cache_config", None)
    blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", 0)
    return int(blocks) * int(block_size) if blocks and block_size else None


def served_on_this_node(llm_config: Any) -> Any:
    """The replica's own engine config, set to the dtype this node's CPU computes natively where
    the backend asks for that (models[].cpu_dtype, passed as CPU_DTYPE_ENV to CPU backends)."""
    choice = os.environ.get(CPU_DTYPE_ENV)
    if choice is None:
        return llm_config
    configured = configured_dtype(llm_config.engine_kwargs)
    dtype = cpu_serving_dtype(configured, choice, node_has_native_bf16())
    if dtype == configured:
        return llm_config
    logger.info(
        "serving in %s, not %s: this CPU has no native bf16 math (models[].cpu_dtype: auto)",
        dtype,
        configured,
    )
    # Ray's own setter: it also updates the engine config the deployment's build cached (a copy
    # of the LLMConfig would keep that cache, and the engine would start in the old dtype).
    llm_config.update_engine_kwargs(dtype=dtype)
    return llm_config


class ObservedLLMServer(LLMServer):  # type: ignore[misc]
    def _init_multiplex_loader(self, model_downloader_cls: Any = None) -> None:
        """LoRA adapters from their configured sources (deployments/engine/adapters.py)."""
        super()._init_multiplex_loader(model_downloader_cls or ConfiguredAdapterLoader)

    async def __init__(self, llm_config: Any, **kwargs: Any) -> None:  # type: ignore[misc]
        await super().__init__(served_on_this_node(llm_config), **kwargs)
        quiet_polls()
        self._stats: _EngineStats | None = None
        self._failure: str | None = None  # why Serve must replace this replica, once it must
        self._capacity: int | None = None
        self._counter: TokenCounter | None = None
        client = getattr(self.engine, "_engine_client", None)
        # AsyncLLM keeps its stat loggers in a plain list it walks after every step.
        manager = getattr(client, "logger_manager", None)
        if manager is None:
            logger.warning("engine stats are off: no KV-cache readings, no memory guard")
            return
        self._stats = _EngineStats()
        manager.stat_loggers.append(self._stats)
        self._capacity = _kv_capacity_tokens(client)

    async def _start_engine(self) -> None:
        """The engine, without ray.llm's usage-telemetry report where Ray's usage stats are off
        (RAY_USAGE_STATS_ENABLED=0, as `make run` sets): the report goes through a detached
        `TelemetryAgent` on the head node that imports vLLM and torch (388 MiB resident, 9 s of
        CPU at start) only to record tags for the usage stats nobody will send."""
        if usage_stats_enabled() or self.engine is None:
            await super()._start_engine()
            return
        await self.engine.start()

    async def kv_cache_usage(self) -> float | None:
        """The engine's KV-cache usage (0..1) after its last step; None if not observable."""
        return None if self._stats is None else self._stats.usage

    async def engine_counters(self) -> dict[str, Any] | None:
        """This replica's engine counts since it started, named by the replica (the router
        sums its backend's replicas: policy.engine_counters); None if not observable."""
        stats = self._stats
        if stats is None:
            return None
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "preemptions": stats.preemptions,
            "prefix_queries": stats.prefix_queries,
            "prefix_hits": stats.prefix_hits,
        }

    async def image_tokens(self, sizes: list[tuple[int, int]]) -> list[int] | None:
        """The tokens an image of each (width, height) adds to a chat prompt, by this engine's
        chat template and processor (deployments/engine/image_tokens.py); None where the model
        reads no images."""
        client = getattr(self.engine, "_engine_client", None)
        model_config = getattr(client, "model_config", None)
        if model_config is None or not model_config.is_multimodal_model:
            return None
        model = self._llm_config.model_loading_config.model_id
        return await image_tokens(self.engine, model, [(int(w), int(h)) for w, h in sizes])

    async def chat(self, request: Request, raw_request_info: Any = None) -> AsyncIterator[Any]:
        async for item in self._answered(super().chat, request, raw_request_info):
            yield item

    async def completions(
        self, request: Request, raw_request_info: Any = None
    ) -> AsyncIterator[Any]:
        async for item in self._answered(super().completions, request, raw_request_info):
            yield item

    async def embeddings(
        self, request: Request, raw_request_info: Any = None
    ) -> AsyncIterator[Any]:
        async for item in self._answered(super().embeddings, request, raw_request_info):
            yield item

    async def _answered(
        self, serve: Callable[..., Awaitable[Any]], sent: Any, raw_request_info: Any
    ) -> AsyncIterator[Any]:
        """Our request answered in plain data (core/answers.py); vLLM's own (ray.serve.llm's
        OpenAiIngress, as bench's anchors and the context suite's bare ingress send) in vLLM's
        objects, as a bare LLMServer answers it."""
        ours = isinstance(sent, Request)
        async for item, raw in self._served(serve, sent, raw_request_info):
            yield item if ours else vllm_item(item, raw)

    async def _served(
        self, serve: Callable[..., Awaitable[Any]], sent: Any, raw_request_info: Any
    ) -> AsyncIterator[tuple[Item, Any]]:
        """A chat, completion or embedding (ours read as vLLM's) through the guard, its errors
        judged and its failures contained (the module's docstring): each item as plain data,
        beside the engine's own item where it is that item unchanged (else None)."""
        if self._failure is not None:
            yield oom_response(f"This replica is being replaced: {self._failure}"), None
            return
        started = False  # once the answer has begun, a failure is the stream's, not the request's
        ours = isinstance(sent, Request)
        count = sent.counted if ours else None  # a vLLM request's extra of that name is not ours
        try:
            request = vllm_request(sent)
        except Exception as error:  # noqa: BLE001 - pydantic's, and vLLM validators' own
            yield refused(error), None
            return
        try:
            refusal = await self._guard(request, count)  # its template may reject the messages
            if refusal is not None:
                yield refusal, None
                return
            stream = await serve(request, raw_request_info)
            async for engine_item in stream:
                item = plain(engine_item)
                kind = item_kind(item)
                if kind is not None:
                    yield self._contain(kind, "the engine reported it"), None
                    return
                answer = item if started else judged(item)
                yield answer, engine_item if answer is item else None
                started = True
        except Exception as error:
            kind = error_kind(error)
            if kind is not None:
                yield self._contain(kind, f"{type(error).__name__}: {error}"), None
            elif started or exception_fault(error) is Fault.BACKEND:
                raise
            else:
                yield client_error(str(error)), None

    async def _count_exactly(self, request: Any) -> int | None:
        """The prompt's exact count, for the rare request whose bound did not fit the room:
        the tokenizer loads on first need, not at start (most replicas never need it). None
        when it cannot load: then the guard lets the request through, as with no guard."""
        if not hasattr(request, "messages"):  # a completion counted by estimate: let it through
            return None
        if self._counter is None:
            source = self._llm_config.model_loading_config.model_source
            try:
                self._counter = await asyncio.to_thread(ChatTemplateCounter.from_pretrained, source)
            except Exception as error:  # noqa: BLE001 - any loader failure: no exact counts
                logger.warning("memory guard: no tokenizer for %s (%s)", source, error)
                return None
        messages = [dict(m) for m in request.messages]
        return await asyncio.to_thread(self._counter.count_prompt, messages)

    def _contain(self, kind: str, detail: str) -> EngineError:
        """Answer with the controlled code and mark the replica for replacement."""
        what = "ran out of memory" if kind == "oom" else "engine died"
        if self._failure is None:
            self._failure = f"{what} ({detail})"
            logger.error("replica %s: %s; refusing work until Serve replaces it", what, detail)
        return oom_response(f"The backend {what}; the request can be retried elsewhere.")

    async def _guard(self, request: Any, count: PromptCount | None) -> EngineError | None:
        """Refuse what the KV cache has no room for now, by the count the router fitted the
        prompt with; only a bound that does not prove it fits is counted here, exactly."""
        if self._stats is None or self._capacity is None or count is None:
            return None  # not sent through our router: nothing counted, no guard
        room = KvRoom(self._capacity, self._stats.usage, self._stats.running)
        if room.running == 0:
            return None  # an idle engine holds a whole window (vLLM checked at start)
        max_tokens = _output_bound(request)
        if admits(room, count.tokens + max_tokens):
            return None  # exact, or a bound that fits: either way it fits
        prompt = count.tokens if count.exact else await self._count_exactly(request)
        if prompt is None or admits(room, prompt + max_tokens):
            return None
        return oom_response(
            f"Not enough KV cache free for this request now: it needs {prompt + max_tokens} "
            f"tokens ({prompt} prompt + {max_tokens} output), {room.free_tokens} are free."
        )

    async def __del__(self) -> None:
        """Serve's replica shutdown: stop the engine's processes now, so their memory is free
        for the next replica (LLMServer's own only closes a socket, and leaves EngineCore to
        interpreter exit, which a killed replica never reaches)."""
        client = getattr(getattr(self, "engine", None), "_engine_client", None)
        if client is not None:
            try:
                client.shutdown()  # SIGTERM to EngineCore, SIGKILL after 5 s
            except Exception:  # the replica goes anyway; parent_death covers the rest
                logger.exception("engine shutdown failed")
        await super().__del__()

    async def check_health(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"replica must be replaced: {self._failure}")
        await super().check_health()


def _output_bound(request: Any) -> int:
    """The most tokens a request (vLLM's) may generate: none for an embedding (whatever its
    body carried), else its max_completion_tokens or max_tokens."""
    if hasattr(request, "input") and not hasattr(request, "messages"):  # an embedding
        return 0
    bound = getattr(request, "max_completion_tokens", None) or getattr(request, "max_tokens", 0)
    return int(bound or 0)
