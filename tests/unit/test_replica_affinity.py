"""A conversation's replica: the same in every router, moved only when its replica goes or is
busier than the rest by more than the slack (policy/replica_affinity.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policy.replica_affinity import keeps_session, session_ranking

REPLICAS = [f"replica-{n}" for n in range(5)]


@given(st.text(min_size=1, max_size=40), st.permutations(REPLICAS))
def test_every_router_ranks_a_sessions_replicas_the_same(session: str, order: list[str]) -> None:
    assert session_ranking(session, order) == session_ranking(session, REPLICAS)


@given(st.text(min_size=1, max_size=40), st.sampled_from(REPLICAS))
def test_a_replica_that_goes_moves_only_the_sessions_it_held(session: str, gone: str) -> None:
    home = session_ranking(session, REPLICAS)[0]
    left = [r for r in REPLICAS if r != gone]
    new_home = session_ranking(session, left)[0]
    if home != gone:
        assert new_home == home
    else:
        assert new_home == session_ranking(session, REPLICAS)[1]


def test_sessions_spread_over_the_replicas() -> None:
    homes = [session_ranking(f"conversation-{n}", REPLICAS)[0] for n in range(500)]
    counts = [homes.count(r) for r in REPLICAS]
    assert min(counts) > 500 / len(REPLICAS) / 2  # none starved, none taking all


@pytest.mark.parametrize(
    ("lengths", "kept"),
    [
        ({"a": 3, "b": 1}, True),  # two above the least loaded: within the slack
        ({"a": 4, "b": 1}, False),  # three above: the conversation moves
        ({"a": None, "b": 0}, True),  # not known: no worse than the rest
        ({"a": 5, "b": None}, True),  # the only known queue is its own
    ],
)
def test_a_session_stays_unless_its_replica_is_busier_than_the_slack(
    lengths: dict[str, int | None], kept: bool
) -> None:
    assert keeps_session("a", lengths, slack=2) is kept
