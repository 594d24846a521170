"""Which running requests a higher-class arrival pauses, and when a lower class waits."""

from __future__ import annotations

from dataclasses import replace

from core.types import PriorityClass
from policy.admission import AdmissionQueue
from policy.preemption import (
    PreemptRules,
    RouterWork,
    RunningView,
    holds,
    pausable_by_class,
    shared_pauses,
    still_pausing,
    to_pause,
)

USER, AGENT, BACKGROUND = PriorityClass.USER, PriorityClass.AGENT, PriorityClass.BACKGROUND
RULES = PreemptRules(
    above_running=2,
    above_kv=None,
    may_pause={USER: 4, AGENT: 2},
    max_pauses=2,
    protect_last_tokens=16,
)


def running(
    ticket: int,
    priority: PriorityClass,
    started: float,
    *,
    pauses: int = 0,
    tokens_left: int | None = 100,
    pausable: bool = True,
) -> RunningView:
    return RunningView(ticket, priority, started, pauses, tokens_left, pausable)


def test_a_user_pauses_the_youngest_of_the_lowest_class_down_to_the_batch_size() -> None:
    batch = [
        running(1, BACKGROUND, 1.0),
        running(2, AGENT, 5.0),
        running(3, BACKGROUND, 3.0),
        running(4, BACKGROUND, 2.0),
        running(9, USER, 6.0),  # the arrival
    ]
    # Five running, two allowed: three paused, background before agent, youngest first.
    assert to_pause(batch, USER, RULES) == [3, 4, 1]


def test_nobody_is_paused_while_the_batch_is_within_its_size() -> None:
    assert to_pause([running(1, BACKGROUND, 1.0), running(9, USER, 2.0)], USER, RULES) == []


def test_only_lower_classes_are_paused_and_the_lowest_class_pauses_nobody() -> None:
    batch = [running(1, USER, 1.0), running(2, AGENT, 2.0), running(9, AGENT, 3.0)]
    assert to_pause(batch, AGENT, RULES) == []  # the other agent is not lower
    batch = [running(1, BACKGROUND, 1.0), running(2, BACKGROUND, 2.0), running(9, BACKGROUND, 3)]
    assert to_pause(batch, BACKGROUND, RULES) == []


def test_an_arrival_pauses_at_most_its_class_allowance() -> None:
    batch = [running(t, BACKGROUND, float(t)) for t in range(1, 7)] + [running(9, AGENT, 9.0)]
    assert to_pause(batch, AGENT, RULES) == [6, 5]  # five over, agent may pause two


def test_the_often_paused_the_nearly_done_and_the_uncontinuable_are_spared() -> None:
    batch = [
        running(1, BACKGROUND, 1.0, pauses=2),  # paused max_pauses times already
        running(2, BACKGROUND, 2.0, tokens_left=16),  # within protect_last_tokens
        running(3, BACKGROUND, 3.0, pausable=False),  # tool calls, n > 1
        running(4, BACKGROUND, 0.5, tokens_left=None),  # unknown: may be paused
        running(9, USER, 4.0),
    ]
    assert to_pause(batch, USER, RULES) == [4]


def test_a_high_kv_cache_pauses_one_even_within_the_batch_size() -> None:
    rules = PreemptRules(2, 0.8, {USER: 4}, 2, 16)
    batch = [running(1, BACKGROUND, 1.0), running(9, USER, 2.0)]
    assert to_pause(batch, USER, rules, kv_usage=0.9) == [1]
    assert to_pause(batch, USER, rules, kv_usage=0.7) == []
    assert to_pause(batch, USER, rules, kv_usage=None) == []  # no reading: the batch decides


def test_a_lower_class_waits_while_a_higher_one_runs_in_a_full_batch() -> None:
    assert holds(BACKGROUND, {USER: 1, BACKGROUND: 1}, RULES)
    assert holds(AGENT, {USER: 2}, RULES)
    assert not holds(BACKGROUND, {USER: 1}, RULES)  # the batch has room
    assert not holds(BACKGROUND, {BACKGROUND: 5}, RULES)  # no higher class runs
    assert not holds(USER, {USER: 1, BACKGROUND: 4}, RULES)  # nothing is higher than a user


def preempting_queue(cap: int = 8) -> AdmissionQueue:
    return AdmissionQueue(cap=cap, max_queue=10, aging_s=10.0, shares={}, preempt=RULES)


def test_a_lower_class_waits_for_the_higher_class_to_leave_a_full_batch() -> None:
    q = preempting_queue()
    assert q.arrive(1, USER, 0).admitted
    assert q.arrive(2, BACKGROUND, 0).admitted  # a batch of two: its size
    assert not q.arrive(3, BACKGROUND, 1).admitted  # a user runs and the batch is full
    assert q.arrive(4, USER, 1).admitted  # users never wait for the batch size, only the cap
    assert q.release(2, ticket=4) == []  # one user still runs
    assert q.release(3, ticket=1) == [3]  # no user left: background runs again
    assert q.running_by_class() == {USER: 0, AGENT: 0, BACKGROUND: 2}


