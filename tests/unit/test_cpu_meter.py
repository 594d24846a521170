"""`make test`'s table gives each suite's CPU (tests/cpu_meter.py): every process of its session,
each counted once at its last reading, none of another session's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cpu_meter import (
    CpuBySuite,
    Reading,
    kind,
    machine_busy_s,
    read_processes,
)
from tests.own_processes import suite_of_session

MAIN, STOP = 100, 200  # the sessions' ids: their leaders' pids


class Readings:
    """What the machine shows at each reading, set by the test."""

    def __init__(self) -> None:
        self.now: list[Reading] = []

    def __call__(self) -> list[Reading]:
        return list(self.now)


def test_each_process_counts_once_at_its_last_reading_under_its_sessions_suite() -> None:
    readings = Readings()
    meter = CpuBySuite(readings)
    meter.watch(MAIN, "main")
    meter.watch(STOP, "stop")
    readings.now = [
        ((100, 1.0), MAIN, 2.0, "pytest"),
        ((101, 1.0), MAIN, 5.0, "ray::IDLE"),
        ((200, 2.0), STOP, 1.0, "pytest"),
    ]
    meter.read_once()
    readings.now = [
        ((100, 1.0), MAIN, 3.0, "pytest"),
        ((101, 1.0), MAIN, 7.5, "ray::ServeReplica:app:engine"),
    ]  # the stop suite's gone
    meter.read_once()
    assert meter.seconds("main") == pytest.approx(10.5)
    assert meter.seconds("stop") == pytest.approx(1.0)
    # A Ray worker's time goes to the title it took last (an idle worker that became a replica).
    assert meter.by_kind("main") == [("ray::ServeReplica:app:engine", 7.5), ("pytest", 3.0)]


def test_a_process_that_ended_keeps_its_time_and_a_pid_used_again_is_another_process() -> None:
    readings = Readings()
    meter = CpuBySuite(readings)
    meter.watch(MAIN, "main")
    readings.now = [((300, 1.0), MAIN, 4.0, "raylet")]
    meter.read_once()
    readings.now = [((300, 9.0), MAIN, 0.5, "raylet")]  # pid 300 again, started later
    meter.read_once()
    assert meter.seconds("main") == pytest.approx(4.5)


def test_processes_of_sessions_no_suite_leads_count_for_none() -> None:
    readings = Readings()
    meter = CpuBySuite(readings)
    meter.watch(MAIN, "main")
    readings.now = [((400, 1.0), 999, 60.0, "conmon"), ((401, 1.0), MAIN, 1.0, "raylet")]
    meter.read_once()
    assert meter.seconds("main") == pytest.approx(1.0)
    assert meter.seconds("stop") == 0.0


def test_a_session_watched_after_its_processes_were_read_counts_from_then_on() -> None:
    readings = Readings()
    meter = CpuBySuite(readings)
    readings.now = [((500, 1.0), MAIN, 1.0, "raylet")]
    meter.read_once()
    meter.watch(MAIN, "main")
    readings.now = [((500, 1.0), MAIN, 2.0, "raylet")]
    meter.read_once()
    assert meter.seconds("main") == pytest.approx(2.0)


def test_a_session_a_suites_process_started_counts_under_the_suite_its_leader_names() -> None:
    """stop's `serve run` leads a session of its own, its environment the stop suite's."""
    readings = Readings()
    looked_up: list[int] = []

    def suite_of(session: int) -> str | None:
        looked_up.append(session)
        return {300: "stop", 400: "mine"}.get(session)

    meter = CpuBySuite(readings, suite_of=suite_of)
    meter.watch(STOP, "stop")
    readings.now = [
        ((300, 1.0), 300, 2.0, "serve"),  # serve run's session, named by its leader
        ((301, 1.0), 300, 5.0, "raylet"),
        ((400, 1.0), 400, 9.0, "VLLM::EngineCore"),  # a session of no suite of this run
        ((500, 1.0), 500, 9.0, "conmon"),  # a session whose leader names none
    ]
    meter.read_once()
    meter.read_once()
    assert meter.seconds("stop") == pytest.approx(7.0)
    assert sorted(looked_up) == [300, 400, 500]  # each session looked up once


def test_a_reading_that_fails_costs_that_reading_only() -> None:
    calls: list[int] = []

    def read() -> list[Reading]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a /proc read gone wrong")
        return [((600, 1.0), MAIN, 3.0, "raylet")]

    meter = CpuBySuite(read)
    meter.watch(MAIN, "main")
    meter.read_once()
    meter.read_once()
    assert meter.seconds("main") == pytest.approx(3.0)


def test_the_meter_reads_in_its_thread_and_once_more_when_it_stops() -> None:
    readings = Readings()
    with CpuBySuite(readings, interval_s=3600) as meter:
        meter.watch(MAIN, "main")
        readings.now = [((600, 1.0), MAIN, 7.0, "raylet")]
    assert meter.seconds("main") == pytest.approx(7.0)


def test_the_machine_shows_this_process_in_its_own_session_and_its_cpu() -> None:
    spent = sum(range(200_000))  # some CPU of this process's own
    mine = [r for r in read_processes() if r[0][0] == os.getpid()]
    assert spent > 0
    assert len(mine) == 1
    _, session, seconds, title = mine[0]
    assert title.endswith("pytest")  # a script run by its shebang: `python pytest`
    assert session == os.getsid(0)
    assert seconds > 0
    assert machine_busy_s() >= seconds


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["ray::ServeReplica:gateway:ingress", "", ""], "ray::ServeReplica:gateway:ingress"),
        (["ray::ServeReplica:gateway:ingress.perform_graceful_shutdown"],
         "ray::ServeReplica:gateway:ingress"),
        (["ray::ServeReplica:gateway:model:qwen2.5@local"],
         "ray::ServeReplica:gateway:model:qwen2.5@local"),
        (["ray::ServeReplica:gateway:model:qwen2.5@local.handle_request"],
         "ray::ServeReplica:gateway:model:qwen2.5@local"),
        (["VLLM::EngineCore"], "VLLM::EngineCore"),
        (["/x/.venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server", "--a=1"],
         "gcs_server"),
        (["/x/.venv/bin/python3", "-m", "pytest", "-q"], "python -m pytest"),
        (["/x/.venv/bin/python", "/x/ray/dashboard/agent.py", "--node-ip=1"], "python agent.py"),
        (["/usr/bin/python3", "-c", "print(1)"], "python -c"),
        (["raylet"], "raylet"),
    ],
)  # fmt: skip
def test_a_process_kind_is_its_title_or_its_program_and_module(
    command: list[str], expected: str
) -> None:
    assert kind(command) == expected


def test_a_sessions_leader_names_its_suite_from_its_environment() -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
        env={**os.environ, "MAKE_TEST_SUITE": "stop"},
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    try:
        assert leader.stdout is not None
        assert leader.stdout.readline() == b"up\n"  # past its exec: its own environment
        assert suite_of_session(leader.pid) == "stop"
    finally:
        leader.kill()
        leader.communicate()  # reaped, its pipe closed
    assert suite_of_session(leader.pid) is None  # gone
