"""One chain link (a backend or the fallback) as the router drives it: its slots, breaker and
KV pressure, the facts recorded about it (`policy.links`), and the jobs it holds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from core.answers import EngineError
from core.config import ClusterConfig, RouterConfig
from core.topology import Target
from core.types import PriorityClass
from deployments.router import metrics
from deployments.router.adapters.ports import Backend
from deployments.router.request_path.faults import REPLICA_GONE
from policy.admission import AdmissionQueue
from policy.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Transition
from policy.engine_counters import ReplicaTally
from policy.gate import BackendGate, GatePolicy
from policy.kv_pressure import KvPolicy, KvPressure
from policy.links import Health, LinkFacts, LinkStatus, link_status
from policy.oom import OOM_CODE
from policy.preemption import (
    PreemptRules,
    RouterWork,
    RunningView,
    pausable_by_class,
    rules_of,
    shared_pauses,
    to_pause,
    victims,
)
from policy.slot_leases import Lease, fallback_share

logger = logging.getLogger("ray.serve")

# Serve's controller pushes a replica set to every handle within milliseconds of a change; half
# a second covers a busy event loop (a backend just woken, or whose replacement was just
# reported running, may reach the handle a moment after the news reached the router), and is
# what a job that met a dying link loses at most before it moves on.
REPLICA_GRACE_S = 0.5
REPLICA_POLL_S = 0.1


class Running(Protocol):
    """A job running on the link, as preemption sees and pauses it (serving.Attempt)."""

    pause_asked: bool

    def view(self) -> RunningView: ...

    def pause(self) -> None: ...


@dataclass
class Link:
    target: Target
    backend: Backend
    gate: BackendGate
    breaker: CircuitBreaker
    kv: KvPressure
    clock: Callable[[], float]
    facts: LinkFacts
    in_flight: int = 0
    # The engine's own counts (preemptions, prefix-cache tokens), summed over its replicas.
    engine_counts: ReplicaTally = field(default_factory=ReplicaTally)
    # Routers splitting the backend's cap (gateway.router_shares), and the replicas Serve
    # last said were running (None until the first health check).
    shares: int = 1
    running_replicas: int | None = None
    # This router's lease of the backend's slots from the app's slot broker (several routers,
    # deployments/router/loops/slot_sync.py); None: an equal share, total_cap // shares.
    lease: Lease | None = None
    # Jobs that chose this link and have not finished: being fitted, queued for a slot or in
    # flight. A placement move drains the source until no router replica holds any.
    claims: int = 0
    seen_transitions: int = field(default=0)
    # The jobs running on the link, by their slot's ticket.
    running: dict[int, Running] = field(default_factory=dict)
    # What the other routers run on the backend and will not pause (shared slots, their last
    # posts): preemption weighs the backend's batch.
    elsewhere_batch: int = 0
    # Set while jobs waiting on the link's first answer should stop waiting (serving.py)
    # instead of waiting out first_token_timeout_s: its pool was declared down (a dead
    # machine), or Serve's handle has held no replica for REPLICA_GRACE_S (the job is queued in
    # the handle for a replacement, where Serve's own retry puts a call to a replica that just
    # died). An Event belongs to the loop that first waits on it: gone() makes one for the
    # loop that asks (a router serves from one loop; a test may use another).
    _gone: asyncio.Event = field(default_factory=asyncio.Event)
    _gone_loop: asyncio.AbstractEventLoop | None = None
    _no_replica_since: float | None = None

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        self.claims += 1
        try:
            yield
        finally:
            self.claims -= 1

    # Requests that found the link asleep and went down the chain (when_asleep: next_link)
    # since it fell asleep: posted as waiting until it wakes, so one lost post or a policy read
    # between two posts cannot leave it asleep.
    passed_asleep: int = 0

    def status(self) -> LinkStatus:
        return link_status(
            self.facts,
            self.breaker,
            self.kv,
            self.clock(),
            self.target.wait_when_asleep,
            0 if self.has_no_replica() else None,
        )

    def has_no_replica(self) -> bool:
        """Serve's handle holds no replica to send to now, and not because load put the
        backend to sleep (asleep, requests wait for it to wake on purpose). Never the CPU
        fallback: every chain's last link, which Serve replaces in seconds, is worth that wait
        rather than a 503."""
        if self.facts.asleep or self.target.model is None:
            return False
        return self.backend.routable_replicas() == 0

    def read(self, health: Health) -> None:
        self.facts = self.facts.read(health)

    def scaled(self, running: int) -> None:
        """Serve's running replica count: an autoscaled backend's slots follow it. Asleep, it
        has none: requests wait in its queue until it wakes."""
        self.running_replicas = running
        self.gate.resize(self.local_cap(), self.shared_total())

    @property
    def total_cap(self) -> int:
        """The backend's slots over every router: its cap, or an autoscaled backend's per
        replica cap times its running replicas; none while it sleeps."""
        if self.facts.asleep:
            return 0
        if self.target.autoscaled and self.running_replicas is not None:
            return self.target.per_replica_cap * max(1, self.running_replicas)
        return self.target.cap

    def local_cap(self) -> int:
        """The slots this router admits under: its lease (scaled by the backend's slots since
        it was granted) or an equal share."""
        total = self.total_cap
        if self.lease is None or (self.lease.of_total == 0 and total):  # nothing leased yet
            return fallback_share(total, self.shares)
        if self.lease.of_total == total:
            return self.lease.slots
        return self.lease.slots * total // max(1, self.lease.of_total)

    def shared_total(self) -> int | None:
        """The backend's slots whose class shares this router admits under: every router's,
        while it follows the slot broker (which tells it what the others run); None with an
        equal share of its own."""
        return None if self.lease is None else self.total_cap

    def leased(self, lease: Lease | None) -> None:
        """A lease from the slot broker (None: back to an equal share)."""
        self.lease = lease
        self.gate.resize(self.local_cap(), self.shared_total())

    def retune(self, target: Target, settings: RouterSettings) -> None:
        """A reload's settings: its cap (where the model's count is fixed), queue, breaker and
        KV thresholds. What the link holds (waiters, slots taken, breaker state) stays."""
        self.target = target
        queue = settings.queue
        cap = self.local_cap()
        self.gate.queue.preempt = settings.preempt
        self.gate.retune(
            settings.gate,
            cap,
            queue.max_queue,
            queue.aging_s,
            queue.class_shares,
            self.shared_total(),
        )
        self.breaker.policy = settings.breaker
        self.kv.policy = settings.kv

    def sleep(self) -> None:
        """Load put the backend at zero replicas: no fault, nothing to probe, no breaker to
        open; requests wait for it to wake (or go on, per its model's `when_asleep`)."""
        if self.facts.asleep or not self.target.sleeps:
            return
        self.facts = self.facts.slept(True)
        self.passed_asleep = 0
        self.kv.forget()
        self.gate.queue.kv_usage = None
        if self.breaker.state is not BreakerState.CLOSED:  # a health check saw it go first
            self.breaker.reset("asleep by autoscaling")
            self.count_transitions()
        # None: its requests wait for it to wake.
        self.gate.resize(self.local_cap(), self.shared_total())
        logger.info("backend %s is asleep (idle)", self.target.name)

    def wake(self, running: int) -> None:
        """A replica runs again: its waiting requests go to it."""
        self.facts = self.facts.slept(False).read(Health.RUNNING)
        self.passed_asleep = 0
        self.scaled(running)
        logger.info("backend %s is awake (%d running)", self.target.name, running)

    def park(self, parked: bool) -> None:
        self.facts = self.facts.placed(parked)
        if parked:  # placement's zero: requests that passed it asleep are not its to wake for
            self.passed_asleep = 0

    def on_pool(self, down: bool) -> None:
        self.facts = self.facts.on_pool(down)
        self._mark_gone()

    def watch_replicas(self) -> None:
        """Read Serve's handle (every REPLICA_POLL_S): jobs waiting on a link whose handle has
        held no replica for REPLICA_GRACE_S stop waiting."""
        if not self.has_no_replica():
            self._no_replica_since = None
        elif self._no_replica_since is None:
            self._no_replica_since = self.clock()
        self._mark_gone()

    def gone_reason(self) -> str | None:
        """Why jobs waiting on the link's first answer should stop waiting, if they should."""
        if self.facts.pool_down:
            return "its pool was declared down"
        since = self._no_replica_since
        if since is None or self.clock() - since < REPLICA_GRACE_S:
            return None
        # Read again: a replacement may have reached the handle since the last round.
        return (
            "it has no running replica (Serve is replacing it)" if self.has_no_replica() else None
        )

    def gone(self) -> asyncio.Event:
        """Set while `gone_reason` holds, for the running loop's waiters."""
        loop = asyncio.get_running_loop()
        if self._gone_loop is not loop:
            self._gone_loop, self._gone = loop, asyncio.Event()
            self._mark_gone()
        return self._gone

    def _mark_gone(self) -> None:
        if self.gone_reason() is not None:
            self._gone.set()
        elif self._gone.is_set():
            self._gone = asyncio.Event()

    @property
    def counts_engine(self) -> bool:
        """Its engine keeps counts to read: a vLLM backend, not the CPU fallback."""
        return self.target.model is not None

    def no_kv_reading(self) -> None:
        self.facts = self.facts.kv_unobservable()

    def recovered(self, health: Health) -> None:
        """Seen answering: readings from before the trouble say nothing now (a replaced
        replica starts empty; a down one left only stale readings, which count as pressure)."""
        self.read(health)
        self.kv.forget()
        self.gate.queue.kv_usage = None
        self.gate.resume()

    def record_verdict(self, verdict: bool | None) -> None:
        """True: served; False: a backend fault; None: no verdict (client gone, 4xx)."""
        if verdict is False and self.facts.asleep:
            verdict = None  # sent in the moment before the router heard of the sleep: no fault
        if verdict is True:
            self.breaker.record_success()
        elif verdict is False:
            metrics.BACKEND_FAULTS.labels(self.target.name).inc()
            self.breaker.record_failure()
        else:
            self.breaker.record_abandoned()
        self.count_transitions()

    def note_fault(self, error: BaseException) -> None:
        """A backend whose only replica died takes no work until Serve has replaced it: without
        this, requests would wait on Serve's handle for a replica that is not there yet."""
        if self.facts.asleep:
            return  # at zero on purpose: nothing died
        replicas = self.target.replicas
        if self.target.autoscaled and self.running_replicas:
            replicas = self.running_replicas
        if isinstance(error, REPLICA_GONE) and replicas == 1:
            self.facts = self.facts.replica_died(self.clock())
            self.breaker.trip("its only replica died")

    def note_oom(self, error: EngineError) -> None:
        """A replica out of memory refuses all work until Serve replaces it (llm_server.py);
        one that only lacked KV room now recovers by itself. Either way, stop sending there:
        the breaker opens at once, and a passed health probe closes it."""
        if error.kind != OOM_CODE:
            return
        metrics.BACKEND_OOM.labels(self.target.name).inc()
        self.breaker.trip(f"out of memory: {error.message}")

    def pause_for(self, arriving: PriorityClass) -> None:
        """A job of class `arriving` started here: with `router.preempt` on, ask the running
        jobs of lower classes that policy.preemption picks to pause (each does at its next
        item, if still warranted)."""
        rules = self.gate.queue.preempt
        if rules is None:
            return
        kv, elsewhere = self.fresh_kv(), self.elsewhere_batch
        self._ask_to_pause(lambda views: to_pause(views, arriving, rules, kv, elsewhere))

    def _ask_to_pause(self, choose: Callable[[list[RunningView]], list[int]]) -> int:
        """Ask the running jobs not yet asked that `choose` picks (from their views) to pause;
        how many."""
        jobs = {t: job for t, job in self.running.items() if not job.pause_asked}
        chosen = choose([job.view() for job in jobs.values()])
        for ticket in chosen:
            jobs[ticket].pause()
        return len(chosen)

    def work(self) -> RouterWork:
        """What this router runs on the backend, as the slot broker's books hold it."""
        rules = self.gate.queue.preempt
        views = [job.view() for job in self.running.values() if not job.pause_asked]
        return RouterWork(
            self.gate.queue.running_by_class(),
            pausable_by_class(views, rules) if rules is not None else {},
            sum(1 for job in self.running.values() if job.pause_asked),
        )

    def others_at_work(self, work: Mapping[str, RouterWork], me: str) -> int:
        """Every router's work on the backend from the slot broker's books (`me`: this one's
        name there): a lower class here waits while a higher one runs elsewhere, and this
        router pauses its part of what the others' higher classes need paused; how many it
        asked to pause."""
        others: dict[PriorityClass, int] = {}
        self.elsewhere_batch = 0
        for name, theirs in work.items():
            if name != me:
                for cls, n in theirs.running.items():
                    others[cls] = others.get(cls, 0) + n
                self.elsewhere_batch += theirs.total - theirs.pausing
        self.gate.seen_elsewhere(others)
        rules = self.gate.queue.preempt
        if rules is None or me not in work:
            return 0
        mine = shared_pauses({**work, me: self.work()}, rules).get(me)
        if mine is None:
            return 0
        return self._ask_to_pause(lambda views: victims(views, mine[0], rules, mine[1]))

    def fresh_kv(self) -> float | None:
        return None if self.kv.stale(self.clock()) else self.kv.usage

    def count_transitions(self) -> None:
        for transition in self.breaker.transitions[self.seen_transitions :]:
            _log_transition(self.target.name, transition)
            metrics.BREAKER_TRANSITIONS.labels(self.target.name, transition.target.value).inc()
        self.seen_transitions = len(self.breaker.transitions)


@dataclass(frozen=True)
class RouterSettings:
    """The policies every link takes from `router`: built once, shared by the links."""

    queue: RouterConfig
    gate: GatePolicy
    breaker: BreakerPolicy
    kv: KvPolicy
    preempt: PreemptRules | None

    @classmethod
    def of(cls, config: ClusterConfig) -> RouterSettings:
        settings = config.router
        return cls(
            queue=settings,
            gate=GatePolicy(settings.queue_timeout_s, settings.retry_after_s),
            breaker=BreakerPolicy(
                failure_threshold=settings.breaker_failures,
                cooldown_s=settings.breaker_cooldown_s,
                half_open_probes=settings.half_open_probes,
            ),
            kv=KvPolicy(
                high=settings.kv_cache_high,
                resume_factor=settings.kv_cache_resume_factor,
                stale_after_s=settings.kv_stale_after_s,
            ),
            preempt=rules_of(settings.preempt),
        )


def build_links(
    config: ClusterConfig,
    backends: Mapping[str, Backend],
    placement: Mapping[str, str],
    clock: Callable[[], float],
) -> dict[str, Link]:
    """A link per backend, each holding `cap // router_shares` slots (so the replicas' slots
    never sum past the cap); those not where `placement` puts their model start parked."""
    settings = RouterSettings.of(config)
    links = {}
    for name, backend in backends.items():
        target = config.targets[name]
        queue = AdmissionQueue(
            cap=fallback_share(target.cap, config.gateway.router_shares),
            max_queue=settings.queue.max_queue,
            aging_s=settings.queue.aging_s,
            shares=settings.queue.class_shares,
            preempt=settings.preempt,
        )
        model = target.model
        links[name] = Link(
            target=target,
            backend=backend,
            gate=BackendGate(queue, settings.gate, clock),
            breaker=CircuitBreaker(settings.breaker, clock),
            kv=KvPressure(settings.kv),
            clock=clock,
            facts=LinkFacts(parked=model is not None and placement.get(model) != name),
            shares=config.gateway.router_shares,
        )
    return links


def _log_transition(backend: str, transition: Transition) -> None:
    logger.warning(
        "breaker %s: %s -> %s (%s)",
        backend,
        transition.source.value,
        transition.target.value,
        transition.reason,
    )
