"""The headers that say how an answer was routed."""

from __future__ import annotations

from dataclasses import replace

from core.types import PriorityClass
from core.wire import Routed
from deployments.ingress.answers import routing_headers

ROUTED = Routed("coding@local", 64, 9, False, 0, False, False, failovers=1)


def test_a_whole_answer_that_was_paused_says_how_often() -> None:
    headers = routing_headers(replace(ROUTED, pauses=2), PriorityClass.BACKGROUND, None)
    assert headers["X-Pauses"] == "2"
    assert (headers["X-Backend"], headers["X-Failovers"]) == ("coding@local", "1")


def test_an_answer_never_paused_has_no_pauses_header() -> None:
    assert "X-Pauses" not in routing_headers(ROUTED, PriorityClass.USER, None)
