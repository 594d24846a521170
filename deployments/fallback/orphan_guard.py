"""Start a command that dies with the process that started it: `python -m
deployments.fallback.orphan_guard PARENT_PID -- COMMAND [ARGS...]`.

A supervised engine (llama.cpp's server, `ollama serve`) must never outlive the fallback
replica: when Ray kills the replica with SIGKILL (`ray stop --force`, a node going down) no code
of ours runs, and an engine left behind holds the memory the next replica needs. The kernel's
parent-death signal (`deployments.engine.parent_death`) does it without any code in the
parent: it is set here, survives `exec`, and sends SIGKILL to the command when its parent goes.

Linux delivers the signal when the *thread* that forked the child exits: the replica forks its
engines from its event-loop thread, which lives as long as the replica does.
"""

from __future__ import annotations

import os
import signal
import sys

from deployments.engine.parent_death import die_with_parent


def guarded(
    command: list[str], parent: int | None = None, signal: int = signal.SIGKILL
) -> list[str]:
    """`command` wrapped so that it gets `signal` when `parent` (this process by default) dies.
    SIGKILL for an engine that is one process; SIGTERM for one that must stop children of its
    own (`ollama serve` stops its model runners on SIGTERM, and would orphan them on SIGKILL)."""
    parent_pid = os.getpid() if parent is None else parent
    return [
        sys.executable,
        "-m",
        "deployments.fallback.orphan_guard",
        str(parent_pid),
        str(int(signal)),
        "--",
        *command,
    ]


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--" or not (argv[0].isdigit() and argv[1].isdigit()):
        raise SystemExit(
            "usage: python -m deployments.fallback.orphan_guard PARENT_PID SIGNAL -- COMMAND"
        )
    die_with_parent(int(argv[0]), int(argv[1]))
    os.execvp(argv[3], argv[3:])


if __name__ == "__main__":
    main(sys.argv[1:])
