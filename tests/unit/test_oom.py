"""Recognising out-of-memory and engine death in every form a replica meets them."""

from __future__ import annotations

import json

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse

from deployments.engine.answers import plain
from policy.kv_room import KvRoom, admits
from policy.oom import error_kind, item_kind


class EngineDeadError(Exception):
    """Named as vLLM's: the match is by name, so no vLLM import is needed."""


def test_torch_out_of_memory_is_oom() -> None:
    torch = pytest.importorskip("torch")
    assert error_kind(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == (
        "oom"
    )


def test_memory_error_is_oom_and_other_errors_are_not() -> None:
    assert error_kind(MemoryError()) == "oom"
    assert error_kind(ValueError("bad request")) is None
    assert error_kind(RuntimeError("timeout")) is None


def test_engine_death_is_told_apart_from_oom_and_causes_are_followed() -> None:
    dead = EngineDeadError("EngineCore encountered an issue. See stack trace (above).")
    assert error_kind(dead) == "engine_dead"
    chained = EngineDeadError("EngineCore encountered an issue.")
    chained.__cause__ = MemoryError("CUDA out of memory")  # as `raise ... from cause` sets it
    assert error_kind(chained) == "oom"


def test_error_responses_and_sse_error_lines_are_read() -> None:
    oom = ErrorResponse(
        error=ErrorInfo(message="CUDA out of memory. Tried to allocate", type="x", code=500)
    )
    assert item_kind(plain(oom)) == "oom"  # as the replica reads an item: converted first
    line = "data: " + json.dumps(
        {
            "error": {
                "message": "EngineCore encountered an issue. See stack trace (above).",
                "type": "InternalServerError",
                "code": 500,
            }
        }
    )
    assert item_kind([line + "\n\n"]) == "engine_dead"


def test_a_model_that_talks_about_memory_is_not_an_oom() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": 'I ran "out of memory" once'}}]}
    assert item_kind([f"data: {json.dumps(chunk)}\n\n", "data: [DONE]\n\n"]) is None
    refusal = ErrorResponse(error=ErrorInfo(message="max_tokens too large", type="x", code=400))
    assert item_kind(refusal) is None


def test_the_memory_guard_admits_what_fits_the_free_cache() -> None:
    busy = KvRoom(capacity_tokens=1000, usage=0.7, running=2)
    assert busy.free_tokens == 300
    assert admits(busy, 300)
    assert not admits(busy, 301)


def test_an_idle_engine_or_no_reading_admits_anything() -> None:
    assert admits(KvRoom(capacity_tokens=1000, usage=0.99, running=0), 5000)
    assert admits(None, 10**9)
