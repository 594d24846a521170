"""The tiny engine's stand-in for vLLM's EngineCore process (tests/fakes/tiny_engine.py): a
spawned child of the replica, titled as vLLM titles its own, that lives until its replica stops
it or dies. It does no work; it is there so the suites that count engine processes (a replica
scaled away, an app stopped) count a real child that must go with its replica, started the way
vLLM starts one (multiprocessing spawn, so the parent-death hook arms in it too). Kept apart
from tiny_engine.py so the child imports nothing heavy."""

from __future__ import annotations

import time

TITLE = "TINY::EngineCore"


def run() -> None:
    import setproctitle  # vLLM's own dependency, used the same way

    setproctitle.setproctitle(TITLE)
    while True:
        time.sleep(3600)
