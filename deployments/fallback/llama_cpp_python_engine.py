"""The `llama_cpp` engine: `llama_cpp_python_server` (the project's own server over the
llama-cpp-python bindings, one sequence at a time) as a supervised child process, spoken to over
loopback.

For nodes with neither an `ollama` binary nor llama.cpp's `llama-server`. Why a child process,
and how a chat is resumed when it dies: `supervised_engine`.
"""

from __future__ import annotations

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
)
from deployments.fallback.supervised_engine import SupervisedEngine

SELF_TEST = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


class LlamaCppEngine(SupervisedEngine):
    label = "the llama.cpp server"
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
                "deployments.fallback.llama_cpp_python_server",
                f"--model={model_path}",
                f"--port={port}",
                f"--n-ctx={context_window}",
                f"--threads={threads}",
                f"--n-gpu-layers={n_gpu_layers}",
                *([f"--chat-template={chat_template}"] if chat_template else []),
            ]

        super().__init__(command, n_gpu_layers=n_gpu_layers, ready_check=self_test, sleep=sleep)

    def _chat_once(
        self, params: ChatParams, resume_text: str, forced: dict[str, Any] | None
    ) -> AsyncGenerator[Piece | Finish, None]:
        return self._stream(_body(params, resume_text))  # the server holds the call itself

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
        async for item in self._stream(body, path="/complete"):
            yield item

    async def _stream(
        self, body: dict[str, Any], path: str = "/chat"
    ) -> AsyncGenerator[Piece | Finish, None]:
        client = self._client()
        try:
            async with client.stream("POST", path, json=body, timeout=None) as r:
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

    async def stats(self) -> dict[str, Any]:
        """The server's own figures (`cancelled`: generations stopped by a client leaving)."""
        reply = await self._server.client.get("/health", timeout=5)
        figures: dict[str, Any] = reply.json()
        return figures


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
