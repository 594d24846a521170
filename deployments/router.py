"""The Router deployment: admission, breakers and failover between the ingress and the engines.

For each job it walks the role's failover chain (`policy.link_choice`): the first link that
is running, whose breaker lets work through and whose KV cache is not under pressure. There the
job waits for a slot in the backend's priority queue (`policy.gate`), is fitted to that
backend's window, and is sent. A fault before the first token (a 5xx, a dead replica, no first
token in time) is charged to the backend's breaker and the job moves to the next link, fitted
again; after the first token a fault ends the stream with an SSE error event. Two background
loops keep the view fresh: Serve's replica status with health probes for tripped breakers, and
each engine's KV-cache usage.

State is in memory. With `gateway.router_replicas` > 1, each replica enforces `cap // replicas`
of every backend, so the sum of slots never exceeds the cap; queues are then ordered per replica.
Where each model serves now every replica pulls from the placement actor (autoscale/broadcast.py),
so all of them follow each move, and one that starts late or restarts routes by it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from grpc.aio import AioRpcError
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayError
from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse
from ray.serve.exceptions import RayServeException, RequestCancelledError
from ray.serve.handle import DeploymentHandle

from autoscale.broadcast import SYNC_INTERVAL_S, PlacementView
from autoscale.placer import ensure_placer, placement_matters
from core.config import ClusterConfig
from core.topology import Target
from core.types import Role
from core.wire import ChatJob, Refusal, Routed
from deployments import router_metrics as metrics
from policy.admission import AdmissionQueue
from policy.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Transition
from policy.context.counters import counters_for
from policy.context.fit import ContextOverflow, Fit, fit_messages, pass_through
from policy.engine_errors import EngineError, sse_error
from policy.gate import BackendGate, GatePolicy, Shed
from policy.kv_pressure import KvPolicy, KvPressure
from policy.link_choice import LinkView, choose_link
from policy.oom import OOM_CODE
from policy.stream_migration import (
    Partial,
    Rewriter,
    StreamTape,
    continuable,
    continuation_request,
    migration_note,
)

logger = logging.getLogger("ray.serve")

# Faults: the backend's, never the client's. Our own cancellation is neither. Handles on Serve's
# gRPC data plane (deployments.front_options) raise AioRpcError for what Ray calls fail with.
BACKEND_FAULTS = (RayError, RayServeException, TimeoutError, AioRpcError)
# A replica gone: ActorDiedError over Ray actor calls, ActorUnavailableError over gRPC.
REPLICA_GONE = (ActorDiedError, ActorUnavailableError)
HEALTH_PROBE_TIMEOUT_S = 5.0
FIRST_SYNC_WAIT_S = 5.0  # a new router replica waits this long for where models serve now
DeploymentKey = tuple[str, str]  # (application, deployment)


def stream_error_event(message: str) -> list[str]:
    """An SSE error event and the terminator, for failures after the first token was sent."""
    error = {"error": {"message": message, "type": "server_error", "code": "backend_failed"}}
    return [f"data: {json.dumps(error)}\n\n", "data: [DONE]\n\n"]


def engine_error(item: Any) -> ErrorResponse | None:
    """The engine's error in a response item (a whole response or a batch of SSE lines)."""
    leading = item[0] if isinstance(item, list) and item else item
    return leading if isinstance(leading, ErrorResponse) else None


def is_server_error(error: ErrorResponse) -> bool:
    code = error.error.code
    return not isinstance(code, int) or code >= 500


class BackendFault(Exception):
    """The backend failed before answering; the job may move down its chain."""


class MidStreamFault(Exception):
    """The backend failed after its first token: the answer may go on on the next link."""

    def __init__(self, tape: StreamTape, max_tokens: int, detail: str) -> None:
        super().__init__(detail)
        self.tape = tape
        self.max_tokens = max_tokens


@dataclass(frozen=True)
class Continuing:
    """An answer being continued: what the client has of it, who began it, its token budget."""

    partial: Partial
    source: str
    budget: int


