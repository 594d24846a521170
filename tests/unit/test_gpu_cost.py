"""The test engine's GPU shape (tests/fakes/gpu_cost.py, gpu_scheduler.py) against the figures
it cites: vLLM's step on an H100, the H200 measurement in bench/gpu_decode_step.h200.json, and
how vLLM V1's scheduler admits, queues and preempts."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from tests.fakes.gpu_cost import H100_LLAMA_8B, GpuCost
from tests.fakes.gpu_scheduler import Policy, Scheduler, SimRequest
from tests.fakes.gpu_steps import GpuSteps, PromptTooLong

MEASURED = Path(__file__).parents[2] / "bench" / "gpu_decode_step.h200.json"
COST = H100_LLAMA_8B


def _h200(context: int) -> dict[int, float]:
    """Step ms by batch on the lent H200 for Llama-3.1-8B's shape."""
    [model] = [
        m
        for m in json.loads(MEASURED.read_text())["models"]
        if m["shape"]["name"] == "llama-3.1-8b"
    ]
    return {d["batch"]: d["step_ms"] for d in model["decode"] if d["context"] == context}


def test_a_step_of_one_is_vllms_published_time_per_output_token_on_an_h100() -> None:
    assert COST.decode_ms(1) == pytest.approx(6.48)
    # 6.59 ms at concurrency 4 in the same sweep: flat
    assert COST.decode_ms(4) == pytest.approx(6.59, rel=0.02)


@pytest.mark.parametrize("batch", [2, 4, 8, 16, 32, 64])
def test_below_the_knee_a_step_grows_as_little_as_measured(batch: int) -> None:
    measured = _h200(512)
    ratio = COST.decode_ms(batch, 512 * batch) / COST.decode_ms(1, 512)
    assert ratio == pytest.approx(measured[batch] / measured[1], rel=0.06)


def test_a_step_grows_with_every_sequence_and_most_past_the_knee() -> None:
    steps = [COST.decode_ms(b) for b in range(1, 513)]
    assert all(a < b for a, b in itertools.pairwise(steps))
    # not flat: 64 sequences cost what the H200 measured, 1.29 x one at a 512-token context
    assert COST.decode_ms(64, 64 * 512) / COST.decode_ms(1, 512) == pytest.approx(1.29, abs=0.02)


@pytest.mark.parametrize("batch", [128, 256, 512])
def test_past_the_knee_a_step_grows_with_its_batch(batch: int) -> None:
    measured = _h200(512)
    ratio = COST.decode_ms(batch, 512 * batch) / COST.decode_ms(1, 512)
    # the model's straight line through the knee and 512 sequences: within 15% of each point
    assert ratio == pytest.approx(measured[batch] / measured[1], rel=0.15)
    below = (COST.decode_ms(64) - COST.decode_ms(1)) / 63
    past = (COST.decode_ms(batch) - COST.decode_ms(64)) / (batch - 64)
    assert past > 1.5 * below  # compute, past the knee: each sequence costs more


def test_a_longer_context_costs_its_kv_read() -> None:
    measured = _h200(2048)
    short = _h200(512)
    ratio = COST.decode_ms(64, 64 * 2048) / COST.decode_ms(64, 64 * 512)
    # the H200 read 1.48 x; the H100's read and its weights' read slow alike, so the same
    assert ratio == pytest.approx(measured[64] / short[64], rel=0.1)


def test_a_prefill_is_its_tokens_at_the_measured_rate() -> None:
    assert COST.prefill_ms(4096) == pytest.approx(90.16, rel=0.05)  # the H200's 4,096 tokens
    assert COST.step_s(1, 0, 4096) == pytest.approx(0.091, rel=0.01)
    # a short chunk beside a decode batch is the decode step's price: memory-bound
    assert COST.step_s(9, 8 * 512, 64) == pytest.approx(COST.decode_ms(9, 8 * 512) / 1e3)


def test_the_kv_cache_holds_what_an_h100_leaves_for_it() -> None:
    assert 400_000 < COST.kv_tokens < 460_000
    assert COST.kv_blocks == COST.kv_tokens // 16


def test_a_cost_that_shrinks_with_its_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="must not shrink"):
        GpuCost("bad", 6.0, 64, 5.0, 0.03, 0.0, 45_000, 1000)


