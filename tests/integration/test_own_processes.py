"""`make test`'s sessions tell their processes apart (tests/own_processes.py), vLLM's titled
engine processes and orphans included: a check that no engine is left must see its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.own_processes import SUITE_VARIABLE, another_suites, ours, suite_of

# A session's leader starts a stand-in for a replica, which starts an engine that sets its
# process title the way vLLM does (which hides its environment from /proc) and exits, leaving
# the engine an orphan; the leader stays, as a pytest session does while its tests run.
ENGINE = "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(60)"
REPLICA = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {ENGINE!r}])"
LEADER = (
    f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {REPLICA!r}]); "
    "time.sleep(60)"
)


def orphaned_engine(suite: str, sessions: list[subprocess.Popen[bytes]]) -> psutil.Process:
    """An orphaned engine in a session led by a process of `suite`, as tests/suites.py starts."""
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER],
        env={**os.environ, SUITE_VARIABLE: suite},
        start_new_session=True,
    )
    sessions.append(leader)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            titled = (process.info["cmdline"] or [""])[0] == "VLLM::EngineCore"
            with contextlib.suppress(ProcessLookupError):
                if titled and os.getsid(process.pid) == leader.pid and process.ppid() == 1:
                    return process
        time.sleep(0.1)
    pytest.fail("the engine did not start")


@pytest.fixture
def sessions() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The sessions' leaders; each session killed whole after the test, its leader last. A
    suite beside this one (`stop`) takes every process titled as vLLM's engine whose session's
    leader is gone for its own (CI's run of 4560aa4 met one of these orphans as a zombie), so
    the orphans go first, and init gets a while to reap them, while their leader still says
    whose they are. An init that never reaps (some containers' PID 1) leaves them as zombies,
    which stop skips."""
    leaders: list[subprocess.Popen[bytes]] = []
    yield leaders
    for leader in leaders:
        members = [pid for pid in in_sessions({leader.pid}) if pid != leader.pid]
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + REAP_WAIT_S
        while set(members) & set(in_sessions({leader.pid})) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


REAP_WAIT_S = 10  # init reaped such an orphan 1.8 s after its SIGKILL here


def in_sessions(ids: set[int]) -> list[int]:
    """The processes, zombies included, whose session is one of `ids`."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(OSError):
            if os.getsid(process.pid) in ids:
                found.append(process.pid)
    return found


def test_an_orphaned_titled_engine_is_its_sessions(
    monkeypatch: pytest.MonkeyPatch, sessions: list[subprocess.Popen[bytes]]
) -> None:
    mine = orphaned_engine("mine", sessions)
    theirs = orphaned_engine("theirs", sessions)
    assert mine.environ() == {}  # the title hid it: the session's leader must say
    monkeypatch.setenv(SUITE_VARIABLE, "mine")
    assert (suite_of(mine), ours(mine), another_suites(mine)) == ("mine", True, False)
    assert (suite_of(theirs), ours(theirs), another_suites(theirs)) == ("theirs", False, True)