def test_a_paused_request_waits_at_the_head_of_its_class_and_ages_from_its_pause() -> None:
    q = preempting_queue()
    q.arrive(1, USER, 0)
    q.arrive(2, USER, 0)
    assert not q.arrive(3, BACKGROUND, 58).admitted  # arrived at 58, never ran
    # Paused at 60 after running since 5: back in the queue with its place of 5.
    assert not q.arrive(4, BACKGROUND, 60, since=5).admitted
    assert q.release(61, ticket=1) == [4]  # room for one beside the user: the paused one
    assert q.release(62, ticket=2) == [3]
    # Its age counts from its pause at 60, not from 5: running is not waiting.
    q2 = preempting_queue()
    q2.arrive(1, USER, 0)
    q2.arrive(2, USER, 0)
    assert not q2.arrive(3, BACKGROUND, 60, since=5).admitted
    assert q2.arrive(4, USER, 69).granted == ()  # 9 s waited: still background, still held
    assert q2.release(81, ticket=4) == [3]  # 21 s waited: aged to the user class


def test_a_high_kv_cache_holds_a_lower_class_as_it_paused_it() -> None:
    rules = PreemptRules(2, 0.8, {USER: 4}, 2, 16)
    assert holds(BACKGROUND, {USER: 1}, rules, kv_usage=0.9)  # batch has room, the KV does not
    assert not holds(BACKGROUND, {USER: 1}, rules, kv_usage=0.7)
    assert not holds(BACKGROUND, {BACKGROUND: 1}, rules, kv_usage=0.9)  # no higher class runs


def test_a_pause_still_happens_only_if_the_paused_one_would_be_held() -> None:
    paused = running(1, BACKGROUND, 1.0)
    assert still_pausing(paused, {USER: 2, BACKGROUND: 1}, RULES)  # the users still run
    assert not still_pausing(paused, {USER: 1, BACKGROUND: 1}, RULES)  # one left: room for it
    assert not still_pausing(paused, {BACKGROUND: 1}, RULES)  # the users have gone
    assert not still_pausing(paused, {USER: 2, BACKGROUND: 1}, replace(RULES, above_running=3))


def work(running: dict[PriorityClass, int], pausable: dict[PriorityClass, int] | None = None,
         pausing: int = 0) -> RouterWork:  # fmt: skip
    return RouterWork(running, running if pausable is None else pausable, pausing)


def test_a_user_at_one_router_has_the_others_pause_their_lower_classes_one_at_a_time() -> None:
    books = {
        "a": work({USER: 1}),
        "b": work({BACKGROUND: 2, AGENT: 1}),
        "c": work({BACKGROUND: 1}),
    }
    # Five running, two allowed: three paused, background before agent, spread over b and c.
    assert shared_pauses(books, RULES) == {"b": (USER, 2), "c": (USER, 1)}


def test_what_is_already_pausing_leaves_the_batch_and_is_not_paused_again() -> None:
    books = {"a": work({USER: 1}), "b": work({BACKGROUND: 3}, pausing=1)}
    assert shared_pauses(books, RULES) == {"b": (USER, 1)}  # 4 - 1 pausing - 2 allowed
    books = {"a": work({USER: 1}), "b": work({BACKGROUND: 2}, pausing=1)}
    assert shared_pauses(books, RULES) == {}


def test_a_router_pauses_nothing_for_its_own_higher_classes_or_for_a_class_that_may_not() -> None:
    # Its own user's arrival paused what it had to (to_pause): nobody else runs a higher class.
    assert shared_pauses({"a": work({USER: 1, BACKGROUND: 3}), "b": work({})}, RULES) == {}
    # Background pauses nobody (may_pause names users and agents only).
    books = {"a": work({BACKGROUND: 1}), "b": work({BACKGROUND: 3})}
    assert shared_pauses(books, RULES) == {}
    # Only what may be paused (not asked twice already, not near its end, continuable).
    books = {"a": work({AGENT: 1}), "b": work({BACKGROUND: 3}, pausable={BACKGROUND: 1})}
    assert shared_pauses(books, RULES) == {"b": (AGENT, 1)}


def test_the_batch_an_arrival_weighs_counts_what_other_routers_run() -> None:
    batch = [running(1, BACKGROUND, 1.0), running(9, USER, 2.0)]
    assert to_pause(batch, USER, RULES) == []  # two here: the batch size
    assert to_pause(batch, USER, RULES, elsewhere=1) == [1]  # and one at another router


def test_a_lower_class_waits_while_a_higher_one_runs_at_another_router() -> None:
    q = preempting_queue()
    assert q.seen_elsewhere({USER: 1, BACKGROUND: 1}, now=0) == []
    assert q.arrive(1, BACKGROUND, 0).admitted is False  # the backend's batch is full
    assert q.arrive(2, USER, 0).admitted  # users never wait for it
    assert q.running_everywhere() == {USER: 2, AGENT: 0, BACKGROUND: 1}
    assert q.release(1, ticket=2) == []  # the other router's user still runs
    assert q.seen_elsewhere({BACKGROUND: 1}, now=2) == [1]  # it ended: background goes


