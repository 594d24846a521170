"""Per-key limits as pure decisions: windows, leases, budgets, headers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from policy.key_limits import (
    SPARE_HOLD_S,
    KeyLimits,
    KeyMeter,
    period_bounds,
    reset_text,
    spare_headers,
    spare_lease,
)

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC).timestamp()  # a Tuesday


def admit(meter: KeyMeter, limits: KeyLimits, now: float, lease: str = "l") -> bool:
    return meter.admit(limits, now, lease, lease_s=600).admitted


def test_sixth_request_in_a_minute_is_refused_with_when_to_retry() -> None:
    meter, limits = KeyMeter(), KeyLimits(rpm=5)
    assert all(admit(meter, limits, T0 + i, f"l{i}") for i in range(5))
    verdict = meter.admit(limits, T0 + 10, "l6", 600)
    assert not verdict.admitted
    assert verdict.code == "rate_limited"
    assert verdict.retry_after_s == 50  # the first request leaves the window at T0 + 60
    assert verdict.headers["x-ratelimit-remaining-requests"] == "0"
    assert verdict.headers["x-ratelimit-limit-requests"] == "5"
    assert admit(meter, limits, T0 + 60.5, "l7")  # the first one aged out


def test_remaining_requests_count_down_and_reset_says_when_the_window_is_empty() -> None:
    meter, limits = KeyMeter(), KeyLimits(rpm=3)
    first = meter.admit(limits, T0, "a", 600)
    second = meter.admit(limits, T0 + 15, "b", 600)
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    assert second.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-reset-requests"] == "1m0s"


def test_one_long_answer_crosses_the_tpm_and_the_next_request_is_refused() -> None:
    meter, limits = KeyMeter(), KeyLimits(tpm=100)
    assert admit(meter, limits, T0, "a")
    meter.settle("a", T0 + 1, prompt_tokens=20, completion_tokens=200, period="month")
    verdict = meter.admit(limits, T0 + 2, "b", 600)
    assert not verdict.admitted
    assert verdict.code == "rate_limited"
    assert "tokens per minute" in (verdict.message or "")
    assert verdict.retry_after_s == 59  # the 220 tokens leave the window at T0 + 61
    assert verdict.headers["x-ratelimit-remaining-tokens"] == "0"
    assert admit(meter, limits, T0 + 61.5, "c")


def test_tpm_frees_when_enough_of_the_window_aged_out() -> None:
    meter, limits = KeyMeter(), KeyLimits(tpm=100)
    for i, used in enumerate((60, 30, 30)):
        assert admit(meter, limits, T0 + i * 10, f"l{i}")
        meter.settle(f"l{i}", T0 + i * 10, used, 0, "month")
    verdict = meter.admit(limits, T0 + 25, "x", 600)
    assert not verdict.admitted
    assert verdict.retry_after_s == 35  # the 60 at T0 leaves at T0 + 60: 60 left < 100


def test_max_parallel_counts_leases_until_settled() -> None:
    meter, limits = KeyMeter(), KeyLimits(max_parallel=2)
    assert admit(meter, limits, T0, "a")
    assert admit(meter, limits, T0, "b")
    refused = meter.admit(limits, T0, "c", 600)
    assert not refused.admitted
    assert "max_parallel 2" in (refused.message or "")
    meter.settle("a", T0 + 1, 1, 1, "month")
    assert admit(meter, limits, T0 + 1, "c")


def test_a_lease_never_settled_expires_so_parallel_slots_do_not_leak() -> None:
    meter, limits = KeyMeter(), KeyLimits(max_parallel=1)
    assert meter.admit(limits, T0, "lost", lease_s=30).admitted
    assert not admit(meter, limits, T0 + 29)
    assert admit(meter, limits, T0 + 31)


def test_budget_refuses_until_the_next_period() -> None:
    meter, limits = KeyMeter(), KeyLimits(budget_tokens=1000, budget_period="day")
    assert admit(meter, limits, T0, "a")
    meter.settle("a", T0, 400, 700, "day")
    verdict = meter.admit(limits, T0 + 3600, "b", 600)
    assert not verdict.admitted
    assert verdict.code == "budget_exceeded"
    assert verdict.retry_after_s == 11 * 3600  # 13:00 to midnight UTC
    assert verdict.headers["x-budget-remaining-tokens"] == "0"
    assert admit(meter, limits, T0 + 12 * 3600 + 1, "c")  # the next day


def test_refusals_are_counted_and_do_not_use_the_window() -> None:
    meter, limits = KeyMeter(), KeyLimits(rpm=1)
    assert admit(meter, limits, T0)
    for _ in range(3):
        assert not admit(meter, limits, T0 + 1)
    usage = meter.usage(limits, T0 + 2)
    assert usage["requests"] == 1
    assert usage["refused"] == 3
    assert admit(meter, limits, T0 + 61)  # refusals did not extend the window


def test_usage_totals_prompt_and_completion() -> None:
    meter, limits = KeyMeter(), KeyLimits()
    assert admit(meter, limits, T0, "a")
    meter.settle("a", T0 + 1, 11, 7, "month")
    usage = meter.usage(limits, T0 + 2)
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        11,
        7,
        18,
    )
    assert usage["last_minute"] == {"requests": 1, "tokens": 18}
    assert usage["in_flight"] == 0
    assert usage["period"]["tokens"] == 18


def test_no_limits_no_headers_and_always_admitted() -> None:
    meter, limits = KeyMeter(), KeyLimits()
    assert not limits.any
    verdict = meter.admit(limits, T0, "a", 600)
    assert verdict.admitted
    assert verdict.headers == {}


@pytest.mark.parametrize(
    ("period", "start", "end"),
    [
        ("day", datetime(2026, 11, 24, tzinfo=UTC), datetime(2026, 11, 25, tzinfo=UTC)),
        ("week", datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)),
        ("month", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
    ],
)
def test_periods_are_utc_calendar_periods(period: str, start: datetime, end: datetime) -> None:
    assert period_bounds(T0, period) == (start.timestamp(), end.timestamp())  # type: ignore[arg-type]


def test_december_rolls_into_january() -> None:
    dec = datetime(2026, 12, 31, 23, 0, tzinfo=UTC).timestamp()
    assert period_bounds(dec, "month")[1] == datetime(2027, 1, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.12, "120ms"), (1, "1s"), (59.2, "1m0s"), (360, "6m0s"), (3723, "1h2m3s")],
)
def test_reset_text_follows_openai(seconds: float, text: str) -> None:
    assert reset_text(seconds) == text


def test_a_request_never_admitted_is_counted_when_settled() -> None:
    meter, limits = KeyMeter(), KeyLimits()
    meter.settle("l", T0, 5, 6, "month", admitted=False)
    usage = meter.usage(limits, T0 + 1)
    assert (usage["requests"], usage["total_tokens"], usage["in_flight"]) == (1, 11, 0)
    assert usage["last_minute"] == {"requests": 1, "tokens": 11}


def test_a_slot_is_released_at_once_only_near_the_parallel_limit() -> None:
    meter = KeyMeter()
    limits = KeyLimits(max_parallel=8)
    verdicts = [meter.admit(limits, T0, f"l{i}", 600) for i in range(8)]
    assert [v.parallel_left for v in verdicts] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert [v.release_at_once for v in verdicts] == [False] * 5 + [True] * 3
    assert KeyMeter().admit(KeyLimits(max_parallel=2), T0, "q", 600).release_at_once is True
    assert KeyMeter().admit(KeyLimits(rpm=5), T0, "r", 600).release_at_once is False


def test_far_from_its_limits_a_decision_grants_spares_counted_at_once() -> None:
    meter, limits = KeyMeter(), KeyLimits(rpm=1000, max_parallel=100)
    verdict = meter.admit(limits, T0, "a", 600, want=10)
    assert (verdict.admitted, verdict.granted, verdict.at) == (True, 10, T0)
    # Every spare is a request of the minute and a parallel slot until given back or taken.
    assert verdict.headers["x-ratelimit-remaining-requests"] == "990"
    assert verdict.parallel_left == 90
    usage = meter.usage(limits, T0)
    assert (usage["in_flight"], usage["spare"], usage["requests"]) == (1, 9, 1)


def test_spares_shrink_to_one_request_per_decision_near_a_limit() -> None:
    meter, limits = KeyMeter(), KeyLimits(rpm=20)
    granted = []
    for i in range(8):
        verdict = meter.admit(limits, T0, f"l{i}", 600, want=64)
        granted.append(verdict.granted if verdict.admitted else 0)
    # A quarter of what is left (20, 15, 12, 9, 7, ...), and exact below 8.
    assert granted == [5, 3, 3, 2, 1, 1, 1, 1]
    assert meter.usage(limits, T0)["last_minute"]["requests"] == 17
    last = [meter.admit(limits, T0, f"m{i}", 600, want=64) for i in range(4)]
    assert [v.granted if v.admitted else 0 for v in last] == [1, 1, 1, 0]  # never past 20


def test_a_spare_given_back_frees_its_request_and_its_slot() -> None:
    meter, limits = KeyMeter(), KeyLimits(rpm=100, max_parallel=40)
    verdict = meter.admit(limits, T0, "a", 600, want=4)
    assert verdict.granted == 4
    meter.give_back(spare_lease("a", 1), verdict.at)
    meter.give_back(spare_lease("a", 1), verdict.at)  # twice: nothing more is freed
    meter.take(spare_lease("a", 2), T0 + 1, 600)
    usage = meter.usage(limits, T0 + 1)
    assert (usage["in_flight"], usage["spare"], usage["requests"]) == (2, 1, 2)
    assert usage["last_minute"]["requests"] == 3
    meter.settle(spare_lease("a", 2), T0 + 2, 3, 4, "month")
    meter.settle(spare_lease("a", 3), T0 + 2, 1, 1, "month")  # its `taken` was lost
    usage = meter.usage(limits, T0 + 2)
    assert (usage["in_flight"], usage["spare"], usage["requests"]) == (1, 0, 3)
    assert usage["total_tokens"] == 9


def test_a_spare_whose_replica_died_expires_and_its_slot_is_free() -> None:
    meter, limits = KeyMeter(), KeyLimits(max_parallel=8)
    assert meter.admit(limits, T0, "a", 600, want=2).granted == 2
    meter.settle("a", T0 + 1, 1, 1, "month")
    assert meter.usage(limits, T0 + 1)["spare"] == 1
    assert meter.usage(limits, T0 + SPARE_HOLD_S + 1)["spare"] == 0
    taken = meter.admit(limits, T0, "b", 600, want=2)
    meter.take(spare_lease("b", 1), T0, 600)  # taken: it lasts as long as a request
    assert taken.granted == 2
    assert meter.usage(limits, T0 + SPARE_HOLD_S + 1)["in_flight"] == 2


def test_spare_headers_count_unused_spares_and_this_replicas_tokens() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "90",
        "x-ratelimit-remaining-tokens": "500",
        "x-budget-remaining-tokens": "40",
        "x-ratelimit-limit-requests": "100",
    }
    shown = spare_headers(headers, unused_spares=5, tokens_used=60)
    assert shown == {
        "x-ratelimit-remaining-requests": "95",
        "x-ratelimit-remaining-tokens": "440",
        "x-budget-remaining-tokens": "0",
        "x-ratelimit-limit-requests": "100",
    }


def test_a_refusal_while_spares_are_out_says_come_back_in_a_second() -> None:
    meter, limits = KeyMeter(), KeyLimits(rpm=8)
    assert meter.admit(limits, T0, "a", 600, want=8).granted == 2  # one spare, out there
    for i in range(6):
        assert admit(meter, limits, T0 + 1, f"b{i}")
    refused = meter.admit(limits, T0 + 2, "c", 600)
    assert not refused.admitted
    assert refused.retry_after_s == 1  # not the window's 58 s: the spare may come back
    meter.give_back(spare_lease("a", 1), T0)
    assert admit(meter, limits, T0 + 2, "d")