def split_at_server_error(item: Any) -> tuple[list[Any], ErrorResponse | EngineError | None]:
    """A batch of SSE lines cut at its first server error (an ErrorResponse, or vLLM's
    `data: {"error": ...}` line with a 5xx or no code): the parts before it, and the error."""
    parts = item if isinstance(item, list) else [item]
    for index, part in enumerate(parts):
        if isinstance(part, ErrorResponse) and is_server_error(part):
            return parts[:index], part
        error = sse_error(part) if isinstance(part, str) else None
        if error is not None and (error.code is None or error.code >= 500):
            return parts[:index], error
    return parts, None


def _error_text(error: ErrorResponse | EngineError) -> str:
    if isinstance(error, ErrorResponse):
        return f"engine error {error.error.code}: {error.error.message}"
    return f"engine error {error.code}: {error.message}"


@dataclass
class Link:
    """One chain link (a backend or the fallback) as the router drives it."""

    target: Target
    stream: DeploymentHandle  # .options(stream=True), cached: each .options() builds a router
    unary: DeploymentHandle
    gate: BackendGate
    breaker: CircuitBreaker
    kv: KvPressure
    running: bool = True  # until the first health check says otherwise
    awaiting_recovery: bool = False  # its only replica died: out until a health probe passes
    in_flight: int = 0
    # Jobs that chose this link and have not finished: being fitted, queued for a slot or in
    # flight. A placement move drains the source until no router replica holds any.
    claims: int = 0
    kv_observable: bool = True
    seen_transitions: int = field(default=0)
    # Deliberately at zero replicas: a model's non-home pool until placement moves it there, or
    # the pool it was moved away from. Not down, not worth health checks, never chosen.
    parked: bool = False

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        self.claims += 1
        try:
            yield
        finally:
            self.claims -= 1

    @property
    def deployment(self) -> DeploymentKey:
        """The Serve deployment behind the handle: ours, or one in another app."""
        return (self.unary.app_name, self.unary.deployment_name)

    @property
    def troubled(self) -> bool:
        """Down, recovering or tripped (and not parked): worth a health check soon."""
        return not self.parked and (
            not self.running
            or self.awaiting_recovery
            or self.breaker.state is not BreakerState.CLOSED
        )

    def view(self, now: float) -> LinkView:
        return LinkView(
            running=self.running and not self.parked,  # a parked link only drains
            breaker_passes=self.breaker.can_pass(),
            kv_pressured=self.kv.pressured(now),
        )


