"""How much CPU each `make test` suite's processes used, beside its wall time.

The suites run side by side on a machine whose cores they saturate, so a suite's wall time says
little about what it costs: a cut that saves a suite's CPU shortens every suite beside it. Each
suite leads a session of its own (tests/suites.py), and everything it starts inherits it: Ray's
daemons and workers, engines, orphans (tests/own_processes.py). A process of a suite that
starts a session of its own (stop's `serve run`, recovery's node starts) passes the suite's
name on in its environment (MAKE_TEST_SUITE), where the meter reads it from the new session's
leader. A thread reads every process's CPU time and session every `interval_s` and keeps each
one's last reading under its suite. A process that lives less than one interval is missed (a
`ray stop` CLI call, a short subprocess), and so is a session whose leader is gone before it
is first read, or that is no suite's (a container's conmon): the machine's busy time, printed
beside, shows how much that leaves out. Each process is also counted under its kind (its title,
without paths or the method a Ray actor runs: `ray::ServeReplica:app:deployment`,
`VLLM::EngineCore`, `gcs_server`, `python pytest`), which says what a suite's CPU went to.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

import psutil

from tests.own_processes import suite_of_session

ProcessKey = tuple[int, float]  # pid and start time: a pid used again is another process
Reading = tuple[ProcessKey, int, float, str]  # the process, its session id, CPU seconds, kind

INTERVAL_S = 2.0


def read_processes() -> Iterator[Reading]:
    """Every process's own CPU seconds (user and system), session id and kind. Children's
    times are left out: a child reaped by its parent was read on its own, while it ran."""
    attributes = ["create_time", "cpu_times", "cmdline", "name", "status"]
    for process in psutil.process_iter(attributes):
        times = process.info["cpu_times"]
        # A zombie's time is what it had when last read running, and its title is gone.
        if times is None or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            session = os.getsid(process.pid)
        except OSError:
            continue
        key = (process.pid, process.info["create_time"])
        title = kind(process.info["cmdline"] or [process.info["name"] or "?"])
        yield key, session, times.user + times.system, title


def kind(command: list[str]) -> str:
    """What a process is, from its command line: a title a process set for itself (Ray's
    workers, vLLM's engines) as it is, else the program's name and, for Python, its module or
    script; no paths, no arguments."""
    first = command[0] if command else "?"
    if "::" in first:  # setproctitle's: the title is the first word, the rest is padding
        title = first.split()[0] if first.split() else first
        # A Ray actor's title names the method it runs now (`ray::ServeReplica:app:ingress.
        # handle_request`): the actor is the kind, whatever it ran last.
        actor, _, method = title.rpartition(".")
        return actor if actor.startswith("ray::") and method.isidentifier() else title
    program = os.path.basename(first)
    if not program.startswith("python") or len(command) < 2:
        return program
    if command[1] == "-m" and len(command) > 2:
        return f"python -m {command[2]}"
    if command[1] == "-c":
        return "python -c"
    return f"python {os.path.basename(command[1])}"


def machine_busy_s() -> float:
    """CPU seconds the machine's cores spent busy since boot: its own work, user and kernel.
    Not idle, I/O wait or time a hypervisor stole; guests' time is already in `user`."""
    times = psutil.cpu_times()
    busy = ("user", "nice", "system", "irq", "softirq")
    return sum(getattr(times, name, 0.0) for name in busy)


class CpuBySuite:
    """CPU seconds by suite, read in a thread of its own while the run goes on."""

    def __init__(
        self,
        read: Callable[[], Iterable[Reading]] = read_processes,
        interval_s: float = INTERVAL_S,
        suite_of: Callable[[int], str | None] = suite_of_session,
    ) -> None:
        self._read = read
        self._interval_s = interval_s
        self._suite_of = suite_of
        self._suites: dict[int, str] = {}  # session id: the suite whose session it is
        self._looked_up: dict[int, str | None] = {}  # other sessions: their leaders' suites
        self._used: dict[ProcessKey, tuple[str, float, str]] = {}  # suite, seconds, kind
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, session: int, suite: str) -> None:
        with self._lock:
            self._suites[session] = suite

    def read_once(self) -> None:
        """One reading of the machine. Whatever goes wrong in it costs that reading only: the
        figures are for the table, and must never break the run they describe."""
        try:
            readings = list(self._read())
            with self._lock:
                for process, session, seconds, title in readings:
                    suite = self._suite_for(session)
                    if suite is not None:
                        self._used[process] = (suite, seconds, title)
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    def _suite_for(self, session: int) -> str | None:
        """The watched suite of `session`, or of the suite its leader names (looked up once)."""
        if session in self._suites:
            return self._suites[session]
        if session not in self._looked_up:
            named = self._suite_of(session)
            self._looked_up[session] = named if named in self._suites.values() else None
        return self._looked_up[session]

    def seconds(self, suite: str) -> float:
        with self._lock:
            return sum(s for name, s, _ in self._used.values() if name == suite)

    def by_kind(self, suite: str) -> list[tuple[str, float]]:
        """The suite's CPU seconds by kind of process, the most first."""
        spent: dict[str, float] = {}
        with self._lock:
            for name, seconds, title in self._used.values():
                if name == suite:
                    spent[title] = spent.get(title, 0.0) + seconds
        return sorted(spent.items(), key=lambda item: -item[1])

    def __enter__(self) -> CpuBySuite:
        self._thread = threading.Thread(target=self._run, name="cpu-by-suite", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self.read_once()  # what the last interval added

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self.read_once()
