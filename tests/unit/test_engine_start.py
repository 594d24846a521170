"""An engine replica's start: ray.llm's usage telemetry only where Ray's usage stats are on.
With them off, its report would still start a detached TelemetryAgent of vLLM and torch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.llm._internal.serve.core.server import llm_server as ray_llm_server

from deployments.engine import llm_server
from deployments.engine.llm_server import ObservedLLMServer


class _Engine:
    def __init__(self) -> None:
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1


class _Replica(ObservedLLMServer):
    def __del__(self) -> None:  # type: ignore[override]  # no engine to stop
        pass


@pytest.mark.parametrize("stats_on", [False, True])
def test_the_engine_starts_and_reports_its_usage_only_with_the_stats_on(
    monkeypatch: pytest.MonkeyPatch, stats_on: bool
) -> None:
    reported: list[list[Any]] = []
    monkeypatch.setattr(llm_server, "usage_stats_enabled", lambda: stats_on)
    monkeypatch.setattr(
        ray_llm_server,
        "push_telemetry_report_for_all_models",
        lambda all_models: reported.append(all_models),
    )
    replica: Any = object.__new__(_Replica)
    replica.engine, replica._llm_config = _Engine(), "the model's config"
    asyncio.run(replica._start_engine())
    assert replica.engine.starts == 1
    assert reported == ([["the model's config"]] if stats_on else [])