def _run(scheduler: Scheduler, steps: int = 10_000) -> dict[str, list[int]]:
    """Steps until idle; for each request, the steps in which it produced a token."""
    produced: dict[str, list[int]] = {}
    for n in range(steps):
        if scheduler.idle:
            break
        for rid in scheduler.step().produced:
            produced.setdefault(rid, []).append(n)
    return produced


def test_a_request_is_prefilled_then_decoded_a_token_a_step() -> None:
    scheduler = Scheduler(COST, max_num_seqs=8)
    scheduler.add(SimRequest("a", prompt_tokens=100, max_tokens=5))
    first = scheduler.step()
    assert (first.produced, first.prefill_tokens) == (("a",), 100)
    assert first.seconds == pytest.approx(COST.step_s(1, 0, 100))
    steps = [scheduler.step() for _ in range(4)]
    assert [s.prefill_tokens for s in steps] == [0, 0, 0, 0]
    assert steps[-1].finished == ("a",)
    assert scheduler.idle
    assert scheduler.free_blocks == scheduler.kv_blocks


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    scheduler = Scheduler(COST, max_num_seqs=8)
    scheduler.add(SimRequest("long", prompt_tokens=20_000, max_tokens=1))
    chunks = [scheduler.step().prefill_tokens for _ in range(3)]
    assert chunks == [8192, 8192, 20_000 - 2 * 8192]


def test_a_batch_of_users_and_background_decodes_at_nearly_the_price_of_one() -> None:
    scheduler = Scheduler(COST, max_num_seqs=64, policy=Policy.PRIORITY)
    for i in range(8):
        scheduler.add(SimRequest(f"bg{i}", 200, 256, priority=2))
    scheduler.step()  # their prefills
    alone = scheduler.step().seconds
    scheduler.add(SimRequest("user", 200, 16, priority=0))
    scheduler.step()  # the user's prefill beside their decodes
    beside = scheduler.step()
    assert beside.scheduled == 9
    assert beside.seconds < 1.02 * alone


def test_waiting_requests_go_by_priority_when_the_batch_is_full() -> None:
    scheduler = Scheduler(COST, max_num_seqs=2, policy=Policy.PRIORITY)
    for rid, tokens in (("bg0", 4), ("bg1", 8), ("bg2", 4)):
        scheduler.add(SimRequest(rid, 50, tokens, priority=2))
    first = scheduler.step()
    assert first.produced == ("bg0", "bg1")  # two slots: bg2 waits
    scheduler.add(SimRequest("user", 50, 4, priority=0))
    produced = _run(scheduler)
    # bg0's end frees one slot: the user, who arrived last, takes it before bg2
    assert produced["user"][0] < produced["bg2"][0]
    assert [len(produced[r]) for r in ("bg0", "bg1", "bg2", "user")] == [3, 7, 4, 4]


def test_a_waiting_request_never_preempts_a_running_one() -> None:
    scheduler = Scheduler(COST, max_num_seqs=2, policy=Policy.PRIORITY)
    for rid in ("bg0", "bg1"):
        scheduler.add(SimRequest(rid, 50, 10, priority=2))
    scheduler.step()
    scheduler.add(SimRequest("user", 50, 2, priority=0))
    for _ in range(5):
        assert scheduler.step().preempted == ()
        assert {r.request_id for r in scheduler.running} == {"bg0", "bg1"}


def test_when_the_kv_cache_runs_out_the_lowest_class_is_preempted_and_recomputed() -> None:
    # 12 blocks of 16: two requests of 64 prompt tokens and 40 answers cannot both finish
    scheduler = Scheduler(COST, max_num_seqs=8, policy=Policy.PRIORITY, kv_tokens=12 * 16)
    scheduler.add(SimRequest("user", 64, 40, priority=0))
    scheduler.add(SimRequest("background", 64, 40, priority=2))
    preempted: list[str] = []
    prefills: list[int] = []
    produced: dict[str, int] = {}
    while not scheduler.idle:
        step = scheduler.step()
        preempted += step.preempted
        prefills.append(step.prefill_tokens)
        for rid in step.produced:
            produced[rid] = produced.get(rid, 0) + 1
    assert preempted
    assert set(preempted) == {"background"}
    assert produced == {"user": 40, "background": 40}  # nothing lost, only recomputed
    # the preempted one computed its prompt and what it had generated again
    assert sum(prefills) > 2 * 64
    assert scheduler.free_blocks == 12


