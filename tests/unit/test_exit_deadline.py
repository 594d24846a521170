"""The deadline on `serve run`'s Ctrl-C: a real SIGINT to this process, with the wait and the
exit injected (nothing sleeps, nothing exits)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.exit_deadline import EXIT_STATUS, arm, is_serve_run_driver


@pytest.fixture
def sigint_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


class Expiry:
    """Records the deadline slept for and the exit asked for; `sleep` waits for `release`."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        self.statuses: list[int] = []
        self.release = threading.Event()
        self.exited = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.release.wait(timeout=30)

    def exit_now(self, status: int) -> None:
        self.statuses.append(status)
        self.exited.set()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/venv/bin/serve", "run", "cluster.app:build"], True),
        (["serve", "run"], True),
        (["/venv/bin/serve", "deploy", "config.yaml"], False),
        (["/ray/_private/workers/default_worker.py", "--node-ip-address=1"], False),
        (["serve"], False),
    ],
)
def test_only_the_serve_run_command_is_the_driver(argv: list[str], expected: bool) -> None:
    assert is_serve_run_driver(argv) is expected


@pytest.mark.usefixtures("sigint_restored")
def test_ctrl_c_still_interrupts_and_the_deadline_ends_the_process(tmp_path: Path) -> None:
    expiry = Expiry()
    with (tmp_path / "stderr").open("w") as stream:
        arm(True, 45.0, stream=stream, sleep=expiry.sleep, exit_now=expiry.exit_now)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert not expiry.exited.is_set()  # Serve's own shutdown gets its time first
        expiry.release.set()
        assert expiry.exited.wait(timeout=30)
    written = (tmp_path / "stderr").read_text()
    assert expiry.slept == [45.0]
    assert expiry.statuses == [EXIT_STATUS]
    assert "shutdown still running 45 s after Ctrl-C" in written
    assert "the Ray head it started goes with it" in written
    assert 'File "' in written  # the threads' stacks, to find the hang


@pytest.mark.usefixtures("sigint_restored")
def test_a_second_ctrl_c_starts_no_second_deadline(tmp_path: Path) -> None:
    expiry = Expiry()
    with (tmp_path / "stderr").open("w") as stream:
        arm(False, 45.0, stream=stream, sleep=expiry.sleep, exit_now=expiry.exit_now)
        for _ in range(2):
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        expiry.release.set()
        assert expiry.exited.wait(timeout=30)
    assert len(expiry.slept) == 1
    assert "`serve shutdown -y` removes it" in (tmp_path / "stderr").read_text()
