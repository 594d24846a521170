"""The capacity command's edge search and recommendation, against predicates with a known edge."""

from __future__ import annotations

import pytest

from policy.capacity_search import EdgeSearch, with_margin


def run(search: EdgeSearch, edge: int | None) -> tuple[int | None, list[int]]:
    """Drive the search against 'passes up to `edge`'; the sizes it tried, in order."""
    tried = []
    while (size := search.next()) is not None:
        tried.append(size)
        search.record(size, edge is not None and size <= edge)
    return search.best, tried


@pytest.mark.parametrize("edge", [1, 2, 7, 500, 999, 1000])
def test_the_search_finds_the_edge_within_its_probe_budget(edge: int) -> None:
    search = EdgeSearch(low=1, high=1000)
    best, tried = run(search, edge)
    assert best == edge
    assert len(tried) <= search.max_probes
    assert len(set(tried)) == len(tried)  # no size runs twice


def test_the_upper_bound_is_tried_first_and_one_pass_ends_the_search() -> None:
    best, tried = run(EdgeSearch(low=9, high=4096), edge=5000)
    assert (best, tried) == (4096, [4096])


def test_nothing_passing_gives_none() -> None:
    best, tried = run(EdgeSearch(low=1, high=64), edge=None)
    assert best is None
    assert tried[0] == 64
    assert tried[-1] == 1


def test_a_bad_range_is_refused() -> None:
    with pytest.raises(ValueError, match="bad range"):
        EdgeSearch(low=10, high=5)


def test_the_margin_takes_a_share_and_keeps_a_floor() -> None:
    assert with_margin(46592, 0.8) == 37273
    assert with_margin(5, 0.8) == 4
    assert with_margin(1, 0.8) == 1
    assert with_margin(100, 0.8, floor=256) == 256
