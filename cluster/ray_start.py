"""Starting a Ray node on a loaded machine, patiently.

Ray waits a fixed 30 s for a new node's raylet to register with the GCS (ray/_private/node.py,
not configurable), then raises "The current node timed out during startup". On 2 cores with
other work running (load average 10-35) starts missed it: `make test`'s autoscale suite's
`ray.init` (run of f17e99f, 2026-11-27), the recovery suite's three nodes on all five tries of a
run (run of eaf96ac, 2026-11-28, an AVX2-only machine beside the shared app), and `make run`
inside the CPU image beside them (CI's run of 0b7c2de, 2026-12-03: the container exited). So
inside our starts Ray's question "is the node registered?" is asked again until
REGISTRATION_WAIT_S, and Ray's own loop sees the node once it is: see `_patient_registration`.
A start that still times out is undone (the processes it started are killed) and tried again;
any other error is raised at once. Ray gives up on its dashboard the same way, without an
error: see `_quietly`.

`python -m cluster.ray_start start ...` is `ray start ...` with the same patience for its
node's registration (a node joining a cluster from a loaded machine: the recovery suite's
replacement node missed Ray's 30 s four times in a row beside two apps' engines, make test of
8507aca).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psutil
import ray

T = TypeVar("T")
NODE_TIMEOUT = "The current node timed out during startup"
RAY_SERVICES_LOGGER = "ray._private.services"  # logs a failed dashboard start
# Five: on an AVX2-only 2-core machine beside the shared app (load average 17-34) the recovery
# suite's three-node start missed Ray's 30 s three times in a row, and autoscale's twice (run
# of 176b495, 2026-11-28).
ATTEMPTS = 5
# How long a starting node may take to register. A raylet that died never will, and its start
# fails this much later than Ray's 30 s; one that is slow saves a whole start done again.
REGISTRATION_WAIT_S = 150.0

logger = logging.getLogger(__name__)


def start_retrying(start: Callable[[], T]) -> T:
    """`start()` (a `ray.init`, a `Cluster` and its nodes), again after a node's start timed
    out, up to ATTEMPTS times in all."""
    for attempt in range(1, ATTEMPTS + 1):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        # A failed start's error holds Ray's Popens of processes still running; they are dropped
        # with it, and a Popen dropped while its process runs warns. After the undo, killed and
        # reaped by psutil, their Popens still say so. Dropped later, in a test, the warning
        # failed the batch suite, whose restart needed three tries (run of 6366215).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                with _patient_registration(before):
                    return _quietly(start)
            except Exception as error:
                if NODE_TIMEOUT not in str(error) or attempt == ATTEMPTS:
                    raise
                logger.warning("Ray node start timed out (attempt %d): starting again", attempt)
            ray.shutdown()
            _kill_started_since(before)
            gc.collect()  # what the failed start left in reference cycles goes here, quietly
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _patient_registration(earlier: set[int]) -> Iterator[None]:
    """Ray's `services.get_node`, which a starting node asks in a loop that gives up after 30 s,
    asked again here while the node is not found, until REGISTRATION_WAIT_S after the first
    question about it."""
    services = ray._private.services
    original = services.get_node
    first_asked: dict[str, float] = {}

    def get_node(gcs_address: str, node_id: str) -> Any:
        started = first_asked.setdefault(node_id, time.monotonic())
        while True:
            try:
                return original(gcs_address, node_id)
            except (RuntimeError, ray.exceptions.RaySystemError):
                # Not registered yet, or (RaySystemError) the GCS just started did not answer
                # the connect within its deadline: at load average 68 here, a recovery start
                # failed so at once, outside Ray's loop (run of 3e655a4).
                if time.monotonic() - started >= REGISTRATION_WAIT_S or _a_raylet_ended(earlier):
                    raise
                time.sleep(0.5)

    services.get_node = get_node
    try:
        yield
    finally:
        services.get_node = original


def _a_raylet_ended(earlier: set[int]) -> bool:
    """Whether a raylet this process started (one not among `earlier`) has ended: its node
    will never register, so waiting longer only delays the next try. A raylet waits a fixed 15 s
    for its dashboard agent's port, and crashes when the agent misses it: 2-3 minutes of each
    failed recovery start went to waiting for such a node (run of 1d8f684, load average 40-50).
    Ray's Node does not reap it while it starts, so it stays a zombie child until the undo."""
    for child in psutil.Process().children(recursive=True):
        try:
            if (
                child.pid not in earlier
                and child.name() == "raylet"
                and child.status() == psutil.STATUS_ZOMBIE
            ):
                return True
        except psutil.NoSuchProcess:
            continue
    return False


def _quietly(start: Callable[[], T]) -> T:
    """`start()`, inside start_retrying's scope that ignores the ResourceWarning of a Popen Ray
    drops while its process still runs: on a loaded machine Ray gives up waiting for its
    dashboard ("Failed to start the dashboard"), drops the Popen and goes on while the
    dashboard's process runs on (run of a54bd3d, the recovery suite). The process is Ray's
    daemon, not a leak of ours."""
    errors_as_text = _ErrorsAsText()
    ray_services = logging.getLogger(RAY_SERVICES_LOGGER)
    ray_services.addFilter(errors_as_text)
    try:
        return start()
    finally:
        ray_services.removeFilter(errors_as_text)
        gc.collect()  # a dropped Popen in a reference cycle warns now, not in a later test


class _ErrorsAsText(logging.Filter):
    """Logs the text of an exception Ray logs as the message, not the exception itself.

    Ray logs a failed dashboard start as `logger.error(e)`. When the dashboard's port is taken
    (a suite beside holds 8265), `e` comes from the port check, whose frame still holds the
    socket it never closed. pytest keeps a test's log records until its teardown, so the
    socket lived until then and its ResourceWarning broke the placement suite at exit (CI's
    run of ec817df). As text, the exception and the socket go inside `_quietly`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, BaseException):
            record.msg, record.args = str(record.msg), ()
        return True


def _kill_started_since(before: set[int]) -> None:
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for process in started:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(started, timeout=30)


def main(argv: list[str]) -> int:
    """Ray's own command line, `ray ARGV`, with its node's registration awaited patiently."""
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *argv]
    with _patient_registration(set()):
        status = ray_main()
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
