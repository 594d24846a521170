"""Run a child process for a provisioner: asynchronously, in a session of its own, killed with
its whole process group when the call is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path

from autoscale.provisioners import ProvisionFailed

KILL_GRACE_S = 5.0
TAIL_LINES = 5
TAIL_CHARS = 800


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str

    @staticmethod
    def tail(text: str) -> str:
        """The last lines of a stream, bounded: enough to say why, never a whole log."""
        lines = [line for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-TAIL_LINES:])[-TAIL_CHARS:] or "(no output)"


async def run(argv: list[str], env: Mapping[str, str], cwd: Path) -> Done:
    starting = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a cancel kills everything it began
        )
    )
    try:
        process = await asyncio.shield(starting)
    except OSError as error:  # missing or not executable
        raise ProvisionFailed(f"cannot run {argv[0]}: {error.strerror or error}") from None
    except asyncio.CancelledError:
        # The child runs once the fork returns, while asyncio still connects its pipes. A
        # cancel there would make asyncio kill the child alone and wait for its pipes, which
        # a grandchild holds for as long as it runs: let the start finish, then end the group.
        await _to_its_end(_end_started(starting))
        raise
    try:
        stdout, stderr = await process.communicate()
    except asyncio.CancelledError:
        await _to_its_end(_kill_group(process))
        raise
    return Done(
        process.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")
    )


async def _to_its_end(cleanup: Awaitable[None]) -> None:
    """Run a cleanup to its end however often the caller is cancelled meanwhile (a second
    cancel, as a shutdown sends, would otherwise stop it halfway and leave the group running);
    the caller re-raises its cancel after."""
    task = asyncio.ensure_future(cleanup)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
    if not task.cancelled():
        task.result()


async def _end_started(starting: asyncio.Future[asyncio.subprocess.Process]) -> None:
    with contextlib.suppress(OSError):  # it never started: nothing to end
        await _kill_group(await starting)


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the group, then SIGKILL to whatever of it is left after a grace (children
    that ignore SIGTERM, or outlive their parent); the child reaped before the caller goes on."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    # wait() also waits for the child's pipes, which a process that left the group (setsid)
    # may hold on: the child's own exit code is what says it is reaped.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    while process.returncode is None:  # noqa: ASYNC110 - set by the child watcher; no event
        await asyncio.sleep(0.05)