class Router:
    def __init__(
        self,
        config: ClusterConfig,
        backends: Mapping[str, DeploymentHandle],
        clock: Callable[[], float] = time.monotonic,
        watch: bool = True,
    ) -> None:
        """`watch=False` leaves out the health and KV loops (tests drive without Serve)."""
        self._config = config
        self._clock = clock
        self._watch = watch
        targets = config.targets
        self._counters = counters_for(targets[name] for name in backends)
        # Fitting a long conversation tokenizes for up to half a second: one worker thread keeps
        # that off the event loop that relays every stream (and fits one at a time, in order).
        self._fitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fit")
        settings = config.router
        breaker_policy = BreakerPolicy(
            failure_threshold=settings.breaker_failures,
            cooldown_s=settings.breaker_cooldown_s,
            half_open_probes=settings.half_open_probes,
        )
        kv_policy = KvPolicy(
            high=settings.kv_cache_high,
            resume_factor=settings.kv_cache_resume_factor,
            stale_after_s=settings.kv_stale_after_s,
        )
        gate_policy = GatePolicy(settings.queue_timeout_s, settings.retry_after_s)
        self._links: dict[str, Link] = {}
        for name, handle in backends.items():
            target = targets[name]
            cap = max(1, target.cap // config.gateway.router_replicas)
            queue = AdmissionQueue(
                cap=cap,
                max_queue=settings.max_queue,
                aging_s=settings.aging_s,
                shares=settings.class_shares,
            )
            self._links[name] = Link(
                target=target,
                stream=handle.options(stream=True),
                unary=handle,
                gate=BackendGate(queue, gate_policy, clock),
                breaker=CircuitBreaker(breaker_policy, clock),
                kv=KvPressure(kv_policy),
            )
        # Where each role serves now (placement may move it off its home pool), and the moves:
        # the placement actor's view, pulled by `_placement_loop` (autoscale/broadcast.py).
        self._placement: dict[Role, str] = {b.role: b.name for b in config.home_backends}
        self._moves: list[dict[str, Any]] = []
        self._moves_counted = 0  # the `seq` of the last move counted in the metrics
        self._view_version = 0
        self._synced = asyncio.Event()
        for link in self._links.values():
            role = link.target.role
            link.parked = role is not None and self._placement.get(role) != link.target.name
        for role, backend in self._placement.items():
            if backend in self._links:
                metrics.MODEL_POOL.labels(role.value, self._links[backend].target.pool).set(1)
        self._loops: list[asyncio.Task[None]] = []
        self._placer: Any = None
        if watch and placement_matters(config):
            context = serve.get_replica_context()
            self._replica = context.replica_id.unique_id
            self._placer = ensure_placer(
                config, context.app_name, ray.get_runtime_context().namespace
            )

    # -- the request path ----------------------------------------------------------------------

    async def chat(self, job: ChatJob) -> AsyncIterator[Any]:
        """[Routed, items...] or [Refusal]; once a stream has begun, a refusal is an SSE error."""
        streaming = False
        async for item in self._chat(job):
            if streaming and isinstance(item, Refusal):
                item = stream_error_event(f"The answer could not be continued: {item.message}")
            streaming = streaming or isinstance(item, Routed)
            yield item

    async def _chat(self, job: ChatJob) -> AsyncIterator[Any]:
        self._start_loops()
        await self._first_sync()
        chain = self._chain(job.role)
        tried: list[str] = []
        original = job.request
        continuing: Continuing | None = None  # a stream whose link failed after its first token
        while True:
            now = self._clock()
            name = choose_link(chain, {n: link.view(now) for n, link in self._links.items()}, tried)
            if name is None:
                yield self._unavailable(job.role, tried)
                return
            link = self._links[name]
            with link.claimed():
                refusal: Refusal | None = None
                try:
                    fit = await self._fit(job, link.target)
                except ContextOverflow as overflow:
                    refusal = Refusal(400, "context_length_exceeded", str(overflow))
                except Exception as error:  # a chat template that rejects the messages
                    message = f"The messages cannot be rendered: {error}"
                    refusal = Refusal(400, "invalid_request", message)
                if refusal is None:
                    waited_from = self._clock()
                    try:
                        await link.gate.acquire(job.priority)
                    except Shed as shed:
                        metrics.SHED.labels(job.priority.value, shed.reason).inc()
                        message = f"The backend {name} is overloaded ({shed.reason}); retry later."
                        refusal = Refusal(429, "overloaded", message, shed.retry_after_s)
                    finally:
                        metrics.QUEUE_WAIT_SECONDS.labels(job.priority.value).observe(
                            self._clock() - waited_from
                        )
                if refusal is not None and continuing is not None:
                    tried.append(name)  # half an answer is out: another link may take the rest
                    continue
                if refusal is not None:
                    yield refusal
                    return
                try:
                    async for item in self._serve_on(link, job, fit, len(tried), continuing):
                        yield item
                    return
                except BackendFault as fault:
                    logger.warning("backend %s failed before answering: %s", name, fault)
                    metrics.FAILOVERS.labels(name).inc()
                    tried.append(name)
                except MidStreamFault as fault:
                    logger.warning("backend %s failed mid-stream: %s", name, fault)
                    metrics.FAILOVERS.labels(name).inc()
                    tried.append(name)
                    partial = fault.tape.partial()
                    if continuing is not None:
                        partial = continuing.partial.then(partial)
                    if not (partial.continuable and continuable(original)):
                        yield stream_error_event(f"The backend {name} failed mid-response.")
                        return
                    budget = continuing.budget if continuing else fault.max_tokens
                    continuing = Continuing(partial, name, budget)
                    job = replace(job, request=continuation_request(original, partial, budget))

    def _chain(self, role: Role) -> tuple[str, ...]:
        """The role's chain, led by the backend it is placed on now."""
        chain = self._config.chain(role)
        placed = self._placement.get(role)
        if placed is None or (chain and chain[0] == placed):
            return chain
        return (placed, *(link for link in chain if link != placed))

    async def chat_once(self, job: ChatJob) -> list[Any]:
        """`chat` for a whole (non-streaming) answer, in one call: [Routed, response] or
        [Refusal]."""
        return [item async for item in self.chat(job)]

    async def _serve_on(
        self, link: Link, job: ChatJob, fit: Fit, failovers: int, continuing: Continuing | None
    ) -> AsyncIterator[Any]:
        """Run the job on one backend, holding its slot; raise BackendFault before any output,
        MidStreamFault when a stream fails after it (`continuing`: this link goes on with an
        answer another began, so its chunks are rewritten to that answer's)."""
        name = link.target.name
        streaming = bool(job.request.stream)
        tape = StreamTape(continuing.partial.prompt_tokens if continuing else fit.prompt_tokens)
        rewriter = Rewriter(continuing.partial) if continuing else None
        settings = self._config.router
        if not link.breaker.try_acquire():  # tripped while we waited for the slot
            link.gate.release()
            raise BackendFault("its breaker opened while the job waited")
        link.in_flight += 1
        metrics.IN_FLIGHT.labels(name).set(link.in_flight)
        request = job.request.model_copy(
            update={
                # Each engine answers to its own model id (a backend's is its role name).
                "model": link.target.model_id,
                "messages": fit.messages,
                "max_tokens": fit.max_tokens,
                "max_completion_tokens": fit.max_tokens,
            }
        )
        stream = None
        verdict: bool | None = None  # True: served; False: a backend fault; None: no verdict
        try:
            try:
                stream = link.stream.chat.remote(request)
                first = await asyncio.wait_for(anext(stream), settings.first_token_timeout_s)
            except StopAsyncIteration:
                verdict = False
                raise BackendFault("the response was empty") from None
            except RequestCancelledError:
                raise
            except BACKEND_FAULTS as fault:
                verdict = False
                self._note_dead_replica(link, fault)
                raise BackendFault(_describe(fault)) from None
            error = engine_error(first)
            if error is not None and is_server_error(error):
                verdict = False
                self._note_oom(link, error)
                raise BackendFault(f"engine error {error.error.code}: {error.error.message}")
            if continuing is None:
                yield Routed(
                    backend=name,
                    max_tokens=fit.max_tokens,
                    prompt_tokens=fit.prompt_tokens,
                    context_fitted=fit.fitted,
                    dropped_messages=fit.dropped_messages,
                    system_compressed=fit.system_compressed,
                    output_clamped=fit.output_clamped,
                    failovers=failovers,
                )
            elif error is not None:
                # A link that will not continue the answer (its window, its template) has
                # done nothing wrong and the client already has half an answer: try the next.
                raise BackendFault(f"it would not continue the answer: {error.error.message}")
            elif isinstance(first, list) and rewriter is not None:
                metrics.STREAM_MIGRATIONS.labels(continuing.source, name).inc()
                first = [migration_note(continuing.source, name), *rewriter.lines(first)]
            if streaming:
                tape.record(first)
            yield first
            if error is not None:  # a client error (4xx): the ingress answers it, no verdict
                return
            while True:
                try:
                    item = await asyncio.wait_for(anext(stream), settings.stream_idle_timeout_s)
                except StopAsyncIteration:
                    verdict = verdict is not False  # an engine error on the way is a fault
                    break
                except RequestCancelledError:
                    raise
                except BACKEND_FAULTS as fault:
                    verdict = False
                    self._note_dead_replica(link, fault)
                    if streaming:
                        raise MidStreamFault(tape, fit.max_tokens, _describe(fault)) from None
                    yield stream_error_event(f"The backend {name} failed mid-response.")
                    break
                head, late = split_at_server_error(item)
                if late is not None:
                    verdict = False
                    if isinstance(late, ErrorResponse):
                        self._note_oom(link, late)
                    if streaming:  # what came before the error is the client's; then go on
                        if head:
                            head = rewriter.lines(head) if rewriter is not None else head
                            tape.record(head)
                            yield head
                        raise MidStreamFault(tape, fit.max_tokens, _error_text(late))
                if rewriter is not None:
                    item = rewriter.lines(item)
                if streaming:
                    tape.record(item)
                yield item
        finally:
            if stream is not None:
                stream.cancel()  # a no-op after the end; aborts the engine request otherwise
            link.in_flight -= 1
            metrics.IN_FLIGHT.labels(name).set(link.in_flight)
            link.gate.release()
            self._record(link, verdict)

    # -- decisions' inputs ---------------------------------------------------------------------

    async def _fit(self, job: ChatJob, target: Target) -> Fit:
        """Fit the job to the window of the link that will serve it (windows differ)."""
        request = job.request
        window = target.context_window
        fit_args = {
            "window": max(1, int(window * job.context_share)),
            "requested_max_tokens": (
                request.max_completion_tokens
                if request.max_completion_tokens is not None
                else request.max_tokens
            ),
            "counter": self._counters[target.tokenizer],
        }
        messages = [dict(m) for m in request.messages]
        quick = pass_through(messages, **fit_args)
        if quick is not None:  # most requests: proven to fit without tokenizing
            return quick
        work = functools.partial(fit_messages, messages, **fit_args)
        return await asyncio.get_running_loop().run_in_executor(self._fitter, work)

    def _unavailable(self, role: Role, tried: list[str]) -> Refusal:
        if tried:
            message = f"Every backend for {role.value!r} failed ({', '.join(tried)})."
        else:
            message = f"No backend for {role.value!r} is available now."
        retry = max(1, round(self._config.router.breaker_cooldown_s))
        return Refusal(503, "backend_unavailable", message, retry)

    def _record(self, link: Link, verdict: bool | None) -> None:
        if verdict is True:
            link.breaker.record_success()
        elif verdict is False:
            metrics.BACKEND_FAULTS.labels(link.target.name).inc()
            link.breaker.record_failure()
        else:
            link.breaker.record_abandoned()
        self._count_transitions(link)

    def _note_dead_replica(self, link: Link, error: BaseException) -> None:
        """A backend whose only replica died takes no work until Serve has replaced it: without
        this, requests would wait on Serve's handle for a replica that is not there yet."""
        if isinstance(error, REPLICA_GONE) and link.target.replicas == 1:
            link.running = False
            link.awaiting_recovery = True
            link.breaker.trip("its only replica died")

    def _note_oom(self, link: Link, error: ErrorResponse) -> None:
        """A replica out of memory refuses all work until Serve replaces it (llm_server.py);
        one that only lacked KV room now recovers by itself. Either way, stop sending there:
        the breaker opens at once, and a passed health probe closes it."""
        if error.error.type != OOM_CODE:
            return
        metrics.BACKEND_OOM.labels(link.target.name).inc()
        link.breaker.trip(f"out of memory: {error.error.message}")

    def _count_transitions(self, link: Link) -> None:
        for transition in link.breaker.transitions[link.seen_transitions :]:
            _log_transition(link.target.name, transition)
            metrics.BREAKER_TRANSITIONS.labels(link.target.name, transition.target.value).inc()
        link.seen_transitions = len(link.breaker.transitions)

    # -- background loops ----------------------------------------------------------------------

    def _start_loops(self) -> None:
        if self._watch and not self._loops:
            self._loops = [
                asyncio.create_task(self._health_loop()),
                asyncio.create_task(self._kv_loop()),
            ]
            if self._placer is not None:
                self._loops.append(asyncio.create_task(self._placement_loop()))

    async def _health_loop(self) -> None:
        settings = self._config.router
        while True:
            try:
                await self.check_health_once()
            except Exception:  # the loop must outlive any one failed check
                logger.exception("router health check failed")
            troubled = any(link.troubled for link in self._links.values())
            await asyncio.sleep(
                settings.health_interval_s if troubled else settings.health_idle_interval_s
            )

    async def check_health_once(self) -> None:
        """Mark links without a running replica; probe tripped ones and close them if healthy."""
        deployments = await self._deployments()
        await asyncio.gather(
            *(
                self._check_link(link, deployments.get(link.deployment))
                for link in self._links.values()
            )
        )

    async def _check_link(self, link: Link, info: Any) -> None:
        if not (info and info.replica_states.get("RUNNING", 0)):
            link.running = False
            link.breaker.trip("no running replica")
        elif link.awaiting_recovery or link.breaker.state is not BreakerState.CLOSED:
            if await self._probe(link):
                # Readings from before the trouble say nothing now (a replaced replica starts
                # empty; a down one left only stale readings, which would count as pressure).
                link.kv.forget()
                link.gate.resume()
                link.awaiting_recovery = False
                link.running = True
                link.breaker.reset("health check passed")
            else:
                # Serve may still count a dead replica as RUNNING: trust only a passed probe.
                link.running = not link.awaiting_recovery
        else:
            link.running = True
        self._count_transitions(link)

    async def _probe(self, link: Link) -> bool:
        try:
            await asyncio.wait_for(link.unary.check_health.remote(), HEALTH_PROBE_TIMEOUT_S)
        except Exception as error:  # any failure: still unhealthy
            logger.info("health probe of %s failed: %s", link.target.name, _describe(error))
            return False
        return True

    async def _kv_loop(self) -> None:
        interval = self._config.router.kv_poll_interval_s
        while True:
            try:
                await asyncio.gather(*(self._read_kv(link) for link in self._links.values()))
            except Exception:  # the loop must outlive any one bad reading
                logger.exception("router KV-cache reading failed")
            await asyncio.sleep(interval)

    async def _read_kv(self, link: Link) -> None:
        if not (link.kv_observable and link.running):
            return
        try:
            usage = await asyncio.wait_for(
                link.unary.kv_cache_usage.remote(), self._config.router.kv_stale_after_s
            )
        except Exception as error:  # unanswered readings go stale, which counts as pressure
            if _method_missing(error):  # a plain LLMServer or a test double: stop asking
                link.kv_observable = False
                return
            logger.info("KV reading of %s failed: %s", link.target.name, _describe(error))
            return
        if usage is None:
            link.kv_observable = False
            return
        now = self._clock()
        link.kv.observe(float(usage), now)
        metrics.KV_CACHE_USAGE.labels(link.target.name).set(float(usage))
        if link.kv.pressured(now):
            link.gate.pause()
        else:
            link.gate.resume()

    async def _deployments(self) -> dict[DeploymentKey, Any]:
        """Serve's status of every deployment, by (application, deployment)."""
        # serve.status() blocks on the controller: keep it off the routing event loop.
        overview = await asyncio.to_thread(serve.status)
        return {
            (app_name, name): info
            for app_name, app in overview.applications.items()
            for name, info in app.deployments.items()
        }

    # -- placement (pulled from the placement actor) -------------------------------------------

    async def _first_sync(self) -> None:
        """Route on the placement actor's view, not the config's home pools, from the start."""
        if self._placer is None or self._synced.is_set():
            return
        try:
            await asyncio.wait_for(self._synced.wait(), FIRST_SYNC_WAIT_S)
        except TimeoutError:
            logger.warning("no placement view in %.0f s: routing to home pools", FIRST_SYNC_WAIT_S)
            self._synced.set()

    async def _placement_loop(self) -> None:
        while True:
            try:
                reply = await asyncio.wait_for(
                    self._placer.sync.remote(self._replica, self._view_version, self.held()),
                    HEALTH_PROBE_TIMEOUT_S,
                )
                if reply["config"] is None:
                    # Restarted by Ray with the config it was first made with, maybe older than
                    # ours: start it with ours, and keep routing on the last view meanwhile.
                    await self._placer.start.remote(self._config)
                else:
                    self.apply_placement(PlacementView.from_json(reply))
            except Exception as error:  # the actor restarting: keep routing on the last view
                logger.info("placement sync failed: %s", _describe(error))
            await asyncio.sleep(SYNC_INTERVAL_S)

    def held(self) -> dict[str, int]:
        """Jobs this replica holds per backend: being fitted, queued for a slot or in flight."""
        return {name: link.claims for name, link in self._links.items()}

    def apply_placement(self, view: PlacementView) -> None:
        """Send each role's new work where `view` places it; parked backends take none."""
        for role, backend in view.placements.items():
            if backend in self._links and self._placement.get(Role(role)) != backend:
                self._prefer(Role(role), self._links[backend])
        for link in self._links.values():
            if link.target.role is not None:
                link.parked = link.target.name in view.parked
        for move in view.moves:
            if move["seq"] <= self._moves_counted:
                continue
            if self._view_version:  # on the first view, moves made before this replica are not new
                metrics.PLACEMENT_MOVES.labels(move["role"], move["kind"], move["outcome"]).inc()
            self._moves_counted = move["seq"]
        self._moves = list(view.moves)
        self._view_version = view.version
        self._synced.set()

    def _prefer(self, role: Role, link: Link) -> None:
        """The placement actor saw `link`'s replicas RUNNING and healthy before it published
        the move, so the link is up now, without waiting for a probe."""
        link.running = True
        link.awaiting_recovery = False
        link.kv.forget()
        link.gate.resume()
        if link.breaker.state is not BreakerState.CLOSED:
            link.breaker.reset("placed here: running and healthy")
            self._count_transitions(link)
        previous = self._links.get(self._placement.get(role, ""))
        if previous is not None:
            metrics.MODEL_POOL.labels(role.value, previous.target.pool).set(0)
        metrics.MODEL_POOL.labels(role.value, link.target.pool).set(1)
        self._placement[role] = link.target.name
        logger.info("placement: %s now served by %s", role.value, link.target.name)

    # -- status --------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """Per-backend state from Serve's own status, with breaker, queue and KV pressure."""
        self._start_loops()
        deployments = await self._deployments()
        now = self._clock()
        backends = {}
        homes = {t.name for t in self._config.home_targets}
        for target in self._config.targets.values():
            link = self._links.get(target.name)
            if link is None and (target.role is None or target.name not in homes):
                continue  # not part of this app (benchmarks over bare replicas)
            info = deployments.get(link.deployment) if link else None
            backends[target.name] = _backend_status(target, info, link, now)
        states = [b["state"] for b in backends.values() if b["state"] != "parked"]
        placements = {name: self._links[name].target.pool for name in self._placement.values()}
        return {
            "status": overall_status(states),
            "backends": backends,
            "placements": placements,
            "moves": list(self._moves),
        }

    async def metrics_text(self) -> bytes:
        for name, link in self._links.items():
            for priority, depth in link.gate.queue.depth_by_class().items():
                metrics.QUEUE_DEPTH.labels(name, priority.value).set(depth)
        return metrics.render()


def _method_missing(error: BaseException) -> bool:
    """The backend has no such method: Serve says so in a RayServeException's text."""
    return isinstance(error, AttributeError) or (
        isinstance(error, RayServeException) and "that does not exist" in str(error)
    )


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _log_transition(backend: str, transition: Transition) -> None:
    logger.warning(
        "breaker %s: %s -> %s (%s)",
        backend,
        transition.source.value,
        transition.target.value,
        transition.reason,
    )


def _backend_status(target: Target, info: Any, link: Link | None, now: float) -> dict[str, Any]:
    running = info.replica_states.get("RUNNING", 0) if info else 0
    status = str(info.status.value) if info else "NOT_DEPLOYED"
    state = backend_state(status, running)
    report: dict[str, Any] = {
        "role": target.role.value if target.role else None,  # None: the fallback, any role
        "pool": target.pool,
        "state": state,
        "deployment_status": status,
        "running_replicas": running,
    }
    if link is not None:
        breaker = link.breaker.state
        if link.parked:  # at zero replicas on purpose, or on its way there
            report["state"] = "draining" if running else "parked"
        elif state == "up" and breaker is not BreakerState.CLOSED:
            report["state"] = "degraded"
        queue = link.gate.queue
        report.update(
            breaker=breaker.value,
            in_flight=link.in_flight,
            cap=queue.cap,
            queue_depth=queue.depth,
            queue_by_priority={p.value: n for p, n in queue.depth_by_class().items()},
            kv_cache_usage=link.kv.usage,
            kv_cache_pressure=link.kv.pressured(now),
        )
    return report


def backend_state(deployment_status: str, running_replicas: int) -> str:
    """up: healthy and serving; degraded: serving with trouble; starting; down."""
    if running_replicas and deployment_status == "HEALTHY":
        return "up"
    if running_replicas:
        return "degraded"
    return "starting" if deployment_status in {"UPDATING", "UPSCALING"} else "down"


def overall_status(states: list[str]) -> str:
    """ok when every backend is up, down when none serves, degraded in between."""
    if states and all(s == "up" for s in states):
        return "ok"
    return "degraded" if any(s in {"up", "degraded"} for s in states) else "down"
