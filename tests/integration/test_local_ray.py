"""A Ray node start that timed out on a loaded machine is undone and tried again
(tests/local_ray.py); any other failure is not."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from tests.local_ray import ATTEMPTS, NODE_TIMEOUT, start_retrying


def test_a_timed_out_start_is_undone_and_tried_again() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        started.append(subprocess.Popen(["sleep", "60"]))  # a daemon the attempt started
        if len(started) < ATTEMPTS:
            raise Exception(f"{NODE_TIMEOUT}. This could happen because ...")
        return "up"

    try:
        assert start_retrying(start) == "up"
        assert [p.poll() is not None for p in started] == [True] * (ATTEMPTS - 1) + [False]
        assert psutil.pid_exists(started[-1].pid)
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_another_failure_and_the_last_timeout_are_raised() -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise ValueError("no such resource")

    with pytest.raises(ValueError, match="no such resource"):
        start_retrying(broken)
    assert len(calls) == 1

    def always_late() -> None:
        calls.append(1)
        raise Exception(NODE_TIMEOUT)

    calls.clear()
    with pytest.raises(Exception, match=NODE_TIMEOUT):
        start_retrying(always_late)
    assert len(calls) == ATTEMPTS


def test_a_popen_ray_drops_while_its_process_runs_is_not_an_error_of_the_start() -> None:
    left: list[int] = []

    def start() -> str:
        dashboard = subprocess.Popen(["sleep", "60"])  # given up on, dropped, still running
        left.append(dashboard.pid)
        return "up"

    try:
        assert start_retrying(start) == "up"  # with filterwarnings = error: no ResourceWarning
    finally:
        for pid in left:
            process = psutil.Process(pid)
            process.kill()
            process.wait(timeout=10)
