"""The test engine's GPU shape in time (issue 56): steps tests/fakes/gpu_scheduler.py's vLLM V1
scheduler on the replica's event loop, each step taking what tests/fakes/gpu_cost.py says it
costs, and hands each request its tokens as the steps produce them.

Chosen by `TINY_ENGINE_GPU: <a name in gpu_cost.SHAPES>` in a model's env_vars;
`TINY_ENGINE_KV_TOKENS` gives the KV cache less room (to run it out). A model of a GPU, not one:
the benches that use it say so beside every figure.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator

from tests.fakes.gpu_cost import GpuCost
from tests.fakes.gpu_scheduler import Policy, Scheduler, SimRequest

GPU_ENV = "TINY_ENGINE_GPU"
KV_TOKENS_ENV = "TINY_ENGINE_KV_TOKENS"
_TOKEN, _DONE, _FAILED = "token", "done", "failed"


class PromptTooLong(ValueError):
    """A request the whole KV cache cannot hold: vLLM refuses it at admission."""


class GpuSteps:
    def __init__(
        self, cost: GpuCost, max_num_seqs: int, policy: Policy, kv_tokens: int = 0
    ) -> None:
        self._scheduler = Scheduler(cost, max_num_seqs, policy, kv_tokens)
        self._queues: dict[str, asyncio.Queue[str]] = {}
        self._ids = itertools.count()
        self._loop_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @property
    def busy(self) -> bool:
        """Some request holds KV blocks or waits for them."""
        return not self._scheduler.idle

    async def generate(
        self, prompt_tokens: int, max_tokens: int, priority: int
    ) -> AsyncGenerator[None, None]:
        """Once per token the modelled GPU samples for this request, until max_tokens."""
        prompt_tokens, max_tokens = max(1, prompt_tokens), max(1, max_tokens)
        if not self._scheduler.could_hold(prompt_tokens + max_tokens):
            raise PromptTooLong(f"{prompt_tokens} + {max_tokens} tokens exceed the KV cache")
        rid = str(next(self._ids))
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._queues[rid] = queue
        self._scheduler.add(SimRequest(rid, prompt_tokens, max_tokens, priority))
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        try:
            while (event := await queue.get()) == _TOKEN:
                yield
            if event == _FAILED:
                raise RuntimeError("the modelled engine's step loop failed") from self._failure
        finally:  # its client left, or the router paused it: vLLM aborts it
            self._queues.pop(rid, None)
            self._scheduler.abort(rid)

    async def _run(self) -> None:
        """Steps while any request runs or waits. A step's outcome (blocks freed, requests
        finished) holds from its start; its tokens reach their requests when its time is up."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        try:
            while not self._scheduler.idle:
                step = self._scheduler.step()
                if not step.scheduled:  # a request preempted itself: the next step seats it
                    await asyncio.sleep(0)
                    continue
                # each step due at its own time; a late wake-up is made up for by at most one
                # step, so the engine is never faster than the GPU modelled
                due = max(due, loop.time() - step.seconds) + step.seconds
                await asyncio.sleep(max(0.0, due - loop.time()))
                for rid in step.produced:
                    if rid in self._queues:
                        self._queues[rid].put_nowait(_TOKEN)
                for rid in step.finished:
                    if rid in self._queues:
                        self._queues[rid].put_nowait(_DONE)
        except Exception as failure:  # every request waiting hears of it, none hangs
            self._failure = failure
            for queue in self._queues.values():
                queue.put_nowait(_FAILED)
            raise
        finally:
            self._loop_task = None
