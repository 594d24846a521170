"""The OpenAI-compatible Ingress deployment: HTTP, auth, body limits, schema; nothing slower.

Everything a client can get wrong is answered here with OpenAI error JSON and the right status,
before any work reaches the router or an engine. The router decides where a job runs.
Anthropic's Messages API and OpenAI's Responses API are translated at this edge into the same
chat job and back (deployments/ingress/anthropic, deployments/ingress/responses), Anthropic's
errors in its own shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from ray.exceptions import ActorDiedError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.responses import JSONResponse, Response, StreamingResponse

from core.answers import EngineError, WholeAnswer
from core.config import ClusterConfig
from core.errors import ApiError, ErrorCode
from core.requests import EmbeddingRequest
from core.types import Depth, PriorityClass
from core.wire import ChatJob, Refusal, Reply
from deployments.batch.actor import replica_batch_actor
from deployments.ingress import answers, metrics
from deployments.ingress.anthropic.errors import anthropic_status
from deployments.ingress.anthropic.http import anthropic_answer, anthropic_stream, authorization
from deployments.ingress.anthropic.request import to_chat, to_counted
from deployments.ingress.auth import PRIORITY_HEADER, Caller, KeyRing
from deployments.ingress.batch_api import BatchApi
from deployments.ingress.body import read_body
from deployments.ingress.catalog import model_cards
from deployments.ingress.error_response import install_error_handlers
from deployments.ingress.files_routes import FilesRoutes, files_routes
from deployments.ingress.jobs import SESSION_HEADER, Jobs, with_session
from deployments.ingress.key_routes import KeyRoutes, key_routes, serve_run_time_keys
from deployments.ingress.media_fetch import ImageFetcher, Resolve, system_resolve
from deployments.ingress.overhead_header import OverheadHeader, engine_waited
from deployments.ingress.responses.conversation import input_items, page, with_ids
from deployments.ingress.responses.http import responses_answer
from deployments.ingress.responses.keeper import ResponseKeeperClient, replica_response_keeper
from deployments.ingress.responses.request import to_chat as to_response_chat
from deployments.ingress.responses.store import StoredResponse
from deployments.ingress.translated import json_text
from deployments.keys.ledger import LedgerClient, replica_key_ledger
from deployments.keys.metering import Admission, KeyMetering
from deployments.keys.stream_usage import StreamUsage
from deployments.live_config import Homes, serve_live_config
from deployments.router.adapters.in_process import InProcessRouter
from policy.admission import background_slots
from policy.depth import DEPTH_HEADER, DepthDecision
from policy.model_access import may_use, usable_names
from policy.request import parse_object
from policy.request.fields import fail
from policy.request.remote_images import ANTHROPIC, CHAT, RESPONSES

logger = logging.getLogger("ray.serve")
T = TypeVar("T")
KEEPER_TIMEOUT_S = 10.0  # a write or a read of one row: milliseconds when the keeper is up

# A request's job from its parsed body, caller, X-Priority and X-Depth headers.
JobBuilder = Callable[
    [dict[str, Any], Caller, str | None, str | None], tuple[ChatJob, DepthDecision | None]
]

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
app.add_middleware(OverheadHeader)
app.include_router(files_routes)
app.include_router(key_routes)
install_error_handlers(app)


class Ingress(FilesRoutes, KeyRoutes):
    def __init__(
        self,
        config: ClusterConfig,
        router: DeploymentHandle | None,
        ledger: Callable[[], LedgerClient] | None = None,
        backends: Mapping[str, DeploymentHandle] | None = None,
        start_batches: bool = False,
        batch_service: Callable[[], Any] | None = None,
        registry: Callable[[], Any] | None = None,
        build: str = "",
        responses: Callable[[], ResponseKeeperClient] | None = None,
        resolve: Resolve = system_resolve,
    ) -> None:
        """`router` None: this replica runs its own Router over `backends`
        (`gateway.router_in_ingress`). `start_batches`: start the app's batch service now (in
        Serve), so batches a restart cut off go on without waiting for a call. `build`: this
        build of the app's token, whose reloads it applies (deployments/live_config.py).
        `responses`: the stored responses' keeper (the app's actor unless given). `resolve`:
        host names to addresses for the image fetcher (the system's resolver unless given)."""
        if router is None:
            from deployments.router.router import ServeRouter  # only where the router runs here

            router = InProcessRouter(ServeRouter(config, backends or {}))
        assert router is not None
        self._config = config
        self._keys = KeyRing(config.api_keys, config.gateway.default_priority)
        self._served = config.served_names
        self._cards = model_cards(config, self._served)
        self._jobs = Jobs(config)
        # gateway.media is fixed at build (the engines' image limits follow it): kept as built.
        self._fetcher = ImageFetcher(config.gateway.media, resolve)
        self._router = router
        self._router_stream = router.options(stream=True)  # cached: each .options() costs
        self._metering = KeyMetering(
            config.api_keys, ledger or (lambda: replica_key_ledger(config.gateway_resources))
        )
        self._batches = BatchApi(
            self._keys,
            functools.cache(batch_service or (lambda: replica_batch_actor(config))),
            config.batches,
            config.gateway.max_json_depth,
        )
        self._responses = functools.cache(
            responses
            or (lambda: replica_response_keeper(str(config.responses_db), config.gateway_resources))
        )
        # The /v1/keys routes (key_routes.py), and the sync that keeps the run-time keys here.
        self._key_admin, self._key_sync = serve_run_time_keys(
            config, self._keys, self._metering, registry
        )
        if start_batches:
            self._batches.start()
        if not self._keys.enabled:
            logger.warning("API keys: none configured, authentication is OFF")
        self._build = build  # make reload's configs applied in place, the last one from now
        self._live = serve_live_config(build, self.apply_config)

    def apply_config(self, config: ClusterConfig, homes: Homes | None = None) -> None:
        """A reload (deployments/live_config.py): keys and their limits, request limits, the
        models served and, where the router runs here, its backends, caps, chains and settings
        (core/config/reload.py)."""
        jobs, served = Jobs(config), config.served_names
        if isinstance(self._router, InProcessRouter):
            self._router.router.apply_config(config, homes or {})
        self._keys.use_config(config.api_keys, config.gateway.default_priority)
        self._metering.use_config(config.api_keys)
        self._key_admin.use_config(config)
        self._served, self._cards = served, model_cards(config, served)
        self._jobs, self._config = jobs, config

    async def live_config(self) -> dict[str, Any]:
        """The config this replica runs, its revision and build (for `make reload`)."""
        config = self._config.model_dump(mode="json")
        return {"revision": self._revision, "build": self._build, "config": config}

    @property
    def _revision(self) -> int:
        return self._live.revision if self._live is not None else 0  # 0: its file's config

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        cards = [self._cards[name] for name in usable_names(caller.models, self._served)]
        return JSONResponse({"object": "list", "data": cards})

    @app.get("/v1/models/{model_id:path}")
    async def model(self, model_id: str, request: Request) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        if not may_use(caller.models, model_id, self._served.get(model_id)):
            raise ApiError(
                403,
                ErrorCode.MODEL_NOT_ALLOWED,
                f"This API key may not use the model {model_id!r}.",
            )
        if model_id not in self._cards:
            raise ApiError(
                404, ErrorCode.MODEL_NOT_FOUND, f"The model {model_id!r} does not exist."
            )
        return JSONResponse(self._cards[model_id])

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request) -> Response:
        return await self._observed("chat", self._chat, request)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._observed("completions", self._complete, request)

    @app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        return await self._observed("embeddings", self._embed, request)

    @app.post("/v1/messages")
    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API: the same job as a chat, its answer and errors in
        Anthropic's shapes (deployments/ingress/anthropic)."""
        return await self._observed("messages", self._anthropic, request, _anthropic_status)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(self, request: Request) -> Response:
        """What the client sent, counted with the model's own tokenizer and chat template, as
        Anthropic counts: before any fitting."""
        caller = self._keys.authenticate(authorization(request.headers))
        payload = await self._fetcher.inline(await self._payload(request), ANTHROPIC)
        messages, tools = to_counted(payload)
        # The translated messages: image blocks are `image_url` parts there, counted by a model
        # that reads them.
        model = self._jobs.counted_model({"model": payload["model"], "messages": messages}, caller)
        count = await self._router.count_tokens.remote(model, messages, tools)
        if count is None:
            message = f"No backend of the model {payload['model']!r} is deployed here."
            raise ApiError(503, ErrorCode.BACKEND_UNAVAILABLE, message)
        return JSONResponse({"input_tokens": count})

    @app.post("/v1/responses")
    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API: the same job as a chat, its answer a response object or its
        stream's events (deployments/ingress/responses)."""
        return await self._observed("responses", self._respond, request)

    @app.get("/v1/responses/{response_id}")
    async def stored_response(self, response_id: str, request: Request) -> Response:
        stored = await self._stored(response_id, request)
        return JSONResponse(stored.response)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(self, response_id: str, request: Request) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        if not await self._keeping(lambda keeper: keeper.delete(response_id, caller.name)):
            raise _not_stored(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.get("/v1/responses/{response_id}/input_items")
    async def response_input(self, response_id: str, request: Request) -> Response:
        stored = await self._stored(response_id, request)
        return JSONResponse(page(stored.input_items, dict(request.query_params)))

    async def _stored(self, response_id: str, request: Request) -> StoredResponse:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        stored = await self._keeping(lambda keeper: keeper.find(response_id, caller.name))
        if stored is None:
            raise _not_stored(response_id)
        return stored

    async def _keeping(self, call: Callable[[ResponseKeeperClient], Awaitable[T]]) -> T:
        """A call of the response keeper within KEEPER_TIMEOUT_S (Ray holds calls to an actor
        that restarts); one that fails or takes longer is a 503, never a 500."""
        try:
            # Finding or starting the actor is a GCS call: off the replica's loop.
            keeper = await asyncio.to_thread(self._responses)
            return await asyncio.wait_for(call(keeper), KEEPER_TIMEOUT_S)
        except ApiError:
            raise
        except Exception as error:  # noqa: BLE001 - the keeper down is a 503, never a 500
            logger.warning("response keeper: %s: %s", type(error).__name__, error)
            if isinstance(error, ActorDiedError):
                self._responses.cache_clear()  # gone for good: look it up again next time
            raise ApiError(
                503,
                ErrorCode.STORE_UNAVAILABLE,
                f"The response store is not reachable: {type(error).__name__}.",
                headers={"Retry-After": "5"},
            ) from None

    async def _observed(
        self,
        endpoint: str,
        serve: Callable[[Request, float], Awaitable[Response]],
        request: Request,
        shown: Callable[[ApiError], int] = lambda error: error.status,
    ) -> Response:
        """`serve`'s answer, counted under `endpoint` with the status the client sees."""
        started = time.perf_counter()
        try:
            response = await serve(request, started)
        except ApiError as error:
            metrics.observe_request(endpoint, shown(error), time.perf_counter() - started)
            raise
        metrics.observe_request(endpoint, response.status_code, time.perf_counter() - started)
        return response

    async def batch_answer(self, endpoint: str, body: dict[str, Any], owner: str) -> dict[str, Any]:
        """One batch line, answered as an HTTP request to `endpoint` would be, as `owner`'s
        key at background priority (the batch service calls this through Serve's handle)."""
        started = time.perf_counter()
        builders = {"/v1/chat/completions": self._jobs.chat,
                    "/v1/completions": self._jobs.completion,
                    "/v1/embeddings": self._jobs.embedding}  # fmt: skip
        payload = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        try:
            caller = self._keys.named(owner)
            if endpoint == "/v1/chat/completions":  # its image URLs fetched as for a request
                payload = await self._fetcher.inline(payload, CHAT)
            job, depth = builders[endpoint](payload, caller, PriorityClass.BACKGROUND.value, None)
            response = await self._metered(job, depth, started)
            answer = json.loads(bytes(response.body))
            usage = answer.get("usage") or {}
            return {
                "status": response.status_code,
                "body": answer,
                "request_id": str(answer.get("id", "")),
                "usage": (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0),
            }
        except ApiError as error:
            retry = error.headers.get("Retry-After")
            return {"status": error.status, "body": error.body(),
                    "retry_after_s": float(retry) if retry else None}  # fmt: skip
        except Exception:  # a bug of ours: the line is tried again, then failed, never lost
            logger.exception("batch line failed in the ingress")
            failure = ApiError(500, ErrorCode.INTERNAL_ERROR, "The gateway hit an internal error.")
            return {"status": 500, "body": failure.body()}

    async def batch_slots(self, model: str) -> int:
        """Requests `model`'s backends run at background priority at once (the router's own
        limit: more would only queue there), over every router; 1 while none runs."""
        named = self._served.get(model) or self._config.depth_route(Depth.BALANCED)[0]
        name = self._config.base_model(named).name  # an adapter runs on its base's backends
        status: dict[str, Any] = await self._router.status.remote()
        backends = status.get("backends", {}).values()
        slots = background_slots(backends, name, self._config.router.class_shares)
        return max(1, slots * self._config.gateway.router_shares)

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
        events, revision = status.get("events", []), self._revision
        return JSONResponse(
            {**status, "pools": pools, "events": events, "config_revision": revision}
        )

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
        return await self._serve(request, started, self._jobs.chat, images=CHAT)

    async def _complete(self, request: Request, started: float) -> Response:
        return await self._serve(request, started, self._jobs.completion)

    async def _embed(self, request: Request, started: float) -> Response:
        return await self._serve(request, started, self._jobs.embedding)

    async def _anthropic(self, request: Request, started: float) -> Response:
        caller = self._keys.authenticate(authorization(request.headers))
        payload = await self._fetcher.inline(await self._payload(request), ANTHROPIC)
        chat = to_chat(payload)
        headers = request.headers
        job, depth = self._jobs.chat(
            chat, caller, headers.get(PRIORITY_HEADER), headers.get(DEPTH_HEADER)
        )
        job = with_session(job, headers.get(SESSION_HEADER))
        if isinstance(job.request, EmbeddingRequest) or not job.request.stream:
            return anthropic_answer(await self._metered(job, depth, started), payload["model"])
        # A stream that waits in a queue is begun and pinged, as Anthropic's own.
        answer = asyncio.ensure_future(self._metered(job, depth, started))
        ping_s = self._config.router.preempt.keepalive_s
        return await anthropic_stream(answer, payload["model"], ping_s)

    async def _respond(self, request: Request, started: float) -> Response:
        caller = self._keys.authenticate(request.headers.get("authorization"))
        payload = await self._payload(request)
        stored = payload.get("store", True)
        if not isinstance(stored, bool):
            fail("store", "must be true or false")
        # Absent, the gateway fits what does not fit (as chat); disabled refuses it (OpenAI's
        # default, said explicitly here: Codex and the SDKs send none).
        truncation = payload.get("truncation", "auto")
        if truncation not in ("auto", "disabled", None):
            fail("truncation", "must be auto or disabled")
        truncate = truncation != "disabled"
        prior: list[dict[str, Any]] = []  # the stored conversation this one continues
        previous = payload.get("previous_response_id")
        if previous is not None:
            prior = await self._previous(previous, caller)
        new_items = input_items(payload.get("input"))
        # Fetched once here: stored with the response, a later turn does not fetch them again.
        new_items = (await self._fetcher.inline({"input": new_items}, RESPONSES))["input"]
        translated = to_response_chat({**payload, "input": [*prior, *new_items]})
        headers = request.headers
        # A flex tier's work may wait: the background class, where X-Priority does not say.
        flex = payload.get("service_tier") == "flex"
        priority = headers.get(PRIORITY_HEADER) or (
            PriorityClass.BACKGROUND.value if flex else None
        )
        job, depth = self._jobs.chat(translated.chat, caller, priority, headers.get(DEPTH_HEADER))
        job = replace(with_session(job, headers.get(SESSION_HEADER)), truncate=truncate)
        answer = await self._metered(job, depth, started)
        rid = f"resp_{secrets.token_hex(24)}"
        retention_s = self._config.gateway.responses_retention_s

        async def keep(response: dict[str, Any]) -> None:
            """Stored for the key that asked; a store that fails costs the answer nothing."""
            items = [*prior, *with_ids(new_items, rid)]
            kept = StoredResponse(rid, caller.name, response, items)
            with contextlib.suppress(ApiError):  # logged by _keeping
                await self._keeping(lambda keeper: keeper.put(kept, retention_s))

        echoed = {**payload, "store": stored}
        kept = keep if stored else None
        return await responses_answer(answer, echoed, translated.names, rid, kept)

    async def _previous(self, previous: Any, caller: Caller) -> list[dict[str, Any]]:
        """The conversation up to the stored response `previous`: its input, then its output."""
        if not isinstance(previous, str) or not previous:
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                "previous_response_id must be a response's id (a string).",
                param="previous_response_id",
            )
        found = await self._keeping(lambda keeper: keeper.find(previous, caller.name))
        if found is None:
            raise ApiError(  # a 400, as OpenAI's: the request names what is not there
                400,
                ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND,
                f"Previous response with id {previous[:100]!r} not found.",
                param="previous_response_id",
            )
        return found.conversation()

    async def _payload(self, request: Request) -> dict[str, Any]:
        limits = self._config.gateway
        body = await read_body(request, limits.max_body_bytes)
        return parse_object(body, limits.max_json_depth)

    async def _serve(
        self, request: Request, started: float, build: JobBuilder, images: str | None = None
    ) -> Response:
        """`images`: the API whose image URLs the body may carry, fetched here first."""
        caller = self._keys.authenticate(request.headers.get("authorization"))
        payload = await self._payload(request)
        if images is not None:
            payload = await self._fetcher.inline(payload, images)
        headers = request.headers
        job, depth = build(payload, caller, headers.get(PRIORITY_HEADER), headers.get(DEPTH_HEADER))
        job = with_session(job, headers.get(SESSION_HEADER))
        return await self._metered(job, depth, started)

    async def _metered(self, job: ChatJob, depth: DepthDecision | None, started: float) -> Response:
        """The job answered under its key's limits, its usage counted however it ends."""
        usage = None
        request = job.request
        if not isinstance(request, EmbeddingRequest) and request.stream:  # embeddings never stream
            usage = StreamUsage(request.include_usage)
            # The engine's count for the key and the metrics, not an estimate.
            job = replace(job, request=request.with_usage())
        try:
            admission = await self._metering.admit(job.caller)
        except ApiError as error:  # over the key's limits: counted, under no backend
            seconds = time.perf_counter() - started
            metrics.observe_answer(metrics.NO_BACKEND, job.priority.value, error.status, seconds)
            raise
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
        reply: Reply
        if usage is not None:
            stream: DeploymentResponseGenerator[Any] | None = self._router_stream.chat.remote(job)
            assert stream is not None
            reply = await anext(stream)
        else:
            # One unary call: a whole answer needs none of the streaming machinery's per-item
            # round trips (bench/overhead.py).
            stream = None
            reply = await self._router.chat_once.remote(job)
        if isinstance(reply, Refusal):
            engine_waited(reply.engine_wait_s)  # links that failed before it: not the gateway's
            raise answers.refusal_error(reply)
        routed, first = reply.routed, reply.first
        engine_waited(routed.engine_wait_s)  # out of x-gateway-overhead-ms, set as it starts
        served.backend = routed.backend
        metrics.observe_routing(routed, depth.depth.value if depth else None)
        # Streaming answers come in batches (lists); an engine error may be the first item of one.
        leading = first[0] if isinstance(first, list) and first else first
        if isinstance(leading, EngineError):
            raise answers.engine_error(leading)
        headers = {**answers.routing_headers(routed, job.priority, depth), **admission.headers}
        if stream is None or usage is None or not isinstance(first, list):  # a whole response
            if not isinstance(first, WholeAnswer):
                raise TypeError(f"an engine answered with {type(first).__name__}, not an answer")
            counted = first.usage()
            prompt, completion = counted.prompt_tokens, counted.completion_tokens
            self._metering.settle(admission, prompt, completion)
            metrics.observe_tokens(routed.backend, prompt, completion)
            body = json_text(first.body)
            seconds = time.perf_counter() - started
            metrics.observe_answer(routed.backend, job.priority.value, 200, seconds)
            return Response(body, media_type="application/json", headers=headers)
        timing = metrics.StreamTiming(routed.backend, job.priority.value, started)

        def settle() -> None:
            """The stream's usage booked when it ends, the client's leaving included."""
            totals = usage.totals(routed.prompt_tokens)
            self._metering.settle(admission, *totals)
            metrics.observe_tokens(routed.backend, *totals)
            timing.ended()

        return StreamingResponse(
            answers.relay_sse(first, stream, usage, timing, settle),
            media_type="text/event-stream",
            headers=headers,
        )


def _anthropic_status(error: ApiError) -> int:
    return anthropic_status(error.status, error.code)


def _not_stored(response_id: str) -> ApiError:
    """Another key's response is not found either: no answer tells the two apart."""
    message = f"Response with id {response_id[:100]!r} not found."
    return ApiError(404, ErrorCode.NOT_FOUND, message)


@dataclass
class _Served:
    """Which backend a job reached, for the metrics of an answer that failed after it."""

    backend: str = metrics.NO_BACKEND
