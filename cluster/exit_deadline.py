"""`serve run`'s Ctrl-C always ends it: a deadline on the shutdown Serve's CLI starts.

On Ctrl-C, `serve run` shuts the app down (every replica's graceful shutdown: 15 to 18 s here)
and then Ray. Twice in CI on a fresh machine (2026-11-23 and 2026-11-24) it was still alive
120 s after Ctrl-C, and its Serve controller had never been asked to shut down; it did not
happen in a dozen tries here, also with the signal sent while `serve.run` waited on the proxy.
So the first Ctrl-C also starts a deadline: if the process is still alive when it passes, it
prints every thread's stack (what the next such hang needs to be understood) and exits.

That exit leaves nothing behind: a head this process started is torn down by Ray's reaper when
its driver dies, and every engine dies with its replica (deployments/engine/parent_death.py). On a
cluster it only joined, the app may still be running there, and the message says how to stop it.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

__all__ = ["DEADLINE_S", "arm", "is_serve_run_driver"]

DEADLINE_S = 60.0
EXIT_STATUS = 130  # a shell's status for a process ended by Ctrl-C


def is_serve_run_driver(argv: list[str]) -> bool:
    """Whether this process is the `serve run` command (not a Ray worker building the app for
    `serve deploy`, whose main thread must keep Ray's own handlers)."""
    return len(argv) > 1 and Path(argv[0]).name == "serve" and argv[1] == "run"


def arm(
    own_cluster: bool,
    deadline_s: float = DEADLINE_S,
    *,
    stream: TextIO = sys.stderr,
    sleep: Callable[[float], None] = time.sleep,
    exit_now: Callable[[int], Any] = os._exit,
) -> None:
    """From the first SIGINT on, the process has `deadline_s` to end by itself. The handler in
    place before (Python's KeyboardInterrupt) still runs, so Serve's shutdown goes on as usual.
    Call from the main thread."""
    previous = signal.getsignal(signal.SIGINT)
    started = threading.Event()

    def expire() -> None:
        sleep(deadline_s)
        where = (
            "the Ray head it started goes with it"
            if own_cluster
            else "the app may still run on the cluster: `serve shutdown -y` removes it"
        )
        print(
            f"gpu-pool-serve: shutdown still running {deadline_s:.0f} s after Ctrl-C; "
            f"exiting ({where}). Its threads were:",
            file=stream,
            flush=True,
        )
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
        exit_now(EXIT_STATUS)

    def on_sigint(signum: int, frame: FrameType | None) -> Any:
        if not started.is_set():
            started.set()
            threading.Thread(target=expire, name="exit-deadline", daemon=True).start()
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
