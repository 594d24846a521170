"""One attempt of a job on one link, holding its slot: send, relay, judge.

A fault before any output raises BackendFault (the job may move down its chain); a stream that
fails after it raises MidStreamFault (the answer may go on elsewhere), and one paused for a
higher class (`router.preempt`, policy/preemption.py) raises Paused, to go on as the same answer
once it gets a slot again. The verdict (served, a backend fault, or none) goes to the link's
breaker when the attempt ends, however it ends.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from ray.serve.exceptions import RequestCancelledError

from core.answers import EngineError
from core.clock import Now
from core.config import RouterConfig
from core.requests import CompletionRequest, EmbeddingRequest, PromptCount, Request
from core.types import PriorityClass
from core.wire import ChatJob, Routed
from deployments.router import metrics
from deployments.router.adapters.ports import ChatStream
from deployments.router.request_path.faults import (
    BACKEND_FAULTS,
    BackendFault,
    Continuing,
    LinkGone,
    MidStreamFault,
    Paused,
    ReplicaRaised,
    describe,
    engine_error,
    error_text,
    from_backend,
    is_server_error,
    split_at_server_error,
    stream_error_event,
)
from deployments.router.request_path.link import REPLICA_GRACE_S, REPLICA_POLL_S, Link
from policy.context.embed_fit import EmbedFit
from policy.context.fit import Fit
from policy.context.prompt_fit import PromptFit
from policy.preemption import RunningView, still_pausing
from policy.stream_migration import (
    Rewriter,
    StreamTape,
    continuable,
    migration_note,
    pause_note,
    pauses_note,
    resume_note,
)

AnyFit = Fit | PromptFit | EmbedFit


@dataclass(frozen=True)
class Seat:
    """The slot a job holds on a link: its ticket, and the job's pauses so far."""

    ticket: int
    pauses: int = 0


@dataclass
class EngineWait:
    """What a job's attempts waited for their engines' first items, a failed attempt's (its
    timeout, a dead replica's error) included: the gateway's overhead leaves it all out."""

    seconds: float = 0.0


@dataclass
class Attempt:
    """One job on one link as it goes (`continuing`: this link goes on with an answer another
    began, so its chunks are rewritten to that answer's)."""

    link: Link
    fit: AnyFit
    streaming: bool
    continuing: Continuing | None
    seat: Seat = Seat(-1)
    priority: PriorityClass = PriorityClass.USER
    started: float = 0.0
    pausable: bool = False  # a streamed chat whose answer can go on as text
    pause_asked: bool = False  # by a higher class's arrival: pause at the next item
    tape: StreamTape = field(init=False)
    rewriter: Rewriter | None = field(init=False)
    verdict: bool | None = None  # True: served; False: a backend fault; None: no verdict
    # Cancelled when the attempt ends, however it ends, while the engine may still be at work.
    stream: ChatStream | None = None
    waited: EngineWait = field(default_factory=EngineWait)  # the job's, this attempt's added

    def __post_init__(self) -> None:
        continuing = self.continuing
        self.tape = StreamTape(
            continuing.partial.prompt_tokens if continuing else self.fit.prompt_tokens
        )
        closing = pauses_note(continuing.pauses) if continuing and continuing.pauses else None
        self.rewriter = Rewriter(continuing.partial, closing) if continuing else None

    def view(self) -> RunningView:
        """As preemption sees it; a content line is about one token (vLLM's streams, ours)."""
        left = self.fit.max_tokens - len(self.tape.lines) if self.streaming else None
        return RunningView(
            self.seat.ticket, self.priority, self.started, self.seat.pauses, left, self.pausable,
        )  # fmt: skip

    def pause(self) -> None:
        self.pause_asked = True

    def passed_on(self, item: Any) -> Any:
        """An item as the client gets it (rewritten when continuing), kept on the tape."""
        if self.rewriter is not None:
            item = self.rewriter.lines(item)
        if self.streaming:
            self.tape.record(item)
        return item


@dataclass(frozen=True)
class Step:
    """What one read of the stream gives the client, and whether the attempt ends there."""

    items: list[Any]
    ended: bool = False
    fault: MidStreamFault | None = None  # raised once `items` are out


END = Step([], ended=True)