def test_a_victim_seated_before_the_request_that_needs_its_blocks_gives_them_back() -> None:
    # background runs first in the batch; the user, after it, runs short and takes its blocks
    scheduler = Scheduler(COST, max_num_seqs=8, policy=Policy.PRIORITY, kv_tokens=12 * 16)
    scheduler.add(SimRequest("background", 64, 40, priority=2))
    scheduler.add(SimRequest("user", 64, 40, priority=0))
    produced: dict[str, int] = {}
    preempted: list[str] = []
    while not scheduler.idle:
        step = scheduler.step()
        preempted += step.preempted
        for rid in step.produced:
            produced[rid] = produced.get(rid, 0) + 1
        assert scheduler.free_blocks >= 0
    assert set(preempted) == {"background"}
    assert produced == {"user": 40, "background": 40}
    assert scheduler.free_blocks == scheduler.kv_blocks


def test_a_request_short_of_blocks_that_is_itself_the_lowest_stops_the_step() -> None:
    # as vLLM: it waits again, and the running requests after it are not scheduled this step
    scheduler = Scheduler(COST, max_num_seqs=8, policy=Policy.PRIORITY, kv_tokens=4 * 16)
    scheduler.add(SimRequest("background", 30, 40, priority=2))
    scheduler.step()  # 30 prompt tokens: two blocks
    scheduler.add(SimRequest("user", 30, 10, priority=0))
    scheduler.step()  # the user's two blocks: the cache is full
    steps = [scheduler.step() for _ in range(4)]  # each needs its third block at 33 tokens
    stopped = [s for s in steps if "background" in s.preempted]
    assert stopped
    assert stopped[0].scheduled == 0  # the user's running after it waits one step too
    assert scheduler.waiting[0].request_id == "background"


def test_under_fcfs_the_newest_running_request_is_preempted() -> None:
    scheduler = Scheduler(COST, max_num_seqs=8, policy=Policy.FCFS, kv_tokens=12 * 16)
    scheduler.add(SimRequest("background", 64, 40, priority=2))
    scheduler.add(SimRequest("user", 64, 40, priority=0))
    preempted: set[str] = set()
    while not scheduler.idle:
        preempted |= set(scheduler.step().preempted)
    assert preempted == {"user"}  # priority means nothing to FCFS: the newer goes


def test_an_aborted_request_frees_its_blocks_at_once() -> None:
    scheduler = Scheduler(COST, max_num_seqs=8)
    scheduler.add(SimRequest("a", 1000, 100))
    scheduler.step()
    assert scheduler.free_blocks < scheduler.kv_blocks
    scheduler.abort("a")
    assert scheduler.idle
    assert scheduler.free_blocks == scheduler.kv_blocks


FAST = dataclasses.replace(COST, step_ms=1.0, knee_step_ms=1.0, kv_tokens=4096)


def test_the_engine_steps_hand_each_request_its_tokens_and_an_abort_frees_its_blocks() -> None:
    async def scenario() -> None:
        steps = GpuSteps(FAST, max_num_seqs=4, policy=Policy.PRIORITY)

        async def take(prompt: int, count: int) -> int:
            return len([None async for _ in steps.generate(prompt, count, 0)])

        assert await asyncio.gather(take(10, 5), take(300, 3)) == [5, 3]
        left = steps.generate(100, 1000, 2)
        await anext(left)
        assert steps.busy
        await left.aclose()  # as a replica's generator closes when its caller goes
        assert not steps.busy
        with pytest.raises(PromptTooLong):
            await anext(steps.generate(4000, 200, 0))

    asyncio.run(scenario())


class _Broken(GpuCost):
    def step_s(self, sequences: int, context_tokens: int, prefill_tokens: int) -> float:
        raise ArithmeticError("a cost that cannot be worked out")


def test_a_failed_step_loop_fails_every_request_instead_of_leaving_it_waiting() -> None:
    broken = _Broken(**dataclasses.asdict(FAST))

    async def scenario() -> None:
        steps = GpuSteps(broken, max_num_seqs=4, policy=Policy.FCFS)
        with pytest.raises(RuntimeError, match="step loop failed"):
            await asyncio.wait_for(anext(steps.generate(10, 5, 0)), 5)

    asyncio.run(scenario())
