"""A supervised engine server: a child process on a loopback port, restarted when it dies.

The fallback's engines are native code (llama.cpp, Ollama): if they crash, they must crash in a
process of their own, never in the Serve replica. The supervisor starts the server (through
`orphan_guard`, so it dies with the replica however the replica ends), waits until its
readiness check passes (the engine's own self-test), and while the replica lives restarts it
with backoff whenever it exits. Meanwhile `ready` is false: the replica reports unhealthy and
requests wait (`wait_ready`) or fail over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from deployments.fallback.engine import EngineUnavailable
from deployments.fallback.orphan_guard import guarded

logger = logging.getLogger("ray.serve")

# Loading the demo GGUF takes about a second; a multi-GB model from a cold disk much longer.
START_TIMEOUT_S = 120.0
# A server that keeps dying is retried ever more slowly, never given up on: the replica reports
# unhealthy meanwhile, and Serve replaces it if that goes on.
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
UP_POLL_S = 0.1
# A server whose connection just broke is reaped within milliseconds if it died.
DEATH_GRACE_S = 1.0
STOP_TIMEOUT_S = 10.0  # a stopped server that has not exited by then is killed

Command = Callable[[int], Sequence[str]]  # the server's argv, given its port
ReadyCheck = Callable[[httpx.AsyncClient], Awaitable[None]]  # raises until it serves


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Supervisor:
    def __init__(
        self,
        *,
        name: str,
        command: Command,
        ready_check: ReadyCheck,
        env: Mapping[str, str] | None = None,
        port_env: Callable[[int], Mapping[str, str]] | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
        death_signal: signal.Signals = signal.SIGKILL,
        start_timeout_s: float = START_TIMEOUT_S,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.name = name
        self._command = command
        self._ready_check = ready_check
        self._env = dict(env or {})
        self._port_env = port_env
        self._stop_signal = stop_signal
        self._death_signal = death_signal  # what the server gets if the replica dies unasked
        self._start_timeout_s = start_timeout_s
        self._sleep = sleep
        self._process: asyncio.subprocess.Process | None = None
        self._client: httpx.AsyncClient | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self.restarts = 0
        self.generation = 0  # servers launched and found serving

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise EngineUnavailable(f"{self.name} has not started")
        return self._client

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self) -> None:
        """Launch the server and return once it serves; then watch it."""
        await self._launch()
        self._watcher = asyncio.create_task(self._watch())

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait for a (re)started server to serve; False if it does not within the time."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def recovered(self, generation: int, timeout_s: float) -> bool:
        """After a request failed on the server of `generation`: True once a server serves
        again, a newer one if that one died. The request's connection breaks a moment before
        the process is reaped, so a death is waited for briefly rather than read off at once."""
        process = self._process
        if process is not None and self.generation == generation:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), DEATH_GRACE_S)
            if process.returncode is None:
                return self.ready  # alive: the failure was the request's own
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not (self.ready and self.generation > generation):
            if loop.time() > deadline:
                return False
            await asyncio.sleep(UP_POLL_S)
        return True

    async def _launch(self) -> None:
        port = free_loopback_port()
        env = {**os.environ, **self._env, **(self._port_env(port) if self._port_env else {})}
        self._process = await asyncio.create_subprocess_exec(
            *guarded(list(self._command(port)), signal=self._death_signal),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
        )
        if self._client is not None:
            await self._client.aclose()
        self._client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60)
        await self._wait_until_serving()
        self.generation += 1
        self._ready.set()
        logger.info("%s serving on port %d (pid %d)", self.name, port, self._process.pid)

    async def _wait_until_serving(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout_s
        while True:
            assert self._process is not None
            assert self._client is not None
            if self._process.returncode is not None:
                raise EngineUnavailable(f"{self.name} exited with {self._process.returncode}")
            try:
                await self._ready_check(self._client)
                return
            except Exception as error:  # noqa: BLE001 - not up yet, or up and not right yet: ask again
                if loop.time() > deadline:
                    self._kill()
                    raise EngineUnavailable(f"{self.name} did not serve in time: {error}") from None
                await asyncio.sleep(UP_POLL_S)  # a poll, not a backoff: never skipped

    async def _watch(self) -> None:
        """Restart the server whenever it exits, backing off while it keeps failing."""
        failures = 0
        while True:
            assert self._process is not None
            await self._process.wait()
            self._ready.clear()
            logger.warning("%s exited with %s: restarting", self.name, self._process.returncode)
            await self._sleep(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
            try:
                await self._launch()
                self.restarts += 1
                failures = 0
            except Exception as error:  # noqa: BLE001 - keep trying: the replica reports unhealthy meanwhile
                failures += 1
                logger.warning("%s restart failed: %s", self.name, error)
                self._kill()

    def _kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(self._stop_signal)

    async def aclose(self) -> None:
        """Stop watching and stop the server, and wait until it has exited (killed if it must)."""
        watcher, process, client = self._watcher, self._process, self._client
        self._client = None
        self.close()
        if watcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Stop watching and stop the server, without waiting (also from `__del__`)."""
        if self._watcher is not None:
            self._watcher.cancel()
        self._ready.clear()
        self._kill()
        if self._client is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing left to close
                asyncio.get_running_loop().create_task(self._client.aclose())
            self._client = None