class Serving:
    def __init__(self, settings: RouterConfig, now: Now) -> None:
        self._settings = settings
        self._now = now

    async def serve_on(
        self,
        link: Link,
        job: ChatJob,
        fit: AnyFit,
        seat: Seat,
        failovers: int,
        continuing: Continuing | None,
        waited: EngineWait,
    ) -> AsyncGenerator[Any, None]:
        """Run the job on `link`, whose slot (`seat`) it holds; raise BackendFault before any
        output, MidStreamFault when a stream fails after it, Paused when a higher class's
        arrival paused it. The wait for the engine's first item is added to `waited`, the
        job's over its attempts."""
        await _ready_to_send(link, seat)
        request = job.request
        streaming = not isinstance(request, EmbeddingRequest) and bool(request.stream)
        attempt = Attempt(
            link, fit, streaming, continuing, seat, job.priority, self._now(), waited=waited
        )
        attempt.pausable = streaming and continuable(job.request)
        _enter(link, attempt)
        try:
            link.pause_for(job.priority)
            sent = engine_request(link, job, fit, self._settings.engine_priority_of(job.priority))
            stream, first = await self._first_item(attempt, sent)
            for item in _opening(attempt, first, failovers):
                yield item
            if engine_error(first) is not None:  # a client error (4xx): the ingress answers it
                return
            while True:
                step = await self._next_step(attempt, stream)
                for item in step.items:
                    yield item
                if step.fault is not None:
                    raise step.fault
                if step.ended:
                    return
                if attempt.pause_asked and self._pausing(attempt):
                    metrics.PREEMPTIONS.labels(link.target.name, job.priority.value).inc()
                    yield [pause_note(link.target.name, seat.pauses + 1)]
                    raise Paused(attempt.tape, fit.max_tokens, "paused for a higher class")
        finally:
            _leave(attempt)

    @staticmethod
    def _pausing(attempt: Attempt) -> bool:
        """Whether to stop here, to go on later as the same answer: only while the pause is
        still warranted (the higher class that asked may be gone, or preemption turned off),
        and not where what the client has cannot be continued as text (a tool call begun) or
        is already whole (its finish_reason sent): such a stream runs to its end."""
        attempt.pause_asked = False
        link = attempt.link
        rules, counts = link.gate.queue.preempt, link.gate.queue.running_everywhere()
        if rules is None or not still_pausing(attempt.view(), counts, rules, link.fresh_kv()):
            return False
        partial = attempt.tape.partial()
        attempt.pausable = partial.continuable and not partial.finished
        return attempt.pausable

    async def _first_item(self, attempt: Attempt, request: Request) -> tuple[ChatStream, Any]:
        link = attempt.link
        try:
            send = _method(link, request)
            stream = attempt.stream = send(request)
            asked = self._now()
            try:
                first = await _unless_gone(
                    link, from_backend(anext(stream)), self._settings.first_token_timeout_s
                )
            finally:  # a wait that ended in a fault was the engine's too
                attempt.waited.seconds += self._now() - asked
        except StopAsyncIteration:
            attempt.verdict = False
            raise BackendFault("the response was empty") from None
        except RequestCancelledError:
            raise
        except LinkGone as gone:
            # Already out of every choice by what was recorded (its pool down, its handle
            # empty); not charged to its breaker: a replica Serve drains in a redeploy leaves
            # the handle as a dead one does.
            raise BackendFault(describe(gone)) from None
        except BACKEND_FAULTS as fault:
            attempt.verdict = False
            link.note_fault(fault)
            raise BackendFault(describe(fault)) from None
        error = engine_error(first)
        if error is not None and is_server_error(error):
            attempt.verdict = False
            link.note_oom(error)
            raise BackendFault(error_text(error))
        if not attempt.streaming:
            # A whole answer (or its error) is the engine's last item: its request is over and
            # its stream ends by itself. A cancel would abort nothing and cost a round through
            # Ray for each whole answer whose end had not yet come in (the caller's worker, the
            # raylet's CancelLocalTask, the engine's replica): 0.6 of them at one client.
            attempt.stream = None
            if error is None:  # served: its breaker's success (chat_once reads no further)
                attempt.verdict = True
        return stream, first

    async def _next_step(self, attempt: Attempt, stream: ChatStream) -> Step:
        try:
            # A timer, not wait_for's task per item: a stream relays one item per batch of
            # tokens, and wait_for cost 13 us more a time (bench/pace.py, docs/benchmarks.md).
            async with asyncio.timeout(self._settings.stream_idle_timeout_s):
                item = await anext(stream)
        except StopAsyncIteration:
            attempt.verdict = attempt.verdict is not False  # an engine error on the way: a fault
            return END
        except RequestCancelledError:
            raise
        except BACKEND_FAULTS as fault:
            return _fault_mid_stream(attempt, fault)
        except Exception as raised:  # noqa: BLE001 - only the backend's item is awaited here
            return _fault_mid_stream(attempt, ReplicaRaised(describe(raised)))
        return _relay(attempt, item)


