"""Load-driven replica counts: decisions on a clock the test holds."""

from __future__ import annotations

from dataclasses import replace

from policy.load_scaling import (
    SLEEP_NOTICE_MAX_S,
    LoadReport,
    LoadScalingPolicy,
    ScalingTimers,
    decide_replicas,
    sum_reports,
)

POLICY = LoadScalingPolicy(
    min_replicas=1,
    max_replicas=4,
    per_replica_cap=4,
    target_queue_per_replica=2,
    kv_high=0.85,
    upscale_delay_s=10,
    downscale_delay_s=60,
)


def load(
    waiting: int, running: int, kv: float | None = None, at: float = 0, asleep: bool = False
) -> LoadReport:
    return LoadReport(at=at, waiting=waiting, running=running, kv_usage=kv, asleep=asleep)


def test_a_queue_past_the_target_scales_up_only_after_the_delay_without_a_break() -> None:
    first = decide_replicas(POLICY, 1, load(5, 4), ScalingTimers(), now=100)
    assert first.replicas == 1
    assert first.timers.up_since == 100
    early = decide_replicas(POLICY, 1, load(5, 4), first.timers, now=109)
    assert early.replicas == 1
    due = decide_replicas(POLICY, 1, load(5, 4), early.timers, now=110)
    assert due.replicas == 2
    assert due.direction == "up"
    assert "5 waiting" in due.reason
    assert due.timers == ScalingTimers()  # the next step waits its own delay


def test_a_break_in_the_queue_restarts_the_upscale_delay() -> None:
    first = decide_replicas(POLICY, 1, load(5, 4), ScalingTimers(), now=100)
    calm = decide_replicas(POLICY, 1, load(1, 4), first.timers, now=105)
    assert calm.timers.up_since is None
    again = decide_replicas(POLICY, 1, load(5, 4), calm.timers, now=111)
    assert again.replicas == 1
    assert again.timers.up_since == 111


def test_a_burst_gets_the_replicas_for_its_excess_in_one_step_within_the_maximum() -> None:
    # 2 replicas, 20 waiting: 16 past the target of 2 each, 4 more replicas' worth; max is 4.
    policy = LoadScalingPolicy(**{**POLICY.__dict__, "upscale_delay_s": 0})
    decision = decide_replicas(policy, 2, load(20, 8), ScalingTimers(), now=0)
    assert decision.replicas == 4
    at_max = decide_replicas(policy, 4, load(50, 16), ScalingTimers(), now=0)
    assert at_max.replicas == 4
    assert at_max.reason == ""


def test_kv_pressure_with_requests_waiting_scales_up_even_under_the_queue_target() -> None:
    policy = LoadScalingPolicy(**{**POLICY.__dict__, "upscale_delay_s": 0})
    pressed = decide_replicas(policy, 1, load(1, 4, kv=0.9), ScalingTimers(), now=0)
    assert pressed.replicas == 2
    assert "KV cache 90%" in pressed.reason
    # Full cache but nobody waiting: the replicas keep up; no new one.
    idle_queue = decide_replicas(policy, 1, load(0, 4, kv=0.95), ScalingTimers(), now=0)
    assert idle_queue.replicas == 1


def test_down_by_one_when_the_load_fits_on_fewer_for_the_whole_delay() -> None:
    first = decide_replicas(POLICY, 3, load(0, 3), ScalingTimers(), now=0)
    assert first.replicas == 3
    assert first.timers.down_since == 0
    due = decide_replicas(POLICY, 3, load(0, 3), first.timers, now=60)
    assert due.replicas == 2
    assert due.direction == "down"
    # 3 running do not fit half of one replica's 4 slots: 2 stays.
    held = decide_replicas(POLICY, 2, load(0, 3), ScalingTimers(down_since=0), now=600)
    assert held.replicas == 2
    assert held.timers.down_since is None


def test_never_below_the_minimum_and_a_waiting_request_blocks_the_way_down() -> None:
    assert (
        decide_replicas(POLICY, 1, load(0, 0), ScalingTimers(down_since=0), now=999).replicas == 1
    )
    waiting = decide_replicas(POLICY, 2, load(1, 0), ScalingTimers(down_since=0), now=999)
    assert waiting.replicas == 2


def test_counts_outside_the_bounds_are_brought_inside_at_once() -> None:
    assert decide_replicas(POLICY, 6, load(0, 0), ScalingTimers(), now=0).replicas == 4
    assert decide_replicas(POLICY, 0, None, ScalingTimers(), now=0).replicas == 1


def test_no_fresh_report_holds_the_count_and_forgets_the_timers() -> None:
    decision = decide_replicas(POLICY, 2, None, ScalingTimers(up_since=1), now=50)
    assert decision.replicas == 2
    assert decision.timers == ScalingTimers()


def test_reports_sum_over_fresh_routers_and_take_the_highest_kv_usage() -> None:
    reports = [load(3, 2, kv=0.5, at=95), load(1, 4, kv=0.7, at=99), load(9, 9, kv=1.0, at=80)]
    total = sum_reports(reports, now=100, stale_after_s=10)
    assert total is not None
    assert (total.waiting, total.running, total.kv_usage) == (4, 6, 0.7)
    assert sum_reports(reports, now=200, stale_after_s=10) is None


SLEEPY = replace(POLICY, scale_to_zero_after_s=300)