def test_pausable_by_class_counts_what_some_higher_class_may_pause() -> None:
    views = [
        running(1, BACKGROUND, 1.0),
        running(2, BACKGROUND, 2.0, pauses=2),  # paused max_pauses times
        running(3, AGENT, 3.0, tokens_left=10),  # within protect_last_tokens of its end
        running(4, AGENT, 4.0, pausable=False),  # a tool call: cannot go on as text
        running(5, USER, 5.0),
    ]
    assert pausable_by_class(views, RULES) == {USER: 1, AGENT: 0, BACKGROUND: 1}


def test_aging_lifts_a_waiter_past_a_full_batch_but_not_past_its_share() -> None:
    q = AdmissionQueue(cap=4, max_queue=10, aging_s=10.0, shares={BACKGROUND: 0.5}, preempt=RULES)
    q.arrive(1, USER, 0)
    assert q.arrive(2, BACKGROUND, 0).admitted  # a batch of two: its size
    assert not q.arrive(3, BACKGROUND, 0).admitted  # held by the user in a full batch
    assert not q.arrive(4, BACKGROUND, 0).admitted
    assert q.release(5, ticket=2) == [3]  # room in background's two; the batch is at its size
    assert q.release(25, ticket=3) == [4]  # aged past the user's class: the full batch holds
    # it no longer; background's share of two still does (ticket 5 waits for a background end).
    assert not q.arrive(5, BACKGROUND, 25).admitted
    assert q.arrive(6, USER, 26).admitted  # the slot background's share left to users
    assert q.running_by_class() == {USER: 2, AGENT: 0, BACKGROUND: 1}


def test_a_held_down_background_waiter_gets_through_by_aging_past_the_hold_down() -> None:
    q = AdmissionQueue(cap=4, max_queue=10, aging_s=10.0, shares={}, preempt=HOLD_DOWN)
    q.arrive(1, USER, 0)
    q.arrive(2, USER, 0)
    assert not q.arrive(3, BACKGROUND, 0).admitted  # users run in a full batch
    users = [1, 2]
    for t in range(1, 20):  # a user ends and another starts every second: always held down
        assert q.release(t, ticket=users.pop(0)) == []
        assert q.arrive(100 + t, USER, t).admitted
        users.append(100 + t)
    assert q.release(20, ticket=users.pop(0)) == [3]  # aged two steps: a user's, no hold-down
    assert q.running_by_class()[BACKGROUND] == 1


def test_the_others_pause_no_more_than_the_running_higher_classes_may() -> None:
    rules = replace(RULES, above_running=1, may_pause={USER: 1})
    books = {"a": work({USER: 1}), "b": work({BACKGROUND: 4})}
    assert shared_pauses(books, rules) == {"b": (USER, 1)}  # four over, one user may pause one
    books = {"a": work({USER: 2}), "b": work({BACKGROUND: 4})}
    assert shared_pauses(books, rules) == {"b": (USER, 2)}


HOLD_DOWN = replace(RULES, resume_after_s=0.5)


def test_a_hold_down_keeps_a_lower_class_waiting_a_while_after_a_higher_one_ended() -> None:
    nobody: dict[PriorityClass, int] = {}
    assert holds(BACKGROUND, nobody, HOLD_DOWN, held_down=True)
    assert not holds(BACKGROUND, nobody, HOLD_DOWN)


def test_the_queue_lets_a_held_down_class_go_once_no_higher_class_ended_for_that_long() -> None:
    q = AdmissionQueue(cap=4, max_queue=10, aging_s=10.0, shares={}, preempt=HOLD_DOWN)
    assert q.arrive(1, USER, 0).admitted
    assert q.arrive(2, BACKGROUND, 0).admitted  # a batch of two: its size
    assert not q.arrive(3, BACKGROUND, 1).admitted  # a user runs and the batch is full
    assert q.release(2, ticket=1) == []  # the user ended at 2: held down until 2.5
    assert q.held_until() == 2.5
    assert not q.arrive(4, BACKGROUND, 2.2).admitted
    assert q.admit_due(2.4) == []
    assert q.admit_due(2.5) == [3, 4]
    assert q.held_until() is None  # nobody waits
    assert q.arrive(5, AGENT, 2.6).admitted  # agents are held down by users only
    # Off by default: the same story admits at once.
    q = preempting_queue()
    q.arrive(1, USER, 0)
    q.arrive(2, BACKGROUND, 0)
    assert not q.arrive(3, BACKGROUND, 1).admitted
    assert q.release(2, ticket=1) == [3]
    assert q.held_until() is None


def test_the_hold_down_ends_exactly_when_held_until_says() -> None:
    # The same sum both ways: 0.1 + 0.7 - 0.1 is 0.6999999999999998, under 0.7.
    q = AdmissionQueue(cap=4, max_queue=10, aging_s=10.0, shares={},
                       preempt=replace(RULES, above_running=1, resume_after_s=0.7))  # fmt: skip
    q.arrive(1, USER, 0)
    assert not q.arrive(2, BACKGROUND, 0).admitted
    q.release(0.1, ticket=1)
    due = q.held_until()
    assert due is not None
    assert q.admit_due(due) == [2]