async def _ready_to_send(link: Link, seat: Seat) -> None:
    """Raise BackendFault, the slot given back, where the link cannot take the job now (and
    give it back if the job is cancelled meanwhile)."""
    try:
        replica = await _replica_to_send_to(link)
    except BaseException:
        link.gate.release(seat.ticket)
        raise
    if not replica:  # it died while the job waited for the slot
        link.gate.release(seat.ticket)
        raise BackendFault("it has no running replica (Serve is replacing it)")
    if not link.breaker.try_acquire():  # tripped while we waited for the slot
        link.gate.release(seat.ticket)
        raise BackendFault("its breaker opened while the job waited")


async def _replica_to_send_to(link: Link) -> bool:
    """Whether Serve's handle has a replica for the job, waiting `REPLICA_GRACE_S` for one.
    Without one the job would wait in the handle for a replica to start (minutes, for an
    engine)."""
    for _ in range(round(REPLICA_GRACE_S / REPLICA_POLL_S)):
        if not link.has_no_replica():
            return True
        await asyncio.sleep(REPLICA_POLL_S)
    return not link.has_no_replica()


async def _unless_gone(link: Link, item: Awaitable[Any], timeout_s: float) -> Any:
    """The first item, unless the link is gone first (LinkGone: its pool declared down, or no
    replica left to answer) or it takes longer than `timeout_s` (TimeoutError). A whole answer
    is one item: this is the wait a job sent to a dead machine or a dead replica (which Serve
    retries into an empty handle) would otherwise sit out."""
    link.watch_replicas()  # a set event from the last round may be stale by now
    lost = link.gone()
    if lost.is_set():
        if inspect.iscoroutine(item):
            item.close()  # never scheduled: closed, or Python warns it was never awaited
        raise LinkGone(link.gone_reason() or "it is gone")
    answer = asyncio.ensure_future(item)
    gone = asyncio.ensure_future(lost.wait())
    try:
        done, _ = await asyncio.wait(
            (answer, gone), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:  # the client went away: stop reading too
        _abandon(answer)
        raise
    finally:
        gone.cancel()
    if answer in done:
        return answer.result()
    _abandon(answer)
    if gone in done:
        raise LinkGone(f"{link.gone_reason() or 'it is gone'} while the job waited")
    raise TimeoutError(f"no first item in {timeout_s:.0f} s")


def _abandon(answer: asyncio.Future[Any]) -> None:
    """Stop waiting for a first item nobody will read. Ray's handle answers the cancel with
    RequestCancelledError, which asyncio would log with its traceback as never retrieved."""
    answer.add_done_callback(lambda task: task.cancelled() or task.exception())
    answer.cancel()


def _method(link: Link, request: Request) -> Any:
    """The backend's method for the kind of request: chat, completions or embeddings."""
    if isinstance(request, EmbeddingRequest):
        return link.backend.embeddings
    if isinstance(request, CompletionRequest):
        return link.backend.completions
    return link.backend.chat


def engine_request(link: Link, job: ChatJob, fit: AnyFit, priority: int) -> Request:
    """The request as `link`'s engine gets it: its model name (an adapter's own where the
    link's engine serves that adapter), the fitted prompt and output, and the engine priority
    of its class (never the client's own `priority` field)."""
    request = job.request
    model = job.model if job.model in link.target.adapters else link.target.model_id
    count = PromptCount(fit.prompt_tokens, exact=fit.counted)
    if isinstance(request, EmbeddingRequest):  # the inputs as sent: the engine truncates
        assert isinstance(fit, EmbedFit)
        return request.changed(
            counted=PromptCount(fit.largest, exact=fit.counted),  # each input is a sequence
            model=model,
            priority=priority,
            truncate_prompt_tokens=fit.truncate_to,
        )
    if isinstance(request, CompletionRequest):  # the prompt fitted, a suffix written into it
        assert isinstance(fit, PromptFit)
        return request.changed(
            counted=count,
            model=model,
            priority=priority,
            prompt=fit.prompt,
            suffix=None,
            max_tokens=fit.max_tokens,
        )
    assert isinstance(fit, Fit)
    # Tools the fit shortened (their descriptions: policy.context.tool_fit) replace the sent.
    tools = {} if fit.tools is None else {"tools": fit.tools}
    return request.changed(
        counted=count,
        # Each engine answers to its own model id (a backend's is its model's name).
        model=model,
        priority=priority,
        messages=fit.messages,
        max_tokens=fit.max_tokens,
        max_completion_tokens=fit.max_tokens,
        **tools,
    )


def _opening(attempt: Attempt, first: Any, failovers: int) -> list[Any]:
    """What the client gets first: who serves (unless it is a continuation), then the item."""
    link, fit, continuing = attempt.link, attempt.fit, attempt.continuing
    error = engine_error(first)
    opening: list[Any] = []
    if continuing is None:
        opening.append(_routed(link, fit, failovers, attempt.waited.seconds))
    elif error is not None:
        # A link that will not continue the answer (its window, its template) has done
        # nothing wrong and the client already has half an answer: try the next.
        raise BackendFault(f"it would not continue the answer: {error.message}")
    elif isinstance(first, list) and attempt.rewriter is not None:
        if continuing.paused:  # a paused answer going on: its prompt read again
            metrics.PREEMPT_REPREFILL_TOKENS.labels(link.target.name).inc(fit.prompt_tokens)
            note = resume_note(link.target.name, continuing.pauses)
        else:
            metrics.STREAM_MIGRATIONS.labels(continuing.source, link.target.name).inc()
            note = migration_note(continuing.source, link.target.name)
        first = [note, *attempt.rewriter.lines(first)]
    if attempt.streaming:
        attempt.tape.record(first)
    opening.append(first)
    return opening


def _routed(link: Link, fit: AnyFit, failovers: int, engine_wait_s: float) -> Routed:
    return Routed(
        backend=link.target.name,
        max_tokens=fit.max_tokens,
        prompt_tokens=fit.prompt_tokens,
        context_fitted=fit.fitted,
        dropped_messages=fit.dropped_messages,
        system_compressed=fit.system_compressed,
        output_clamped=fit.output_clamped,
        failovers=failovers,
        engine_wait_s=engine_wait_s,
        tools_shortened=fit.tools_shortened if isinstance(fit, Fit) else 0,
        dropped_images=fit.dropped_images if isinstance(fit, Fit) else 0,
        prompt_counted=fit.counted,
    )


def _fault_mid_stream(attempt: Attempt, fault: BaseException) -> Step:
    attempt.verdict = False
    attempt.link.note_fault(fault)
    if attempt.streaming:
        raise MidStreamFault(attempt.tape, attempt.fit.max_tokens, describe(fault)) from None
    message = f"The backend {attempt.link.target.name} failed mid-response."
    return Step([stream_error_event(message)], ended=True)


def _relay(attempt: Attempt, item: Any) -> Step:
    head, late = split_at_server_error(item)
    if late is not None:
        attempt.verdict = False
        if isinstance(late, EngineError):
            attempt.link.note_oom(late)
        if attempt.streaming:  # what came before the error is the client's; then go on
            fault = MidStreamFault(attempt.tape, attempt.fit.max_tokens, error_text(late))
            return Step([attempt.passed_on(head)] if head else [], fault=fault)
    return Step([attempt.passed_on(item)])


def _enter(link: Link, attempt: Attempt) -> None:
    link.in_flight += 1
    link.running[attempt.seat.ticket] = attempt
    metrics.IN_FLIGHT.labels(link.target.name).set(link.in_flight)


def _leave(attempt: Attempt) -> None:
    if attempt.stream is not None:
        attempt.stream.cancel()  # a no-op after the end; aborts the engine request otherwise
    link = attempt.link
    link.in_flight -= 1
    link.running.pop(attempt.seat.ticket, None)
    metrics.IN_FLIGHT.labels(link.target.name).set(link.in_flight)
    link.gate.release(attempt.seat.ticket)
    link.record_verdict(attempt.verdict)
