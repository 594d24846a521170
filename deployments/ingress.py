"""The OpenAI-compatible Ingress deployment: HTTP, auth, body limits, schema; nothing slower.

Everything a client can get wrong is answered here with OpenAI error JSON and the right status,
before any work reaches the router or an engine. The router decides where a job runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from pydantic import ValidationError
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingCompletionRequest,
    ErrorResponse,
)
from ray.llm._internal.serve.core.ingress.utils import _sanitize_chat_completion_request
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse
from vllm.entrypoints.generate.base.protocol import StreamOptions

from core.config import ClusterConfig, GatewayConfig
from core.errors import ApiError, ErrorCode
from core.types import PriorityClass, Role
from core.wire import ChatJob, Refusal, Routed, is_embedding
from deployments import metrics
from deployments.auth import PRIORITY_HEADER, KeyRing, claimed_priority
from deployments.error_response import error_response
from deployments.front_options import front_actor_options
from deployments.key_ledger import LedgerClient, RayLedger, ensure_key_ledger
from deployments.key_metering import Admission, KeyMetering, StreamUsage
from deployments.overhead_header import OVERHEAD_HEADER, OverheadHeader, milliseconds
from deployments.router.in_process import InProcessRouter
from policy.context.tokens import message_text
from policy.depth import DEPTH_HEADER, DepthDecision, UnknownDepth, classify
from policy.engine_errors import EngineError, Fault, readable_message, response_fault
from policy.oom import OOM_CODE
from policy.request import (
    check_chat_request,
    check_completion_request,
    check_embedding_request,
    check_tool_support,
    parse_object,
)

logger = logging.getLogger("ray.serve")

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
app.add_middleware(OverheadHeader)

# What Starlette itself refuses (routing), as OpenAI error codes.
HTTP_ERROR_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}
# Error types our replicas set that clients see as the error's code (the fallback's too).
PASSED_THROUGH_CODES = frozenset(
    {OOM_CODE, ErrorCode.BACKEND_UNAVAILABLE, ErrorCode.CONTEXT_LENGTH_EXCEEDED}
)


@app.exception_handler(ApiError)
async def _api_error(_: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error_response(error)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, error: Exception) -> Response:
    assert isinstance(error, StarletteHTTPException)
    code = HTTP_ERROR_CODES.get(error.status_code, ErrorCode.INVALID_REQUEST)
    return error_response(ApiError(error.status_code, code, str(error.detail)))


@app.exception_handler(Exception)
async def _unexpected(_: Request, error: Exception) -> Response:
    logger.exception("unexpected error in the ingress")
    return error_response(
        ApiError(500, ErrorCode.INTERNAL_ERROR, "The gateway hit an internal error.")
    )


class Ingress:
    def __init__(
        self,
        config: ClusterConfig,
        router: DeploymentHandle | None,
        ledger: Callable[[], LedgerClient] | None = None,
        backends: Mapping[str, DeploymentHandle] | None = None,
    ) -> None:
        """`router` None: this replica runs its own Router over `backends`
        (`gateway.router_in_ingress`)."""
        if router is None:
            from deployments.router import ServeRouter  # only where the router runs here

            router = InProcessRouter(ServeRouter(config, backends or {}))
        assert router is not None
        self._config = config
        self._keys = KeyRing(config.api_keys, config.gateway.default_priority)
        self._served = config.served_names
        self._router = router
        self._router_stream = router.options(stream=True)  # cached: each .options() costs
        self._metering = KeyMetering(config.api_keys, ledger or (lambda: _ledger(config)))
        if not self._keys.enabled:
            logger.warning("API keys: none configured, authentication is OFF")

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        self._keys.authenticate(request.headers.get("authorization"))
        cards = [
            {"id": name, "object": "model", "created": 0, "owned_by": "gpu-pool-serve"}
            for name in self._served
        ]
        return JSONResponse({"object": "list", "data": cards})

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await self._chat(request, started)
        except ApiError as error:
            metrics.observe_request("chat", error.status, time.perf_counter() - started)
            raise
        metrics.observe_request("chat", response.status_code, time.perf_counter() - started)
        return response

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await self._complete(request, started)
        except ApiError as error:
            metrics.observe_request("completions", error.status, time.perf_counter() - started)
            raise
        metrics.observe_request("completions", response.status_code, time.perf_counter() - started)
        return response

    @app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await self._embed(request, started)
        except ApiError as error:
            metrics.observe_request("embeddings", error.status, time.perf_counter() - started)
            raise
        metrics.observe_request("embeddings", response.status_code, time.perf_counter() - started)
        return response

    @app.get("/v1/keys/usage")
    async def keys_usage(self, request: Request) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        if not caller.admin:
            raise ApiError(
                403,
                ErrorCode.ADMIN_ONLY,
                "Only an admin key (api_keys[].admin: true) may read the keys' usage.",
            )
        return JSONResponse({"object": "key_usage", **await self._metering.usage()})

    @app.get("/healthz")
    async def healthz(self) -> Response:
        try:
            status: dict[str, Any] = await self._router.status.remote()
        except Exception as error:  # noqa: BLE001 - the router itself is unreachable: that is "down"
            logger.warning("healthz: router status failed: %s", error)
            status = {"status": "down", "backends": {}, "error": "router unavailable"}
        return JSONResponse(status, status_code=503 if status["status"] == "down" else 200)

    @app.get("/v1/cluster/status")
    async def cluster_status(self, request: Request) -> Response:
        self._keys.authenticate(request.headers.get("authorization"))
        status: dict[str, Any] = await self._router.status.remote()
        # The router's status carries the placements (backend -> pool, as moved), the moves,
        # and each pool's state, nodes and the recovery events from the cluster manager.
        states = status.get("pools", {})
        pools = {
            p.name: {
                **p.model_dump(mode="json"),
                "state": "healthy",
                "nodes": [],
                **states.get(p.name, {}),
            }
            for p in self._config.pools
        }
        return JSONResponse({**status, "pools": pools, "events": status.get("events", [])})

    @app.get("/metrics")
    async def prometheus(self) -> Response:
        # The router's queues, breakers and failovers live in its process: it renders its own.
        try:
            routing: bytes = await self._router.metrics_text.remote()
        except Exception as error:  # noqa: BLE001 - the gateway's own metrics still answer
            logger.warning("metrics: router unavailable: %s", error)
            routing = b""
        try:
            keys = await self._metering.metrics_text()
        except Exception as error:  # noqa: BLE001 - as above: the rest still answers
            logger.warning("metrics: key ledger unavailable: %s", error)
            keys = b""
        return Response(metrics.render() + routing + keys, media_type=metrics.CONTENT_TYPE)

    async def _chat(self, request: Request, started: float) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        limits = self._config.gateway
        payload = _parse_json(await _read_body(request, limits.max_body_bytes), limits)
        role = self._role_for(payload)
        priority = claimed_priority(request.headers.get(PRIORITY_HEADER), caller)
        chat_request = _validate(payload, limits)
        depth = None
        context_share = 1.0
        if role is None:  # `model: auto`: the depth router picks the role and the budget
            effort = payload.get("reasoning_effort")
            depth = self._depth_for(
                _latest_user_text(payload),
                request.headers.get(DEPTH_HEADER),
                effort if isinstance(effort, str) else None,
            )
            route = self._config.depth_route(depth.depth)
            role, context_share = route.role, route.context_share
        check_tool_support(payload, payload["model"], self._config.model_for(role).tools)
        job = ChatJob(chat_request, role, priority, caller.name, context_share)
        return await self._metered(job, depth, started)

    async def _complete(self, request: Request, started: float) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        limits = self._config.gateway
        payload = _parse_json(await _read_body(request, limits.max_body_bytes), limits)
        role = self._role_for(payload)
        priority = claimed_priority(request.headers.get(PRIORITY_HEADER), caller)
        completion = _validate_completion(payload)
        depth = None
        context_share = 1.0
        if role is None:  # `model: auto`: the depth of the prompt's text picks the role
            text = completion.prompt if isinstance(completion.prompt, str) else ""
            depth = self._depth_for(text, request.headers.get(DEPTH_HEADER))
            route = self._config.depth_route(depth.depth)
            role, context_share = route.role, route.context_share
        job = ChatJob(completion, role, priority, caller.name, context_share)
        return await self._metered(job, depth, started)

    async def _embed(self, request: Request, started: float) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        limits = self._config.gateway
        payload = _parse_json(await _read_body(request, limits.max_body_bytes), limits)
        role = self._role_for(payload, vectors=True)
        priority = claimed_priority(request.headers.get(PRIORITY_HEADER), caller)
        assert role is not None  # `auto` chooses among text models: refused for vectors
        job = ChatJob(_validate_embedding(payload), role, priority, caller.name)
        return await self._metered(job, None, started)

    async def _metered(self, job: ChatJob, depth: DepthDecision | None, started: float) -> Response:
        """The job answered under its key's limits, its usage counted however it ends."""
        usage = None
        streamed = not is_embedding(job.request) and bool(job.request.stream)
        if streamed:
            usage = StreamUsage(_wants_usage(job.request))
        try:
            admission = await self._metering.admit(job.caller)
        except ApiError as error:  # over the key's limits: counted, under no backend
            seconds = time.perf_counter() - started
            metrics.observe_answer(metrics.NO_BACKEND, job.priority.value, error.status, seconds)
            raise
        if streamed:  # the engine's count for the key and the metrics, not an estimate
            asked = job.request.stream_options
            kept = asked.model_dump(exclude_none=True) if asked is not None else {}
            options = StreamOptions(**{**kept, "include_usage": True})
            job = replace(job, request=job.request.model_copy(update={"stream_options": options}))
        served = _Served()
        try:
            return await self._answer(job, admission, usage, depth, started, served)
        except ApiError as error:
            self._metering.settle(admission, 0, 0)
            error.headers = {**admission.headers, **error.headers}
            seconds = time.perf_counter() - started
            metrics.observe_answer(served.backend, job.priority.value, error.status, seconds)
            raise
        except BaseException as error:  # no answer: its lease must not hold a slot for an hour
            self._metering.settle(admission, 0, 0)
            # A client that left (499, nginx's word for it), or the gateway's own failure.
            status = 499 if isinstance(error, asyncio.CancelledError) else 500
            seconds = time.perf_counter() - started
            metrics.observe_answer(served.backend, job.priority.value, status, seconds)
            raise

    async def _answer(
        self,
        job: ChatJob,
        admission: Admission,
        usage: StreamUsage | None,
        depth: DepthDecision | None,
        started: float,
        served: _Served,
    ) -> Response:
        first: Any = None
        if usage is not None:
            stream: DeploymentResponseGenerator[Any] = self._router_stream.chat.remote(job)
            routed = await anext(stream)
            if isinstance(routed, Routed):
                first = await anext(stream)
        else:
            # One unary call: a whole answer needs none of the streaming machinery's per-item
            # round trips (bench/overhead.py).
            stream = None
            routed, *rest = await self._router.chat_once.remote(job)
            first = next(iter(rest), None)
        if isinstance(routed, Refusal):
            raise _refusal_error(routed)
        assert isinstance(routed, Routed)
        served.backend = routed.backend
        metrics.observe_routing(routed, depth.depth.value if depth else None)
        if isinstance(first, Refusal):
            raise _refusal_error(first)
        # Streaming answers come in batches (lists); an engine error may be the first item of one.
        leading = first[0] if isinstance(first, list) and first else first
        if isinstance(leading, ErrorResponse):
            raise _engine_error(leading)
        headers = {
            **_routing_headers(routed, job.priority, depth),
            **admission.headers,
            OVERHEAD_HEADER: milliseconds(time.perf_counter() - started - routed.engine_wait_s),
        }
        if stream is None or usage is None or not isinstance(first, list):  # a whole response
            counted = getattr(first, "usage", None)
            prompt = getattr(counted, "prompt_tokens", 0) or 0
            completion = getattr(counted, "completion_tokens", 0) or 0
            self._metering.settle(admission, prompt, completion)
            metrics.observe_tokens(routed.backend, prompt, completion)
            body = first.model_dump_json()
            seconds = time.perf_counter() - started
            metrics.observe_answer(routed.backend, job.priority.value, 200, seconds)
            return Response(body, media_type="application/json", headers=headers)
        timing = metrics.StreamTiming(routed.backend, job.priority.value, started)
        relay = _relay_sse(first, stream, usage, timing)
        return StreamingResponse(
            self._settled(relay, admission, usage, routed, timing),
            media_type="text/event-stream",
            headers=headers,
        )

    async def _settled(
        self,
        relay: AsyncIterator[str],
        admission: Admission,
        usage: StreamUsage,
        routed: Routed,
        timing: metrics.StreamTiming,
    ) -> AsyncIterator[str]:
        """The relayed stream; its usage booked when it ends, the client's leaving included."""
        try:
            async for text in relay:
                yield text
        finally:
            totals = usage.totals(routed.prompt_tokens)
            self._metering.settle(admission, *totals)
            metrics.observe_tokens(routed.backend, *totals)
            timing.ended()

    def _role_for(self, payload: dict[str, Any], vectors: bool = False) -> Role | None:
        """The role a request names; None for `auto`, which the depth router resolves.
        `vectors`: for `/v1/embeddings`, which only an embedding model answers (and text
        endpoints never go to one)."""
        name = payload.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(
                400, ErrorCode.MISSING_MODEL, "The field 'model' is required.", param="model"
            )
        if name not in self._served:
            available = ", ".join(self._served)
            raise ApiError(
                404,
                ErrorCode.MODEL_NOT_FOUND,
                f"The model {name!r} does not exist. Available models: {available}.",
                param="model",
            )
        role = self._served[name]
        _check_kind(name, role, vectors, self._served)
        served_roles = set(self._served.values())
        # Images go to the vision role whatever was asked: a text model cannot read them.
        if not vectors and Role.VISION in served_roles and _has_image_parts(payload):
            return Role.VISION
        return role

    def _depth_for(
        self, latest: str, header: str | None, effort: str | None = None
    ) -> DepthDecision:
        try:
            return classify(
                latest, rules=self._config.depth, header=header, reasoning_effort=effort
            )
        except UnknownDepth as error:
            raise ApiError(400, ErrorCode.INVALID_REQUEST, str(error), param="X-Depth") from None


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(
        413,
        ErrorCode.REQUEST_TOO_LARGE,
        f"The request body exceeds the limit of {limit} bytes.",
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _parse_json(body: bytes, limits: GatewayConfig) -> dict[str, Any]:
    return parse_object(body, limits.max_json_depth)


def _validate(payload: dict[str, Any], limits: GatewayConfig) -> Any:
    """The request as vLLM's ChatCompletionRequest, or ApiError 400: never another exception."""
    check_chat_request(payload, max_messages=limits.max_messages)
    try:
        request = ChatCompletionRequest.model_validate(payload)
        # Pydantic leaves lazy iterators in message content that Ray cannot pickle.
        return _sanitize_chat_completion_request(request)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        message = f"Invalid request: {where}: {first['msg']}" if where else first["msg"]
        raise ApiError(400, ErrorCode.INVALID_REQUEST, message, param=where) from None
    except Exception as error:  # noqa: BLE001
        # vLLM's validators raise what pydantic does not wrap (VLLMValidationError, KeyError)
        # and the sanitizer a plain ValueError: all about the body, none a backend's fault.
        # Our own checks should have caught it first, so it is logged for a new rule.
        logger.warning("request refused by vLLM's schema, not ours: %r", error)
        param = getattr(error, "parameter", None)
        raise ApiError(
            400, ErrorCode.INVALID_REQUEST, f"Invalid request: {error}", param=param
        ) from None


def _latest_user_text(payload: dict[str, Any]) -> str:
    messages = payload["messages"]  # validated: a non-empty list of messages
    users = [m for m in messages if m.get("role") == "user"]
    return message_text(users[-1]) if users else ""


def _check_kind(name: str, role: Role | None, vectors: bool, served: dict[str, Any]) -> None:
    """Text endpoints never reach an embedding model, nor `/v1/embeddings` a text model (`auto`,
    None here, resolves to a text model)."""
    generates = role is None or role.generates
    if vectors and generates:
        names = ", ".join(n for n, r in served.items() if r is not None and not r.generates)
        where = f"embedding models here: {names}" if names else "no embedding model is served"
        message = f"The model {name!r} generates text, not embeddings ({where})."
        raise ApiError(400, ErrorCode.INVALID_REQUEST, message, param="model")
    if not vectors and not generates:
        message = f"The model {name!r} is an embedding model: send it to /v1/embeddings."
        raise ApiError(400, ErrorCode.INVALID_REQUEST, message, param="model")


def _validate_embedding(payload: dict[str, Any]) -> Any:
    """The request as vLLM's EmbeddingCompletionRequest, or ApiError 400."""
    check_embedding_request(payload)
    try:
        return EmbeddingCompletionRequest.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        message = f"Invalid request: {where}: {first['msg']}" if where else first["msg"]
        raise ApiError(400, ErrorCode.INVALID_REQUEST, message, param=where) from None
    except Exception as error:  # noqa: BLE001 - as for chats: the body's fault, logged for a rule
        logger.warning("embedding refused by vLLM's schema, not ours: %r", error)
        raise ApiError(400, ErrorCode.INVALID_REQUEST, f"Invalid request: {error}") from None


def _validate_completion(payload: dict[str, Any]) -> Any:
    """The request as vLLM's CompletionRequest, or ApiError 400: never another exception."""
    check_completion_request(payload)
    try:
        return CompletionRequest.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        message = f"Invalid request: {where}: {first['msg']}" if where else first["msg"]
        raise ApiError(400, ErrorCode.INVALID_REQUEST, message, param=where) from None
    except Exception as error:  # noqa: BLE001 - as for chats: the body's fault, logged for a rule
        logger.warning("completion refused by vLLM's schema, not ours: %r", error)
        raise ApiError(400, ErrorCode.INVALID_REQUEST, f"Invalid request: {error}") from None


@dataclass
class _Served:
    """Which backend a job reached, for the metrics of an answer that failed after it."""

    backend: str = metrics.NO_BACKEND


def _has_image_parts(payload: dict[str, Any]) -> bool:
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return False
    return any(
        isinstance(part, dict) and part.get("type") == "image_url"
        for message in messages
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
    )


def _routing_headers(
    routed: Routed, priority: PriorityClass, depth: DepthDecision | None
) -> dict[str, str]:
    headers = {
        "X-Backend": routed.backend,
        "X-Priority": priority.value,
        "X-Max-Tokens": str(routed.max_tokens),
        "X-Context-Fitted": "true" if routed.context_fitted else "false",
        "X-Context-Dropped-Messages": str(routed.dropped_messages),
        "X-Failovers": str(routed.failovers),
    }
    if depth is not None:
        headers["X-Depth"] = depth.depth.value
        headers["X-Depth-Reason"] = depth.reason
    return headers


def _refusal_error(refusal: Refusal) -> ApiError:
    headers = {}
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = str(refusal.retry_after_s)
    return ApiError(refusal.status, refusal.code, refusal.message, headers=headers)


def _engine_error(response: ErrorResponse) -> ApiError:
    info = response.error
    error = EngineError(info.code, info.type, info.message, info.param)
    if response_fault(error) is Fault.CLIENT:  # whatever an engine rejects as invalid: 400
        if "context length" in info.message.lower():
            code = ErrorCode.CONTEXT_LENGTH_EXCEEDED
        else:
            code = info.type if info.type in PASSED_THROUGH_CODES else ErrorCode.INVALID_REQUEST
        return ApiError(400, code, readable_message(info.message), param=info.param)
    status = info.code if isinstance(info.code, int) and info.code >= 500 else 502
    code = info.type if info.type in PASSED_THROUGH_CODES else ErrorCode.BACKEND_ERROR
    return ApiError(status, code, info.message)


def _sse_text(part: Any, usage: StreamUsage) -> str:
    """An SSE line as is; an engine error after the stream began becomes an SSE error event."""
    if isinstance(part, ErrorResponse):
        error = _engine_error(part)
        return f"data: {json.dumps(error.body())}\n\n"
    return usage.filter(str(part))


async def _relay_sse(
    first: list[str],
    stream: DeploymentResponseGenerator[Any],
    usage: StreamUsage,
    timing: metrics.StreamTiming,
) -> AsyncIterator[str]:
    """Relay the engine's SSE lines; cancel the whole chain if the client goes away."""
    done = False
    try:
        item: Any = first
        while True:
            text = "".join(_sse_text(part, usage) for part in item)
            done = done or text.rstrip().endswith("data: [DONE]")
            if any(isinstance(part, ErrorResponse) for part in item) or _ERROR_EVENT in text:
                timing.failed()
            timing.relayed(len(item))
            yield text
            item = await anext(stream, None)
            if item is None:
                break
        if not done:
            yield "data: [DONE]\n\n"
        timing.completed()
    finally:
        stream.cancel()


# How the router's and our own SSE error events begin (deployments/router/faults.py).
_ERROR_EVENT = 'data: {"error"'


def _wants_usage(request: Any) -> bool:
    options = request.stream_options
    return bool(options and options.include_usage)


def _ledger(config: ClusterConfig) -> RayLedger:
    """The app's key ledger (started by the first replica to need it)."""
    import ray

    app_name = serve.get_replica_context().app_name
    namespace = ray.get_runtime_context().namespace
    return ensure_key_ledger(app_name, namespace, config.gateway_resources)


def build_ingress(
    config: ClusterConfig, router: Any, backends: Mapping[str, Any] | None = None
) -> Any:
    """The ingress deployment over a bound router, or (`router` None) running its own over
    `backends`."""
    deployment = serve.deployment(serve.ingress(app)(Ingress))
    return deployment.options(
        name="ingress",
        num_replicas=config.gateway.ingress_replicas,
        # Backpressure lives in the router; the ingress must never be the queue.
        max_ongoing_requests=10_000,
        ray_actor_options=front_actor_options(config.gateway_resources),
    ).bind(config, router, None, None if backends is None else dict(backends))
