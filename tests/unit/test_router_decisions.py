"""The router's pure pieces: backend choice and the status it derives from Serve's facts."""

from __future__ import annotations

import json

import pytest

from deployments.router import (
    backend_state,
    first_deployed_link,
    overall_status,
    stream_error_event,
)

CHAIN = ("reasoning@cloud", "reasoning@local", "orchestrator@local", "cpu-fallback")


def test_first_deployed_link_skips_links_not_deployed() -> None:
    deployed = {"reasoning@local": object(), "orchestrator@local": object()}
    assert first_deployed_link(CHAIN, deployed) == "reasoning@local"


def test_no_deployed_link_gives_none() -> None:
    assert first_deployed_link(CHAIN, {"coding@local": object()}) is None


@pytest.mark.parametrize(
    ("status", "running", "state"),
    [
        ("HEALTHY", 2, "up"),
        ("UNHEALTHY", 1, "degraded"),
        ("UPDATING", 1, "degraded"),
        ("UPDATING", 0, "starting"),
        ("UNHEALTHY", 0, "down"),
        ("NOT_DEPLOYED", 0, "down"),
    ],
)
def test_backend_state_from_deployment_facts(status: str, running: int, state: str) -> None:
    assert backend_state(status, running) == state


@pytest.mark.parametrize(
    ("states", "overall"),
    [
        (["up", "up"], "ok"),
        (["up", "down"], "degraded"),
        (["degraded", "starting"], "degraded"),
        (["starting", "down"], "down"),
        ([], "down"),
    ],
)
def test_overall_status(states: list[str], overall: str) -> None:
    assert overall_status(states) == overall


def test_stream_error_event_is_an_sse_error_then_done() -> None:
    event, done = stream_error_event("the backend died")
    assert event.startswith("data: ") and event.endswith("\n\n")
    error = json.loads(event.removeprefix("data: "))["error"]
    assert error["message"] == "the backend died"
    assert error["code"] == "backend_failed"
    assert done == "data: [DONE]\n\n"
