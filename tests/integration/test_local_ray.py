"""A Ray node start that timed out on a loaded machine is undone and tried again
(cluster/ray_start.py: the test sessions' starts and `make run`'s); any other failure is not.
Within a start, a node not yet registered is asked about again, for longer than Ray's 30 s."""

from __future__ import annotations

import gc
import logging
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest
import ray

from cluster import ray_start
from cluster.ray_start import ATTEMPTS, NODE_TIMEOUT, RAY_SERVICES_LOGGER, start_retrying
from tests import local_ray


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


def test_the_popens_a_timed_out_start_dropped_do_not_warn_after_the_undo() -> None:
    """Ray's Node holds a Popen for each process it started; a timed-out start's are dropped
    with its error, while the processes still run (the undo kills them after)."""
    attempts: list[int] = []

    def start() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            daemon = subprocess.Popen(["sleep", "60"])
            raise Exception(f"{NODE_TIMEOUT}: {daemon.pid}")  # `daemon` lives in this frame
        return "up"

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert start_retrying(start) == "up"
        gc.collect()
    assert len(attempts) == 2


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


def test_an_exception_ray_logs_during_a_start_is_kept_as_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def start() -> str:
        port_check = socket.socket()  # noqa: F841 (Ray drops its port check so, unclosed)
        try:
            raise ValueError("Failed to bind to 0.0.0.0:8265 because it's already occupied.")
        except ValueError as error:
            logging.getLogger(RAY_SERVICES_LOGGER).error(error)
        return "up"

    with caplog.at_level(logging.ERROR, logger=RAY_SERVICES_LOGGER):
        assert start_retrying(start) == "up"
    [record] = caplog.records
    assert record.getMessage() == "Failed to bind to 0.0.0.0:8265 because it's already occupied."
    assert not isinstance(record.msg, BaseException)  # no traceback, so no socket kept alive


class Registry:
    """Ray's `services.get_node` for a node that registers after `late` questions."""

    def __init__(self, late: int) -> None:
        self.late = late
        self.asked: list[str] = []

    def get_node(self, gcs_address: str, node_id: str) -> dict[str, str]:
        self.asked.append(node_id)
        if len(self.asked) <= self.late:
            raise RuntimeError(f"Node {node_id} is not found")
        return {"NodeID": node_id}


def test_a_node_that_registers_late_is_waited_for_within_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = Registry(late=3)
    monkeypatch.setattr(ray._private.services, "get_node", registry.get_node)

    def start() -> dict[str, str]:  # as Ray's Node does: one question, then its own loop
        answer: dict[str, str] = ray._private.services.get_node("gcs:1", "n1")
        return answer

    assert start_retrying(start) == {"NodeID": "n1"}
    assert registry.asked == ["n1"] * 4
    assert ray._private.services.get_node == registry.get_node  # Ray's own, after the start


def test_a_gcs_that_does_not_answer_yet_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(late=0)
    gcs_answers = iter([False, False, True])

    def get_node(gcs_address: str, node_id: str) -> dict[str, str]:
        if not next(gcs_answers):  # as Ray's state accessor says it
            raise ray.exceptions.RaySystemError("Failed to connect to GCS.")
        return registry.get_node(gcs_address, node_id)

    monkeypatch.setattr(ray._private.services, "get_node", get_node)

    def start() -> dict[str, str]:
        answer: dict[str, str] = ray._private.services.get_node("gcs:1", "n1")
        return answer

    assert start_retrying(start) == {"NodeID": "n1"}
    assert registry.asked == ["n1"]


def test_a_node_that_never_registers_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(late=10**6)
    monkeypatch.setattr(ray._private.services, "get_node", registry.get_node)
    monkeypatch.setattr(ray_start, "REGISTRATION_WAIT_S", 1.2)

    def start() -> None:
        ray._private.services.get_node("gcs:1", "n1")

    with pytest.raises(RuntimeError, match="is not found"):
        start_retrying(start)
    assert 2 <= len(registry.asked) <= 5  # asked every 0.5 s for 1.2 s, then raised


def test_a_node_whose_raylet_ended_is_given_up_on_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A raylet that crashed while its node started (a zombie child, as Ray's Node leaves it)
    ends the wait at the next question, not REGISTRATION_WAIT_S later."""
    registry = Registry(late=10**6)
    monkeypatch.setattr(ray._private.services, "get_node", registry.get_node)
    raylet = tmp_path / "raylet"
    shutil.copy("/bin/true", raylet)

    def start() -> None:
        crashed = subprocess.Popen([str(raylet)])  # not waited for: a zombie once it exits
        while psutil.Process(crashed.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.05)
        try:
            ray._private.services.get_node("gcs:1", "n1")
        finally:
            crashed.wait()

    with pytest.raises(RuntimeError, match="is not found"):
        start_retrying(start)
    assert registry.asked == ["n1"]  # given up on at the first question, not asked again


def test_the_loaded_machine_settings_are_ones_serve_reads_and_an_explicit_value_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Serve reads its settings once, at import: a fresh interpreter shows what a Serve
    controller started with these variables would use, and so that the names are still Ray's."""
    for name in local_ray.LOADED_MACHINE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.25")  # set by whoever runs
    local_ray.use_loaded_machine_settings()
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ray.serve._private import constants as c; "
            "print(c.PROXY_READY_CHECK_TIMEOUT_S, c.CONTROL_LOOP_INTERVAL_S)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout.split() == ["60.0", "0.25"]
