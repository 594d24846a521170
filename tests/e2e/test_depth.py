"""The depth router for `model: auto` on real replicas: it picks the role and the budget."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from core.config import ClusterConfig
from core.types import Depth, Role


@pytest.fixture(scope="module")
def quick_window(config: ClusterConfig) -> int:
    """The quick depth's share of the orchestrator's window (gateway.yaml keeps the default
    quarter)."""
    share = config.depth.routes[Depth.QUICK].context_share
    return int(config.model_for(Role.ORCHESTRATOR).context_window * share)


def conversation(turns: int) -> list[dict[str, Any]]:
    """About `turns` x 2 x 400 tokens of history, then a short question."""
    filler = "Each backend has a breaker that opens after three faults in a row. " * 30
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"Note {i}: {filler}"})
        messages.append({"role": "assistant", "content": f"Noted {i}."})
    messages.append({"role": "user", "content": "Say OK."})
    return messages


def ask(http: httpx.Client, content: str, **extra: object) -> httpx.Response:
    headers = extra.pop("headers", None)
    body = {"model": "auto", "messages": [{"role": "user", "content": content}], **extra}
    return http.post("/v1/chat/completions", json=body, headers=headers)  # type: ignore[arg-type]


def test_a_short_question_is_quick_on_the_orchestrator_with_a_quarter_window(
    http: httpx.Client, quick_window: int
) -> None:
    # The depth's own budget is the subject, not the answer: it ends at its first word (the
    # demo model otherwise talks to the budget's end, 30 s of make test's longest session).
    response = ask(http, "What is two plus two?", stop=[" ", "\n", "."])
    assert response.status_code == 200, response.text
    assert response.headers["x-depth"] == "quick"
    assert response.headers["x-depth-reason"] == "short"
    assert response.headers["x-backend"] == "orchestrator@local"
    assert int(response.headers["x-max-tokens"]) == int(quick_window * 0.6)


def test_deep_goes_to_its_configured_role(http: httpx.Client) -> None:
    response = ask(http, "Explain it step by step.", max_tokens=4)
    assert response.status_code == 200, response.text
    assert (response.headers["x-depth"], response.headers["x-depth-reason"]) == ("deep", "hint")
    assert response.headers["x-backend"] == "coding@local"


def test_the_header_overrides_the_rules(http: httpx.Client) -> None:
    response = ask(http, "Explain it step by step.", max_tokens=4, headers={"X-Depth": "quick"})
    assert response.status_code == 200, response.text
    assert (response.headers["x-depth"], response.headers["x-depth-reason"]) == ("quick", "header")
    assert response.headers["x-backend"] == "orchestrator@local"


def test_reasoning_effort_is_a_hint(http: httpx.Client) -> None:
    response = ask(http, "Hi", max_tokens=4, reasoning_effort="high")
    assert response.status_code == 200, response.text
    assert response.headers["x-depth"] == "deep"


def test_an_unknown_depth_header_is_a_400_naming_the_choices(http: httpx.Client) -> None:
    response = ask(http, "Hi", headers={"X-Depth": "bottomless"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "X-Depth"
    assert "quick, balanced, deep, exhaustive" in error["message"]
    assert ask(http, "Hi", max_tokens=4).status_code == 200


def test_a_quick_budget_fits_a_long_conversation_into_a_quarter_window_and_counts_it(
    http: httpx.Client, quick_window: int
) -> None:
    body = {"model": "auto", "messages": conversation(10), "max_tokens": 8}
    response = http.post("/v1/chat/completions", json=body, headers={"X-Depth": "quick"})
    assert response.status_code == 200, response.text
    assert response.headers["x-context-fitted"] == "true"
    dropped = int(response.headers["x-context-dropped-messages"])
    assert dropped > 0
    assert response.json()["usage"]["prompt_tokens"] + 8 <= quick_window
    metrics = http.get("/metrics").text
    assert 'gps_depth_decisions_total{depth="quick"}' in metrics
    assert 'gps_context_fits_total{backend="orchestrator@local"}' in metrics
    assert 'gps_context_dropped_messages_total{backend="orchestrator@local"}' in metrics
