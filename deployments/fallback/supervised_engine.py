"""What the two llama.cpp engines share: a server in a supervised child process, and an answer
resumed once on the restarted server when that process dies mid-answer.

llama.cpp is native code: run inside the Serve replica, a crash of it (ggml's AMX kernels
segfault on some CPUs) took the replica, the last link of every chain, down with it. In a child
process a crash costs one restart. A chat that was in flight when the child died is tried once
more on the restarted child, resuming from the text already produced (within the same limit,
counted as one answer), so its client sees one answer; a second death fails it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import httpx

from deployments.fallback.engine import ChatParams, EngineUnavailable, Finish, Piece, gpu_env
from deployments.fallback.supervisor import START_TIMEOUT_S, Supervisor
from deployments.fallback.tool_calls import forced_call_schema


class SupervisedEngine:
    """The lifecycle, health and resume-once chat of an engine served by `Supervisor`'s child.
    A subclass names its server (`label`, for errors) and answers one attempt (`_chat_once`)."""

    label = "the engine's server"

    def __init__(
        self,
        command: Callable[[int], list[str]],
        *,
        n_gpu_layers: int,
        ready_check: Callable[[httpx.AsyncClient], Awaitable[None]],
        sleep: Callable[[float], Awaitable[Any]] | None,
    ) -> None:
        self._server = Supervisor(
            name=self.label,
            command=command,
            env=gpu_env(n_gpu_layers),
            ready_check=ready_check,
            sleep=sleep or asyncio.sleep,
        )
        self.retried = 0  # chats continued on a restarted server

    @property
    def pid(self) -> int | None:
        return self._server.pid

    @property
    def restarts(self) -> int:
        return self._server.restarts

    async def start(self) -> None:
        await self._server.start()

    async def chat(self, params: ChatParams) -> AsyncGenerator[Piece | Finish, None]:
        produced: list[str] = []
        forced = forced_call_schema(params.tools, params.tool_choice)
        for attempt in (1, 2):
            generation = self._server.generation
            try:
                async for item in self._chat_once(params, "".join(produced), forced):
                    if isinstance(item, Piece):
                        produced.append(item.text)
                    yield item
                return
            except EngineUnavailable:
                # A forced call is held by a grammar from its first token: it cannot resume.
                if attempt == 2 or forced is not None:
                    raise
                if not await self._server.recovered(generation, START_TIMEOUT_S):
                    raise
                self.retried += 1

    def _chat_once(
        self, params: ChatParams, resume_text: str, forced: dict[str, Any] | None
    ) -> AsyncGenerator[Piece | Finish, None]:
        """One attempt at the chat, continuing after `resume_text` (already yielded); `forced`
        is the schema of a call the answer must be, if any."""
        raise NotImplementedError

    def _client(self) -> httpx.AsyncClient:
        if not self._server.ready:
            raise EngineUnavailable(f"{self.label} is not running")
        return self._server.client

    async def check_health(self) -> None:
        client = self._client()
        try:
            reply = await client.get("/health", timeout=5)
        except httpx.HTTPError as error:
            raise EngineUnavailable(f"{self.label} does not answer: {error!r}") from error
        if reply.status_code != 200:
            raise EngineUnavailable(f"{self.label} answers HTTP {reply.status_code}")

    def close(self) -> None:
        self._server.close()

    async def aclose(self) -> None:
        await self._server.aclose()
