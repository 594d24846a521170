"""Which processes belong to this test session, when `make test` runs sessions side by side.

tests/suites.py starts each pytest session as the leader of a session of its own (a new
session id) with MAKE_TEST_SUITE=<its name> in its environment. Every process it starts
inherits the session id: Ray's raylet and workers (Ray gives its daemons process groups of their
own, not sessions), the engine processes they spawn, and an orphan whose parent died. So the
session's leader says whose a process is. A process's own environment cannot: vLLM's and Ray's
process titles (setproctitle) overwrite what /proc shows of it. A check that "no engine is left"
must count its own engines, not those of a suite running beside it.
"""

from __future__ import annotations

import os

import psutil

SUITE_VARIABLE = "MAKE_TEST_SUITE"


def own_engine_processes() -> list[str]:
    """The command lines of this session's engine processes: vLLM's (`VLLM::EngineCore`,
    `VLLM::Worker`) and the test engine's (`TINY::EngineCore`)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or ())
        if ("EngineCore" in line or "VLLM::" in line) and ours(process):
            found.append(line)
    return found


def suite_of(process: psutil.Process) -> str | None:
    """The suite of the session `process` runs in; None when its leader has none (a session
    not started by tests/suites.py) or is gone."""
    try:
        return suite_of_session(os.getsid(process.pid))
    except OSError:  # gone
        return None


def suite_of_session(session: int) -> str | None:
    """The suite a session's leader runs under (its MAKE_TEST_SUITE); None when it has none or
    is gone. A leader that retitled itself (Ray's, vLLM's) hides its environment."""
    try:
        return psutil.Process(session).environ().get(SUITE_VARIABLE)
    except (OSError, psutil.Error):  # gone, or another user's
        return None


def ours(process: psutil.Process) -> bool:
    """True when `process` runs under this session's suite (or neither has one)."""
    return suite_of(process) == os.environ.get(SUITE_VARIABLE)


def another_suites(process: psutil.Process) -> bool:
    """True when `process` runs under another session's suite. A machine-wide check (`ray
    stop`'s and `ray down`'s: nothing of Ray's left anywhere) skips these; a process whose
    session has no suite, or whose leader is gone, counts."""
    theirs = suite_of(process)
    return theirs is not None and theirs != os.environ.get(SUITE_VARIABLE)
