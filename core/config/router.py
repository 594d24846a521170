"""The router's admission, breakers, failover and preemption: how one router drives each
backend of a chain."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import AfterValidator, Field, model_validator

from core.config.base import Frozen, FrozenDict, frozen_dict
from core.types import PriorityClass

__all__ = ["DEFAULT_CLASS_SHARES", "PreemptConfig", "RouterConfig"]


class PreemptConfig(Frozen):
    """Pausing lower classes for a higher one (policy/preemption.py): the engine aborts them and
    they go on later as the same answer."""

    enabled: bool = Field(
        False,
        description="A request admitted to a backend whose batch is past above_running (or its "
        "KV cache past above_kv) pauses running requests of lower classes; they go on as the "
        "same answer when the higher class's work has room again. Off by default, on both kinds "
        "of engine: on the embedded default's CPU engines the shares alone kept users' p99 "
        "within 1.5 x (1.46) at 0.93 x background's throughput, while pausing at above_running "
        "1 made it 6.0 x (each resume prefills the answer again in the next user's way); on a "
        "model of a GPU users do not feel background inside the cap (1.03 x) and pausing costs "
        "it 12-15 % of its throughput (bench.preemption [--engine gpu-model], "
        "docs/benchmarks.md).",
    )
    above_running: int = Field(
        2,
        ge=1,
        description="The batch (requests running on the backend) above which a higher class's "
        "arrival pauses lower ones, and at which a lower class waits while a higher one runs. "
        "On a GPU a pause can pay only past the model's knee (where a decode step grows with "
        "the batch: about 64 sequences for an 8B model on an H100) or with above_kv; below it "
        "a step of several costs what a step of one does and a pause only loses work (a model "
        "of a GPU, docs/benchmarks.md).",
    )
    above_kv: float | None = Field(
        None, gt=0, le=1, description="KV cache usage above which one more is paused; none: off."
    )
    may_pause: Annotated[
        dict[PriorityClass, Annotated[int, Field(ge=0)]], AfterValidator(frozen_dict)
    ] = Field(
        default_factory=lambda: frozen_dict({PriorityClass.USER: 4, PriorityClass.AGENT: 2}),
        description="By the arriving class: how many running requests of lower classes one "
        "arrival may pause (a class not named pauses none).",
    )
    max_pauses: int = Field(2, ge=1, description="The most times one request is paused.")
    protect_last_tokens: int = Field(
        32, ge=0, description="A request this close to its max_tokens is never paused."
    )
    keepalive_s: float = Field(
        10.0, gt=0, description="Between SSE comment lines a paused stream gets while it waits."
    )
    resume_after_s: float = Field(
        0.0,
        ge=0,
        description="A lower class (a paused answer or a new one) starts only once no higher "
        "class has ended on the backend, as this router sees it, for this long: a paused answer "
        "that goes on in the gap between two users prefills its text again, which the next user "
        "waits behind. 0: off, as a hold-down starves background at any user pace faster than "
        "it (0.02-0.06 x on a model of a GPU, 0.12-0.27 x on the CPU engines). Waiting "
        "background work gets past it once aging lifts it to the "
        "highest class (into its own share only): keep queue_timeout_s above twice aging_s.",
    )


# Every request in an engine's batch slows the others (on CPU engines almost linearly): half the
# cap for batch work bounds what users feel of it (bench/overload.py), however long it waited.
DEFAULT_CLASS_SHARES = {
    PriorityClass.USER: 1.0,
    PriorityClass.AGENT: 0.75,
    PriorityClass.BACKGROUND: 0.5,
}


def _all_class_shares(value: dict[PriorityClass, float]) -> FrozenDict:
    return frozen_dict({**DEFAULT_CLASS_SHARES, **value})


# vLLM's priority scheduler runs the lowest number first.
DEFAULT_ENGINE_PRIORITIES = {cls: cls.rank for cls in PriorityClass}


def _all_engine_priorities(value: dict[PriorityClass, int]) -> FrozenDict:
    return frozen_dict({**DEFAULT_ENGINE_PRIORITIES, **value})


class RouterConfig(Frozen):
    """Admission, breakers and failover in the router deployment."""

    max_queue: int = Field(64, ge=0, description="Waiting requests per backend.")
    # What a class leaves of the cap is headroom for the classes above it, so interactive work
    # never waits behind a full load of batch work.
    class_shares: Annotated[
        dict[PriorityClass, Annotated[float, Field(gt=0, le=1)]],
        AfterValidator(_all_class_shares),
    ] = Field(
        default_factory=lambda: _all_class_shares({}),
        description="The share of each backend's cap a class may hold, counting the classes "
        "below it (user 1.0, agent 0.75, background 0.5; at least one slot each), however long "
        "its requests waited; user must be 1.0 and shares may not grow down the classes. Half "
        "for background: on the embedded default (cap 2) that keeps one slot users only ever "
        "share with one background answer (user p99 1.46 x unloaded); background over the "
        "whole cap made it 24 x, with users timing out (bench.preemption --shape embedded).",
    )
    queue_timeout_s: float = Field(30.0, gt=0, description="The longest wait for a slot (429).")
    aging_s: float = Field(
        10.0,
        gt=0,
        description="A waiter ranks one class higher per aging_s waited: it goes before newer "
        "work of that class and past preemption's holds, never past its own class's share. 10 s: "
        "a third of queue_timeout_s, so a waiter ranks as a user well before it would time out "
        "(and past a hold-down); it no longer takes users' slots, so it need not be longer.",
    )
    retry_after_s: int = Field(2, ge=1, description="Retry-After on a 429 for load.")
    breaker_failures: int = Field(3, ge=1, description="Consecutive faults that open a breaker.")
    breaker_cooldown_s: float = Field(
        10.0, gt=0, description="Open this long before a probe request may pass (half-open)."
    )
    half_open_probes: int = Field(1, ge=1, description="Requests let through while half-open.")
    kv_cache_high: float = Field(
        0.88, gt=0, le=1, description="KV cache usage above which a backend gets no new work."
    )
    kv_cache_resume_factor: float = Field(
        0.9, gt=0, lt=1, description="It takes work again below kv_cache_high times this."
    )
    kv_poll_interval_s: float = Field(1.0, gt=0, description="Between KV usage readings.")
    kv_stale_after_s: float = Field(
        10.0, gt=0, description="A reading older than this counts as pressure."
    )
    # Serve's status costs the controller and us ~0.2 s of CPU a read: read it often only while
    # some backend is in trouble (tripped, down, recovering), seldom while all are well.
    health_interval_s: float = Field(
        5.0, gt=0, description="Between health reads while some backend is in trouble."
    )
    health_idle_interval_s: float = Field(
        30.0, gt=0, description="Between health reads while all are well."
    )
    first_token_timeout_s: float = Field(
        120.0, gt=0, description="A backend with no first token for this long has failed."
    )
    stream_idle_timeout_s: float = Field(
        120.0, gt=0, description="A stream silent for this long has failed."
    )
    # How often Serve's controller checks each vLLM replica: the check is what tells it a
    # replica died (a SIGKILL, an OOM kill). Until then Serve's handles may still route to the
    # dead replica and hold requests; Serve's default is 10 s. A check is an in-memory look at
    # the engine (vLLM's check_health): cheap at 2 s. Three failed checks in a row stop a
    # replica (6 s at 2 s).
    replica_health_check_period_s: float = Field(
        2.0,
        gt=0,
        description="How often Serve checks each vLLM replica (its own default is 10 s, which "
        "the CPU fallback keeps): the check is how Serve learns a replica died, and until then "
        "its handles may still route there. Three failed checks in a row stop a replica.",
    )
    engine_priority: bool = Field(
        True,
        description="The class reaches the engine: vLLM's priority scheduler on every vLLM "
        "backend, each request at its class's number (engine_priorities; lower runs first, and "
        "where the KV cache runs out the highest is preempted first); the CPU fallback serves "
        "the lowest first too. Off: FCFS, every request at 0.",
    )
    prefix_routing: bool = Field(
        True,
        description="A backend that may run more than one replica picks one per request by "
        "session and prefix (over Ray Serve LLM's PrefixCacheAffinityRouter). Off: Serve's "
        "power-of-two choice.",
    )
    prefix_imbalance: int = Field(
        2,
        ge=0,
        description="How many requests busier than the least loaded replica a conversation's "
        "or prefix's replica may be before the request goes elsewhere.",
    )
    engine_priorities: Annotated[
        dict[PriorityClass, Annotated[int, Field(ge=-(2**31), lt=2**31)]],
        AfterValidator(_all_engine_priorities),
    ] = Field(
        default_factory=lambda: _all_engine_priorities({}),
        description="Each class's number at the engine (user 0, agent 1, background 2); never "
        "falling down the classes.",
    )

    preempt: PreemptConfig = Field(
        default_factory=PreemptConfig,
        description="Pausing running requests of lower classes for a higher one.",
    )

    def engine_priority_of(self, cls: PriorityClass) -> int:
        """The number a request of `cls` carries to its engine."""
        return int(self.engine_priorities[cls]) if self.engine_priority else 0

    @model_validator(mode="after")
    def _engine_priorities_ascend(self) -> Self:
        numbers = [self.engine_priorities[c] for c in PriorityClass]
        if numbers != sorted(numbers):
            raise ValueError(
                "engine_priorities must not fall down the classes (user <= agent <= "
                f"background: the engine runs the lowest first), got "
                f"{dict(zip([c.value for c in PriorityClass], numbers, strict=True))}"
            )
        return self

    @model_validator(mode="after")
    def _shares_descend(self) -> Self:
        shares = [self.class_shares[c] for c in PriorityClass]
        if shares[0] != 1.0:
            raise ValueError(
                "class_shares.user must be 1.0: the top class may always fill the whole cap"
            )
        if shares != sorted(shares, reverse=True):
            raise ValueError(
                f"class_shares must not grow down the classes (user >= agent >= background), got "
                f"{dict(zip([c.value for c in PriorityClass], shares, strict=True))}; lower the "
                "share of the lower class"
            )
        return self
