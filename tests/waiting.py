"""Waiting in a test for a state the system reaches on its own time."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Until `check()` holds, asked every half second; the test fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
