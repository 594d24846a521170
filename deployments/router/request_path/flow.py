"""A job's walk down its model's failover chain.

At each step the first link that is running, whose breaker lets work through and whose KV cache
is not under pressure (`policy.link_choice`) takes the job: it is fitted to that link's window,
waits for a slot in its priority queue (`policy.gate`) and is sent (`serving.py`). A fault before
the first token moves the job to the next link, fitted again; a stream that fails after it goes
on on the next link as the same answer, where the request allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from core.clock import Clock
from core.config import ClusterConfig
from core.errors import ApiError, ErrorCode
from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, Request
from core.topology import Target
from core.types import PriorityClass
from core.wire import ChatJob, Refusal
from deployments.router import metrics
from deployments.router.loops.placement_sync import PlacementSync
from deployments.router.request_path.faults import (
    BackendFault,
    Continuing,
    MidStreamFault,
    Paused,
    stream_error_event,
)
from deployments.router.request_path.image_costs import ImageCosts
from deployments.router.request_path.link import Link
from deployments.router.request_path.serving import AnyFit, EngineWait, Seat, Serving
from policy.context.continuation_fit import fit_continuation
from policy.context.embed_fit import EmbedFit, fit_inputs
from policy.context.fit import ContextOverflow, Fit, fit_messages, pass_through
from policy.context.images import ImageCounter, ImagesNotCounted, fit_with_images
from policy.context.prompt_fit import NoFim, PromptFit, fit_prompt
from policy.context.tokens import TokenCounter, message_text
from policy.gate import Shed
from policy.link_choice import choose_link
from policy.model_access import by_pattern
from policy.request.completion import single_prompt
from policy.request.embedding import embedding_inputs
from policy.request.messages import carries_images
from policy.request.rendered import rendered_tools
from policy.request.tools import calls_tools
from policy.stream_migration import (
    continuable,
    continuation_request,
    waiting_note,
)

logger = logging.getLogger("ray.serve")

Admitted = tuple[AnyFit, Seat]  # fitted to a link, holding a slot there


@dataclass
class _Seating:
    """Where a job's admission to a link lands (a fit and a slot, or why not)."""

    result: Admitted | Refusal | None = None


