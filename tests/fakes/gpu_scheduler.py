"""vLLM V1's scheduler, reduced to what decides who runs and when (issue 56): the test engine's
GPU shape steps it (tests/fakes/tiny_engine.py) and tests/fakes/gpu_cost.py prices each step.

As vllm/v1/core/sched/scheduler.py does it:
- each step schedules the running requests first: one token each when decoding, a chunk of
  the prompt (within max_num_batched_tokens) while prefilling;
- a running request that needs a KV block when none is free preempts a running request: under
  the priority policy the one with the highest (priority, arrival), else the newest; the
  victim frees its blocks and waits again at the head of the queue, its prompt and what it
  generated to be computed again (vLLM's recompute preemption); where the victim is the
  request itself, the step schedules no more running requests;
- only in a step that preempted nobody are waiting requests admitted, lowest (priority,
  arrival) first under the priority policy, in arrival order otherwise, while a sequence slot
  (max_num_seqs), token budget and KV blocks for their next chunk remain; a waiting request
  never preempts a running one;
- the step that completes a prompt samples its first token.

Pure: no clock, no I/O; a step says what it scheduled, what each request produced and what it
cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from tests.fakes.gpu_cost import GpuCost


class Policy(Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"


@dataclass
class SimRequest:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    arrival: int = 0  # the scheduler's order of arrival
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0

    @property
    def wanted(self) -> int:
        """Tokens that must be in the cache before the next one is sampled."""
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.max_tokens


@dataclass(frozen=True)
class Step:
    seconds: float  # what the step costs on the GPU modelled
    produced: tuple[str, ...]  # each request that sampled a token in it
    finished: tuple[str, ...]
    preempted: tuple[str, ...]
    scheduled: int  # sequences in the step
    prefill_tokens: int


@dataclass
class Scheduler:
    cost: GpuCost
    max_num_seqs: int
    policy: Policy = Policy.FCFS
    kv_tokens: int = 0  # the cache's room; 0: the cost's
    running: list[SimRequest] = field(default_factory=list, init=False)
    waiting: list[SimRequest] = field(default_factory=list, init=False)  # the head goes first
    kv_blocks: int = field(init=False)
    _arrivals: int = field(default=0, init=False)
    _used_blocks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        room = self.kv_tokens or self.cost.kv_tokens
        self.kv_blocks = room // self.cost.block_tokens

    def could_hold(self, tokens: int) -> bool:
        """Whether the whole cache could ever hold a request of `tokens` (vLLM refuses one
        that it could not at admission)."""
        return self.cost.blocks(tokens) <= self.kv_blocks

    @property
    def free_blocks(self) -> int:
        return self.kv_blocks - self._used_blocks

    @property
    def idle(self) -> bool:
        return not (self.running or self.waiting)

    def add(self, request: SimRequest) -> None:
        request.arrival = self._arrivals
        self._arrivals += 1
        self.waiting.append(request)

    def abort(self, request_id: str) -> None:
        """A request its client left (or the router paused): its blocks go at once."""
        for queue in (self.running, self.waiting):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._free(request)
                    return

    def step(self) -> Step:
        budget = self.cost.max_num_batched_tokens
        scheduled: dict[str, int] = {}  # tokens computed in this step, by request
        preempted: list[str] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(request.wanted - request.computed, budget)
            while not self._fits(request, tokens):
                victim = self._victim()
                if self.running.index(victim) < index:
                    index -= 1
                self.running.remove(victim)
                budget += scheduled.pop(victim.request_id, 0)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            if request not in self.running:
                break  # it was the lowest itself: it waits again, and so do those after it
            self._grow(request, tokens)
            scheduled[request.request_id] = tokens
            budget -= tokens
            index += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                request = self._next_waiting()
                tokens = min(request.wanted - request.computed, budget)
                if not self._fits(request, tokens):
                    break
                self.waiting.remove(request)
                self.running.append(request)
                self._grow(request, tokens)
                scheduled[request.request_id] = tokens
                budget -= tokens
        return self._run(scheduled, tuple(preempted))

    def _run(self, scheduled: dict[str, int], preempted: tuple[str, ...]) -> Step:
        """The step's outcome: blocks are already held for what it computes."""
        by_id = {r.request_id: r for r in self.running}
        context = prefill = 0
        produced, finished = [], []
        for rid, tokens in scheduled.items():
            request = by_id[rid]
            context += request.computed - tokens
            decoding = tokens == 1 and request.generated > 0
            prefill += 0 if decoding else tokens
            if request.computed < request.wanted:
                continue  # a prompt's chunk: more of it next step
            request.generated += 1
            produced.append(rid)
            if request.done:
                finished.append(rid)
                self.running.remove(request)
                self._free(request)
        seconds = self.cost.step_s(len(scheduled), context, prefill)
        return Step(seconds, tuple(produced), tuple(finished), preempted, len(scheduled), prefill)

    def _fits(self, request: SimRequest, tokens: int) -> bool:
        blocks = self.cost.blocks
        more = blocks(request.computed + tokens) - blocks(request.computed)
        return more <= self.free_blocks

    def _grow(self, request: SimRequest, tokens: int) -> None:
        computed = request.computed + tokens
        self._used_blocks += self.cost.blocks(computed) - self.cost.blocks(request.computed)
        request.computed = computed

    def _free(self, request: SimRequest) -> None:
        self._used_blocks -= self.cost.blocks(request.computed)
        request.computed = 0

    def _victim(self) -> SimRequest:
        if self.policy is Policy.PRIORITY:
            return max(self.running, key=lambda r: (r.priority, r.arrival))
        return self.running[-1]

    def _preempt(self, request: SimRequest) -> None:
        self._free(request)
        self.waiting.insert(0, request)  # as vLLM prepends it

    def _next_waiting(self) -> SimRequest:
        if self.policy is Policy.PRIORITY:
            return min(self.waiting, key=lambda r: (r.priority, r.arrival))
        return self.waiting[0]
