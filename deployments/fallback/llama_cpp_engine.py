"""The llama.cpp engine: `llama_server` as a supervised child process, spoken to over loopback.

For nodes without an `ollama` binary. llama.cpp is native code: run inside the Serve replica, a
crash of it (ggml's AMX kernels segfault on some CPUs) took the replica, the last link of every
chain, down with it. In a child process a crash costs one restart. A request that was in flight
when the child died is tried once more on the restarted child, resuming from the text already
produced (within the same limit, counted as one answer), so its client sees one answer; a
second death fails it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import httpx

from deployments.fallback.engine import (
    ChatParams,
    CompletionParams,
    EngineUnavailable,
    Finish,
    InvalidChat,
    Piece,
    PromptTooLong,
    gpu_env,
)
from deployments.fallback.supervisor import START_TIMEOUT_S, Supervisor
from deployments.fallback.tool_calls import forced_call_schema

SELF_TEST = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


class LlamaCppEngine:
    name = "llama_cpp"
    parallel = 1  # one llama.cpp context decodes one sequence at a time

    def __init__(
        self,
        *,
        model_path: str,
        context_window: int,
        threads: int,
        n_gpu_layers: int = 0,
        chat_template: str | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
    ) -> None:
        def command(port: int) -> list[str]:
            return [
                sys.executable,
                "-m",
                "deployments.fallback.llama_server",
                f"--model={model_path}",
                f"--port={port}",
                f"--n-ctx={context_window}",
                f"--threads={threads}",
                f"--n-gpu-layers={n_gpu_layers}",
                *([f"--chat-template={chat_template}"] if chat_template else []),
            ]

        self._server = Supervisor(
            name="llama.cpp server",
            command=command,
            env=gpu_env(n_gpu_layers),
            ready_check=self_test,
            sleep=sleep or asyncio.sleep,
        )
        self.retried = 0  # requests continued on a restarted server

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
        for attempt in (1, 2):
            generation = self._server.generation
            try:
                async for item in self._chat_once(_body(params, resume_text="".join(produced))):
                    if isinstance(item, Piece):
                        produced.append(item.text)
                    yield item
                return
            except EngineUnavailable:
                # A forced call is held by a grammar from its first token: it cannot resume.
                forced = forced_call_schema(params.tools, params.tool_choice) is not None
                if attempt == 2 or forced:
                    raise
                if not await self._server.recovered(generation, START_TIMEOUT_S):
                    raise
                self.retried += 1

    async def complete(self, params: CompletionParams) -> AsyncGenerator[Piece | Finish, None]:
        """One attempt: a completion is not resumed on a restarted server (its client sees a
        503 and may retry; the router has already tried every other link)."""
        body = {
            "prompt": params.prompt,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop),
            "seed": params.seed,
            "echo": params.echo,
        }
        async for item in self._chat_once(body, path="/complete"):
            yield item

    async def _chat_once(
        self, body: dict[str, Any], path: str = "/chat"
    ) -> AsyncGenerator[Piece | Finish, None]:
        if not self._server.ready:
            raise EngineUnavailable("the llama.cpp server is not running")
        try:
            async with self._server.client.stream("POST", path, json=body, timeout=None) as r:
                if r.status_code == 400:
                    error = json.loads(await r.aread())
                    kind = PromptTooLong if error.get("kind") == "prompt_too_long" else InvalidChat
                    raise kind(str(error.get("error")))
                if r.status_code != 200:
                    raise EngineUnavailable(f"llama.cpp server: HTTP {r.status_code}")
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    if "error" in item:
                        raise EngineUnavailable(f"llama.cpp: {item['error']}")
                    if item.get("done"):
                        yield Finish(
                            item["reason"], item["prompt_tokens"], item["completion_tokens"]
                        )
                        return
                    yield Piece(item["text"])
        except httpx.HTTPError as error:  # the server died, or never answered
            raise EngineUnavailable(f"llama.cpp server unreachable: {error!r}") from error
        raise EngineUnavailable("the llama.cpp server ended the answer without done")

    async def check_health(self) -> None:
        if not self._server.ready:
            raise EngineUnavailable("the llama.cpp server is not running")
        try:
            reply = await self._server.client.get("/health", timeout=5)
        except httpx.HTTPError as error:
            raise EngineUnavailable(f"the llama.cpp server does not answer: {error!r}") from error
        if reply.status_code != 200:
            raise EngineUnavailable(f"the llama.cpp server answers HTTP {reply.status_code}")

    async def stats(self) -> dict[str, Any]:
        """The server's own figures (`cancelled`: generations stopped by a client leaving)."""
        reply = await self._server.client.get("/health", timeout=5)
        figures: dict[str, Any] = reply.json()
        return figures

    def close(self) -> None:
        self._server.close()

    async def aclose(self) -> None:
        await self._server.aclose()


async def self_test(client: httpx.AsyncClient) -> None:
    """Ready means one real token was generated, not merely that the port is open."""
    reply = await client.post("/chat", json=SELF_TEST, timeout=30)
    lines = [json.loads(line) for line in reply.text.splitlines() if line.strip()]
    if reply.status_code != 200 or not lines or not lines[-1].get("done"):
        raise EngineUnavailable(f"self-test failed: HTTP {reply.status_code}: {reply.text[:200]}")


def _body(params: ChatParams, resume_text: str) -> dict[str, Any]:
    return {
        "messages": params.messages,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stop": list(params.stop),
        "seed": params.seed,
        "continue_text": params.continue_text,
        "resume_text": resume_text,
        "tools": params.tools,
        "tool_choice": params.tool_choice,
    }