class Flow:
    def __init__(
        self,
        config: ClusterConfig,
        links: Mapping[str, Link],
        placement: PlacementSync,
        counters: Mapping[str, TokenCounter],
        clock: Clock,
    ) -> None:
        self._config = config
        self._models = _model_names(config)
        self._links = links
        self._placement = placement
        self._counters = counters
        self._clock = clock
        self._serving = Serving(config.router, clock.monotonic)
        # Fitting a long conversation tokenizes for up to half a second: one worker thread keeps
        # that off the event loop that relays every stream (and fits one at a time, in order).
        self._fitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fit")
        self._image_costs = ImageCosts(self._fitter, clock)

    def use_config(self, config: ClusterConfig) -> None:
        """A reload's config for jobs from now on (a job under way keeps its chain)."""
        self._config = config
        self._models = _model_names(config)
        self._serving = Serving(config.router, self._clock.monotonic)
        self._image_costs.forget()

    async def walk(self, job: ChatJob) -> AsyncGenerator[Any, None]:
        """[Routed, items...] or [Refusal]; a refusal may follow items once an answer began."""
        job = self._served_now(job)
        chain = self._chain_for(job)
        tried: list[str] = []
        original = job.request
        arrived = self._clock.monotonic()
        continuing: Continuing | None = None  # an answer a link began, failed or paused
        refused: dict[str, Refusal] = {}  # links that passed the job on, and why
        passed: set[str] = set()  # links asleep this job went past (counted once each)
        waited = EngineWait()  # for first items, over the links tried: not the gateway's time
        while True:
            name = self._choose(chain, tried, passed)
            if name is None:
                yield replace(
                    self._nowhere(job.model, tried, refused), engine_wait_s=waited.seconds
                )
                return
            link = self._links[name]
            with link.claimed():
                seating = _Seating()
                seated = self._seated(link, job, continuing, arrived, seating)
                async with contextlib.aclosing(seated):
                    async for keepalive in seated:
                        yield keepalive  # a paused answer waiting for its slot again
                admitted = seating.result
                assert admitted is not None  # _seated sets it or raises
                if isinstance(admitted, Refusal):
                    if not _goes_on(admitted, tried, continues=continuing is not None):
                        yield replace(admitted, engine_wait_s=waited.seconds)
                        return
                    refused[name] = admitted
                    tried.append(name)
                    continue
                fit, seat = admitted
                try:
                    async for item in self._serving.serve_on(
                        link, job, fit, seat, len(tried), continuing, waited
                    ):
                        yield item
                    return
                except BackendFault as fault:
                    logger.warning("backend %s failed before answering: %s", name, fault)
                    _failed_over(name, tried)
                    continuing = _failed(continuing)
                except MidStreamFault as fault:  # Paused too: the same link may take it again
                    continuing = _going_on(fault, name, continuing, original, tried)
                    if continuing is None:
                        yield stream_error_event(f"The backend {name} failed mid-response.")
                        return
                    assert isinstance(original, ChatRequest)  # only a chat is continuable
                    request = continuation_request(original, continuing.partial, continuing.budget)
                    job = replace(job, request=request)

    async def _seated(
        self,
        link: Link,
        job: ChatJob,
        continuing: Continuing | None,
        arrived: float,
        seating: _Seating,
    ) -> AsyncGenerator[list[str], None]:
        """The admission, into `seating`; a paused answer waiting for its slot again is sent a
        keep-alive comment every `router.preempt.keepalive_s` meanwhile (a client that leaves
        gives up its place, or the slot just granted)."""
        admitting = self._admit(link, job, continuing, arrived)
        if continuing is None or not continuing.paused:
            seating.result = await admitting
            return
        task = asyncio.ensure_future(admitting)
        try:
            while not task.done():
                keepalive_s = self._config.router.preempt.keepalive_s
                done, _ = await asyncio.wait({task}, timeout=keepalive_s)
                if not done:
                    yield [waiting_note()]
            seating.result = task.result()
        finally:
            if seating.result is None:  # the client left: a slot granted meanwhile goes back
                task.add_done_callback(functools.partial(_give_back, link))
                task.cancel()

    async def count(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> int | None:
        """The tokens of the prompt `messages` and `tools` make as `model`'s own tokenizer and
        chat template render them (its first link's), before any fitting: what Anthropic's
        count_tokens answers. None where no link of it is deployed here."""
        names = [name for name in self._placement.chain(model) if name in self._links]
        if not names:
            return None
        link = self._links[names[0]]
        counter: TokenCounter = self._counters[link.target.counter_key]
        try:
            if carries_images(messages) and link.target.images:
                counter = await self._image_costs.counter(link, counter, messages)
            work = functools.partial(counter.count_prompt, messages, tools or None)
            return await asyncio.get_running_loop().run_in_executor(self._fitter, work)
        except Exception as error:  # noqa: BLE001 - a template's refusal of the client's messages
            message = f"The model's chat template cannot render these messages: {error}"
            raise ApiError(400, ErrorCode.INVALID_REQUEST, message) from None

    def _served_now(self, job: ChatJob) -> ChatJob:
        """The job for the config in use now. A reload may have removed its model after the
        ingress resolved the name the client sent (a model swapped for another in its role,
        while the request waited for its key's admission: a 500 in the reload suite of
        8507aca); that name is resolved again. Where it names nothing now, the job keeps its
        model, whose chain is empty: a 503 (its retry meets the ingress's new names)."""
        if job.model in self._models:
            return job
        asked = job.request.model
        served = self._config.served_names
        model = served.get(asked) or served.get(
            by_pattern(asked, self._config.gateway.model_patterns) or ""
        )
        if model is None:
            return job
        logger.info("%s: a reload removed model %s; %s is served by %s", job.caller, job.model,
                    asked, model)  # fmt: skip
        return replace(job, model=model)

    def _chain_for(self, job: ChatJob) -> tuple[str, ...]:
        """The model's chain, less the links that cannot take this job."""
        if job.model not in self._models:  # removed by a reload, and no name reaches another
            return ()
        links = self._links  # a chain's name with no link is not deployed here: never chosen
        chain = tuple(name for name in self._placement.chain(job.model) if name in links)
        embeds = isinstance(job.request, EmbeddingRequest)  # vectors: embedding backends only
        chain = tuple(name for name in chain if links[name].target.embeds == embeds)
        if calls_tools(job.request):  # a link that cannot take them: no failover
            chain = tuple(name for name in chain if links[name].target.tools)
        if isinstance(job.request, ChatRequest) and carries_images(job.request.messages):
            # Never to a link that would drop the images or refuse them as the client's fault.
            chain = tuple(name for name in chain if links[name].target.images)
        return chain

    def _choose(self, chain: tuple[str, ...], tried: list[str], passed: set[str]) -> str | None:
        # A job's chain is taken as it starts: a reload may have removed a link of it since.
        chain = tuple(name for name in chain if name in self._links)
        statuses = {name: link.status() for name, link in self._links.items()}
        views = {name: status.view() for name, status in statuses.items()}
        chosen = choose_link(chain, views, tried)
        # Links asleep that the job went past (when_asleep: next_link) still hear of it, once.
        for name in chain[: chain.index(chosen) if chosen in chain else len(chain)]:
            if statuses[name].asleep and not statuses[name].parked and name not in passed:
                passed.add(name)
                self._links[name].passed_asleep += 1
        return chosen

    async def _admit(
        self, link: Link, job: ChatJob, continuing: Continuing | None, arrived: float
    ) -> Admitted | Refusal:
        """The job fitted to `link` and holding one of its slots, or why not. `continuing`:
        the job goes on with an answer begun (its last message); a paused one waits at the
        head of its class (its first arrival, `arrived`)."""
        fitted = await self._fit_or_refusal(job, link, continuing is not None)
        if isinstance(fitted, Refusal):
            return fitted
        pauses = continuing.pauses if continuing is not None else 0
        paused = continuing is not None and continuing.paused
        ticket = await self._slot(link, job, arrived if paused else None)
        return ticket if isinstance(ticket, Refusal) else (fitted, Seat(ticket, pauses))

    async def _fit_or_refusal(
        self, job: ChatJob, link: Link, continues: bool
    ) -> Fit | PromptFit | EmbedFit | Refusal:
        target = link.target
        try:
            request = job.request
            if isinstance(request, EmbeddingRequest):
                return await self._fit_inputs(request, target)
            if isinstance(request, CompletionRequest):
                return await self._fit_prompt(request, job.context_share, target)
            fit = await self._fit(request, job.context_share, link, continues)
            if fit.fitted and not job.truncate and not continues:
                return _untruncated(target.context_window)
            return fit
        except ContextOverflow as overflow:
            return Refusal(400, ErrorCode.CONTEXT_LENGTH_EXCEEDED, str(overflow))
        except ImagesNotCounted:
            message = (
                f"The backend {target.name} could not count this request's images, and they do "
                "not fit its window by an estimate; retry later."
            )
            retry = max(1, round(self._config.router.breaker_cooldown_s))
            return Refusal(503, ErrorCode.BACKEND_UNAVAILABLE, message, retry)
        except NoFim as no_fim:
            message = f"No backend of this model's chain can fill in the middle: {no_fim}."
            return Refusal(400, ErrorCode.FIM_NOT_SUPPORTED, message)
        except Exception as error:  # noqa: BLE001 - a chat template may raise anything on messages it rejects
            embeds = isinstance(job.request, EmbeddingRequest)
            what = "inputs cannot be read" if embeds else "messages cannot be rendered"
            return Refusal(400, ErrorCode.INVALID_REQUEST, f"The {what}: {error}")

    async def _slot(self, link: Link, job: ChatJob, since: float | None) -> int | Refusal:
        """Wait for a slot on `link` (its ticket); a refusal when admission sheds the job."""
        waited_from = self._clock.monotonic()
        # Asleep: the wait is for a replica to start, with the model's own timeout.
        asleep = link.status().asleep
        timeout_s = link.target.wake_timeout_s if asleep else None
        if since is not None and not asleep:  # paused: long enough to age past every class
            router = self._config.router
            timeout_s = router.queue_timeout_s + (len(PriorityClass) - 1) * router.aging_s
        try:
            ticket = await link.gate.acquire(job.priority, timeout_s, since)
        except Shed as shed:
            metrics.SHED.labels(job.priority.value, shed.reason).inc()
            name = link.target.name
            if asleep and link.status().asleep and shed.reason.startswith("timed out"):
                message = f"The backend {name} did not wake within {timeout_s:.0f}s; retry later."
                retry = max(1, round(self._config.router.breaker_cooldown_s))
                return Refusal(503, ErrorCode.BACKEND_UNAVAILABLE, message, retry)
            message = f"The backend {name} is overloaded ({shed.reason}); retry later."
            return Refusal(429, ErrorCode.OVERLOADED, message, shed.retry_after_s)
        finally:
            metrics.QUEUE_WAIT_SECONDS.labels(job.priority.value).observe(
                self._clock.monotonic() - waited_from
            )
        metrics.SEATS.labels(link.target.name, job.priority.value).inc()
        return ticket

    async def _fit(self, request: ChatRequest, share: float, link: Link, continues: bool) -> Fit:
        """Fit a chat to the window of the link that will serve it (windows differ; `share`:
        the part of it the depth router gave the job); a continuation's answer so far may be
        cut to its newest part, like old turns. Images count as the link's engine expands them
        (policy.context.images)."""
        target = link.target
        counter = self._counters[target.counter_key]
        fit_args: dict[str, Any] = {
            "window": max(1, int(target.context_window * share)),
            "requested_max_tokens": request.output_bound,
            "counter": counter,
        }
        messages = [dict(m) for m in request.messages]
        if request.tools:  # the template lists them in the prompt (measured once per tool set)
            fit_args["tools"] = rendered_tools(request.tools)  # as vLLM renders them
        if carries_images(messages):
            fit_args["counter"] = await self._image_costs.counter(link, counter, messages)
            if not continues:
                work = functools.partial(fit_with_images, messages, **fit_args)
                return await asyncio.get_running_loop().run_in_executor(self._fitter, work)
        elif not request.tools:
            quick = pass_through(messages, **fit_args)
            if quick is not None:  # most requests: proven to fit without tokenizing
                return quick
        if continues:
            *prompt, answer = messages
            if isinstance(fit_args["counter"], ImageCounter):
                fit_args["media"] = fit_args["counter"].images
            work = functools.partial(fit_continuation, prompt, message_text(answer), **fit_args)
        else:
            work = functools.partial(fit_messages, messages, **fit_args)
        return await asyncio.get_running_loop().run_in_executor(self._fitter, work)

    async def _fit_prompt(
        self, request: CompletionRequest, share: float, target: Target
    ) -> PromptFit:
        """A completion's prompt fitted to the window of the link that will serve it: its end
        (and a suffix) kept. Tokenizing happens off the event loop, as for chats."""
        work = functools.partial(
            fit_prompt,
            _prompt_of(request.prompt),
            window=max(1, int(target.context_window * share)),
            requested_max_tokens=request.max_tokens,
            counter=self._counters[target.counter_key],
            suffix=request.suffix,
        )
        return await asyncio.get_running_loop().run_in_executor(self._fitter, work)

    async def _fit_inputs(self, request: EmbeddingRequest, target: Target) -> EmbedFit:
        """An embeddings request's inputs counted against the link's window."""
        work = functools.partial(
            fit_inputs,
            embedding_inputs(request.input),
            window=target.context_window,
            truncate_prompt_tokens=request.truncate_prompt_tokens,
            counter=self._counters[target.counter_key],
        )
        return await asyncio.get_running_loop().run_in_executor(self._fitter, work)

    def _nowhere(self, model: str, tried: list[str], refused: Mapping[str, Refusal]) -> Refusal:
        """No link left: the client's 400 when every link tried could not take the request
        (lacked FIM tokens, or its window could not hold it: the first such link's, the
        chain's own model, says which window), the last shed's 429 when links shed the job as
        it failed over, else 503 (saying which links' windows were too small)."""
        for code in _LINKS_OWN_LIMITS:
            if tried and all(name in refused and refused[name].code == code for name in tried):
                return refused[tried[0] if code == ErrorCode.CONTEXT_LENGTH_EXCEEDED else tried[-1]]
        sheds = [r for r in refused.values() if r.code == ErrorCode.OVERLOADED]
        if sheds:
            return sheds[-1]
        small = [n for n, r in refused.items() if r.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED]
        return self._unavailable(model, tried, small)

    def _unavailable(self, model: str, tried: list[str], small: list[str] | None = None) -> Refusal:
        if tried:
            message = f"Every backend for {model!r} failed ({', '.join(tried)})."
        else:
            message = f"No backend for {model!r} is available now."
        if small:  # the rest of the chain could not hold the request: not the client's fault
            message += f" The request does not fit the window of {', '.join(small)}."
        retry = max(1, round(self._config.router.breaker_cooldown_s))
        return Refusal(503, ErrorCode.BACKEND_UNAVAILABLE, message, retry)


def _model_names(config: ClusterConfig) -> frozenset[str]:
    """The models and adapters the config serves, by name (what a job's model may be)."""
    return frozenset(name for name in config.served_names.values() if name is not None)


# Refusals of a link's own limits: another link of the chain may not have them.
_LINKS_OWN_LIMITS = (ErrorCode.FIM_NOT_SUPPORTED, ErrorCode.CONTEXT_LENGTH_EXCEEDED)


def _goes_on(refusal: Refusal, tried: list[str], *, continues: bool) -> bool:
    """Whether a job a link refused goes on to the next link: where that link's model lacks FIM
    tokens or its window cannot hold the request (another's may: a coding agent's tools
    overflow the CPU fallback's small window, not the model's), where half an answer is out
    (another may take the rest), and where the link shed a job that was failing over: the load
    it met is the failed links' work moved there, the next link may be free, and the CPU
    fallback ends text chains for this. No refusal is the link's fault: no breaker hears of
    it."""
    if continues or refusal.code in _LINKS_OWN_LIMITS:
        return True
    return bool(tried) and refusal.code == ErrorCode.OVERLOADED


def _prompt_of(field: Any) -> str | list[int]:
    """The one prompt of a completion (the ingress lets one through): text or token ids."""
    prompt = single_prompt(field)
    return prompt if isinstance(prompt, str) else [int(t) for t in prompt]


def _failed_over(name: str, tried: list[str]) -> None:
    metrics.FAILOVERS.labels(name).inc()
    tried.append(name)


def _failed(continuing: Continuing | None) -> Continuing | None:
    """An answer going on after a link failed it: a failure's continuation from now on, even
    where a pause began it."""
    return None if continuing is None else replace(continuing, paused=False)


def _give_back(link: Link, admitting: asyncio.Future[Admitted | Refusal]) -> None:
    """The slot of an admission nobody took (its client left as it was granted)."""
    if admitting.cancelled() or admitting.exception() is not None:
        return
    admitted = admitting.result()
    if not isinstance(admitted, Refusal):
        link.gate.release(admitted[1].ticket)


def _going_on(
    fault: MidStreamFault,
    name: str,
    continuing: Continuing | None,
    original: Request,
    tried: list[str],
) -> Continuing | None:
    """The answer to go on with after `fault` on link `name` (a failure: on the next link; a
    pause: wherever it gets a slot again, its own link first), or None where it cannot."""
    paused = isinstance(fault, Paused)
    if not paused:
        logger.warning("backend %s failed mid-stream: %s", name, fault)
        _failed_over(name, tried)
    return _continuation(fault, name, continuing, original, paused)


def _continuation(
    fault: MidStreamFault,
    name: str,
    continuing: Continuing | None,
    original: Request,
    paused: bool = False,
) -> Continuing | None:
    """The answer to go on with (on the next link, or a paused one's again), or None where it
    cannot go on."""
    partial = fault.tape.partial()
    if continuing is not None:
        partial = continuing.partial.then(partial)
    if not (partial.continuable and continuable(original)):
        return None
    budget = continuing.budget if continuing else fault.max_tokens
    pauses = (continuing.pauses if continuing else 0) + (1 if paused else 0)
    return Continuing(partial, name, budget, pauses, paused)


def _untruncated(window: int) -> Refusal:
    """A request that asked not to be truncated, for a window it does not fit as sent."""
    message = (
        f"The input does not fit the model's context window of {window} tokens as sent, and "
        "truncation is disabled: send truncation: auto to have older turns left out, or a "
        "shorter input."
    )
    return Refusal(400, ErrorCode.CONTEXT_LENGTH_EXCEEDED, message)
