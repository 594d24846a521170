"""Which processes belong to this test session, when `make test` runs sessions side by side.

tests/suites.py gives each pytest session MAKE_TEST_SUITE=<its name>. Ray hands the driver's
environment on to the raylet it starts, the raylet to its workers, and a worker to the engine
processes it spawns, so a process's environment says whose cluster it belongs to. A check that
"no engine is left" must count its own engines, not those of a suite running beside it.
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


def ours(process: psutil.Process) -> bool:
    """True when `process` was started under this session's suite (or neither has one)."""
    try:
        theirs = process.environ().get(SUITE_VARIABLE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return theirs == os.environ.get(SUITE_VARIABLE)