def test_an_idle_backend_sleeps_at_zero_after_its_idle_time_and_not_before() -> None:
    first = decide_replicas(SLEEPY, 1, load(0, 0), ScalingTimers(), now=100)
    assert (first.replicas, first.timers.idle_since) == (1, 100)
    early = decide_replicas(SLEEPY, 1, load(0, 0), first.timers, now=399)
    assert early.replicas == 1
    due = decide_replicas(SLEEPY, 1, load(0, 0), early.timers, now=400)
    # Announced with the replica still up: the routers must stop sending to it first.
    assert (due.replicas, due.direction) == (1, "sleep")
    assert "idle for 300s" in due.reason
    unheard = decide_replicas(SLEEPY, 1, load(0, 0, at=400), due.timers, now=401)
    assert (unheard.replicas, unheard.reason) == (1, "")
    held = decide_replicas(SLEEPY, 1, load(0, 0, at=401, asleep=True), unheard.timers, now=402)
    # Zero once every router holds it asleep; nothing new for the routers to hear.
    assert (held.replicas, held.reason, held.timers) == (0, "", ScalingTimers())


def test_a_request_during_the_sleeps_notice_calls_it_off() -> None:
    due = decide_replicas(SLEEPY, 2, load(0, 0), ScalingTimers(idle_since=0), now=300)
    assert (due.replicas, due.direction) == (2, "sleep")
    called_off = decide_replicas(SLEEPY, 2, load(1, 0, asleep=True), due.timers, now=301)
    assert (called_off.replicas, called_off.direction) == (2, "wake")
    assert called_off.reason == "wake: 1 waiting, 0 running (the sleep called off)"
    # Idleness is counted again from scratch.
    after = decide_replicas(SLEEPY, 2, load(0, 0), called_off.timers, now=302)
    assert (after.replicas, after.timers.idle_since) == (2, 302)


def test_routers_silent_through_the_notice_are_not_waited_for() -> None:
    due = decide_replicas(SLEEPY, 1, load(0, 0), ScalingTimers(idle_since=0), now=300)
    silent = decide_replicas(SLEEPY, 1, None, due.timers, now=300 + SLEEP_NOTICE_MAX_S - 1)
    assert silent.replicas == 1  # no report: the notice holds (it is not forgotten)
    late = decide_replicas(SLEEPY, 1, None, silent.timers, now=300 + SLEEP_NOTICE_MAX_S)
    assert late.replicas == 0


def test_the_routers_reports_are_asleep_only_when_every_fresh_one_is() -> None:
    reports = [load(0, 0, at=100, asleep=True), load(0, 0, at=95, asleep=False)]
    summed = sum_reports(reports, now=100, stale_after_s=10)
    assert summed is not None
    assert not summed.asleep
    summed = sum_reports(reports, now=106, stale_after_s=10)  # the second one is stale
    assert summed is not None
    assert summed.asleep


def test_one_request_restarts_the_idle_time() -> None:
    idle = decide_replicas(SLEEPY, 1, load(0, 0), ScalingTimers(), now=100)
    busy = decide_replicas(SLEEPY, 1, load(0, 1), idle.timers, now=350)
    assert busy.timers.idle_since is None
    again = decide_replicas(SLEEPY, 1, load(0, 0), busy.timers, now=360)
    late = decide_replicas(SLEEPY, 1, load(0, 0), again.timers, now=659)
    assert late.replicas == 1  # 299 s since the last request, not 559


def test_idle_time_runs_on_through_steps_down_and_sleeps_from_any_count() -> None:
    timers = ScalingTimers()
    replicas = 3
    steps = []
    for now in range(0, 301, 10):
        decision = decide_replicas(SLEEPY, replicas, load(0, 0), timers, now=now)
        if decision.direction:
            steps.append((now, decision.direction, decision.replicas))
        replicas, timers = decision.replicas, decision.timers
    # Down a step each 60 s, then asleep at 300 s of idleness, not 300 s after the last step.
    assert steps == [(60, "down", 2), (130, "down", 1), (300, "sleep", 1)]


def test_a_request_sent_just_before_the_sleep_wakes_it_too() -> None:
    woken = decide_replicas(SLEEPY, 0, load(0, 1), ScalingTimers(), now=100)
    assert (woken.replicas, woken.direction) == (1, "wake")
    assert woken.reason == "wake: 0 waiting, 1 sent"


def test_idleness_is_not_counted_while_a_replica_starts() -> None:
    # Woken, its request went elsewhere (next_link) or timed out: nothing waits, nothing runs.
    starting = decide_replicas(SLEEPY, 1, load(0, 0), ScalingTimers(), now=100, starting=True)
    assert starting.timers.idle_since is None
    late = decide_replicas(SLEEPY, 1, load(0, 0), starting.timers, now=1000, starting=True)
    assert late.replicas == 1
    running = decide_replicas(SLEEPY, 1, load(0, 0), late.timers, now=1001)
    assert running.timers.idle_since == 1001  # counted from when it runs


def test_asleep_it_stays_at_zero_until_a_request_waits_then_wakes_at_once() -> None:
    quiet = decide_replicas(SLEEPY, 0, load(0, 0), ScalingTimers(), now=100)
    assert quiet.replicas == 0  # not bounded up to min_replicas
    assert decide_replicas(SLEEPY, 0, None, ScalingTimers(), now=100).replicas == 0
    woken = decide_replicas(SLEEPY, 0, load(1, 0), ScalingTimers(), now=101)
    # No upscale delay: the request is already waiting for it.
    assert (woken.replicas, woken.direction) == (1, "wake")
    assert woken.reason == "wake: 1 waiting"


def test_without_scale_to_zero_zero_is_bounded_up_and_idleness_changes_nothing() -> None:
    assert decide_replicas(POLICY, 0, load(0, 0), ScalingTimers(), now=0).replicas == 1
    decision = decide_replicas(POLICY, 1, load(0, 0), ScalingTimers(), now=0)
    late = decide_replicas(POLICY, 1, load(0, 0), decision.timers, now=100_000)
    assert late.replicas == 1
