"""The router's pure pieces: backend choice, the status it derives from Serve's facts, and which
errors from a Serve handle mean a backend has no KV reading to give."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from ray.serve.exceptions import RayServeException

from deployments.router.adapters.serve_ports import ServeBackend
from deployments.router.report import backend_state, overall_status
from deployments.router.request_path.faults import stream_error_event
from policy.link_choice import LinkView, choose_link

CHAIN = ("reasoning@cloud", "reasoning@local", "orchestrator@local", "cpu-fallback")
UP = LinkView(running=True, breaker_passes=True, kv_pressured=False)


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
    assert event.startswith("data: ")
    assert event.endswith("\n\n")
    error = json.loads(event.removeprefix("data: "))["error"]
    assert error["message"] == "the backend died"
    assert error["code"] == "backend_failed"
    assert done == "data: [DONE]\n\n"


def test_the_first_healthy_link_serves_and_undeployed_links_are_skipped() -> None:
    assert choose_link(CHAIN, {link: UP for link in CHAIN}) == "reasoning@cloud"
    assert choose_link(CHAIN, {"orchestrator@local": UP}) == "orchestrator@local"
    assert choose_link(CHAIN, {"coding@local": UP}) is None


def test_undeployed_stopped_tripped_and_tried_links_are_skipped() -> None:
    views = {
        "reasoning@local": LinkView(running=False, breaker_passes=True, kv_pressured=False),
        "orchestrator@local": LinkView(running=True, breaker_passes=False, kv_pressured=False),
        "cpu-fallback": UP,
    }
    assert choose_link(CHAIN, views) == "cpu-fallback"
    assert choose_link(CHAIN, views, tried={"cpu-fallback"}) is None


def test_kv_pressure_moves_work_down_the_chain_but_waits_when_all_are_pressed() -> None:
    pressed = LinkView(running=True, breaker_passes=True, kv_pressured=True)
    views = {"reasoning@cloud": pressed, "reasoning@local": UP}
    assert choose_link(CHAIN, views) == "reasoning@local"
    views = {"reasoning@cloud": pressed, "reasoning@local": pressed}
    assert choose_link(CHAIN, views) == "reasoning@cloud"


class FakeHandle:
    """The shape of a Serve handle: `.method.remote()` gives an awaitable."""

    app_name = "gateway"
    deployment_name = "coding@local"

    def __init__(self, kv_reply: Callable[[], Any]) -> None:
        self._kv_reply = kv_reply

    def options(self, **_: Any) -> FakeHandle:
        return self

    @property
    def kv_cache_usage(self) -> FakeHandle:
        return self

    async def remote(self) -> Any:
        return self._kv_reply()


def raising(error: Exception) -> Callable[[], Any]:
    def reply() -> Any:
        raise error

    return reply


def test_a_backend_without_the_kv_method_has_no_reading_and_other_errors_still_raise() -> None:
    missing = RayServeException("Tried to call a method 'kv_cache_usage' that does not exist.")
    assert asyncio.run(ServeBackend(FakeHandle(raising(missing))).kv_cache_usage()) is None
    assert asyncio.run(ServeBackend(FakeHandle(lambda: 0.42)).kv_cache_usage()) == 0.42
    broken = ServeBackend(FakeHandle(raising(RayServeException("replica unavailable"))))
    with pytest.raises(RayServeException):
        asyncio.run(broken.kv_cache_usage())
    assert broken.deployment == ("gateway", "coding@local")
