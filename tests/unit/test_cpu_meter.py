"""`make test`'s table gives each suite's CPU (tests/cpu_meter.py): every process of its session,
each counted once at its last reading, none of another session's."""

from __future__ import annotations

import os

import pytest

from tests.cpu_meter import CpuBySuite, Reading, kind, machine_busy_s, read_processes

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
