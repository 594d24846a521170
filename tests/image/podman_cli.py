"""Podman as the image tests run it on machines like this one: containers under runc with this
process's own rlimits. Podman's default ulimits are more than a machine without
CAP_SYS_RESOURCE may grant, and crun refuses cgroups v1 in hybrid mode."""

from __future__ import annotations

import resource
import subprocess

PODMAN_TIMEOUT_S = 120
# Podman sets its own limits at its start: nofile as high as it may (1048576, else the hard
# limit), nproc to 32768 (measured, podman 4.3; 96363 was refused here). NPROC counts every
# thread of the container's user on the machine, the host's root included: not much lower.
NOFILE_CEILING = 1_048_576
NPROC_CEILING = 32_768


def capped(limit: int, ceiling: int) -> int:
    return ceiling if limit == resource.RLIM_INFINITY else min(limit, ceiling)


def ulimit(name: str, limit: int, ceiling: int) -> str:
    """`--ulimit` at what this process has, at most `ceiling`: without CAP_SYS_RESOURCE a
    container gets no more than podman itself has (its defaults ask for more, and are refused)."""
    soft, hard = resource.getrlimit(limit)
    return f"{name}={capped(soft, ceiling)}:{capped(hard, ceiling)}"


def podman(*args: str, timeout_s: float = PODMAN_TIMEOUT_S) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"podman {args[0]} exited {done.returncode}: {done.stderr}"
    return done.stdout.strip()


def run_flags() -> list[str]:
    """`podman run` flags every container of the tests needs here."""
    return [
        "--runtime", "runc",
        "--ulimit", ulimit("nofile", resource.RLIMIT_NOFILE, NOFILE_CEILING),
        "--ulimit", ulimit("nproc", resource.RLIMIT_NPROC, NPROC_CEILING),
    ]  # fmt: skip
