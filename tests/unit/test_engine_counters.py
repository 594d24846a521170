"""A backend's engine counts summed from readings of one replica at a time
(policy/engine_counters.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policy.engine_counters import MAX_REPLICAS_KEPT, EngineCounters, ReplicaTally


def test_each_reading_adds_what_its_replica_counted_since_its_last() -> None:
    tally = ReplicaTally()
    assert tally.read("a", EngineCounters(2, 100, 40)) == EngineCounters(2, 100, 40)
    assert tally.read("b", EngineCounters(1, 10, 0)) == EngineCounters(1, 10, 0)
    assert tally.read("a", EngineCounters(2, 150, 90)) == EngineCounters(0, 50, 50)
    assert tally.total == EngineCounters(3, 160, 90)
    assert tally.total.prefix_hit_rate == 90 / 160


def test_a_replica_whose_counts_went_back_restarted_and_all_of_them_are_new() -> None:
    tally = ReplicaTally()
    tally.read("a", EngineCounters(5, 500, 100))
    assert tally.read("a", EngineCounters(1, 20, 10)) == EngineCounters(1, 20, 10)
    assert tally.total == EngineCounters(6, 520, 110)


def test_no_lookups_yet_is_no_hit_rate() -> None:
    assert EngineCounters().prefix_hit_rate is None


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 5), st.integers(0, 50)),
        max_size=40,
    )
)
def test_the_total_is_each_replicas_last_count_when_counts_only_grow(
    steps: list[tuple[str, int, int]],
) -> None:
    """Read in any order and as often as it comes, a growing count is counted exactly once."""
    tally = ReplicaTally()
    counts: dict[str, EngineCounters] = {}
    for replica, preempted, queried in steps:
        last = counts.get(replica, EngineCounters())
        counts[replica] = last + EngineCounters(preempted, queried, queried // 2)
        tally.read(replica, counts[replica])
    expected = sum(counts.values(), EngineCounters())
    assert tally.total == expected


def test_only_the_most_recently_read_replicas_are_remembered() -> None:
    tally = ReplicaTally()
    for n in range(MAX_REPLICAS_KEPT + 1):
        tally.read(f"r{n}", EngineCounters(1, 0, 0))
    # r0 was let go: read again, its count is taken as new (the price of bounded memory)
    assert tally.read("r0", EngineCounters(1, 0, 0)) == EngineCounters(1, 0, 0)
    assert tally.read(f"r{MAX_REPLICAS_KEPT}", EngineCounters(1, 0, 0)) == EngineCounters()
