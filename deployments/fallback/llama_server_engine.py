"""llama.cpp's own `llama-server` as the fallback's engine: continuous batching over parallel
slots, in a supervised child process, spoken to over loopback.

The binary is built by `make install` from the same pinned llama.cpp source as the wheel, with
the same portable flags (no AVX-512, no AMX). It decodes `parallel` sequences at once; the
replica sends it at most that many and keeps the rest in its own queue, in priority order
(llama-server's queue is first come, first served).

What the Python server (llama_cpp_python_server.py) did and this one keeps, with llama-server's
endpoints:
- exact counts: the prompt is rendered (`/apply-template`, with tools) and tokenized here
  (`/tokenize`, the BOS as `/completion` would add it), and sent as token ids: the prompt's
  count is ours, the answer's is llama-server's `tokens_predicted`, less the end token or the
  token that completed a stop string (not output, as the Python server counted);
- `continue_text` (not counted) and `resume_text` (counted) after the rendered prompt;
- a forced tool call: the answer starts with `<tool_call>` and is held to the call's schema
  (`json_schema`, which llama-server turns into a grammar);
- a client that leaves: closing the HTTP stream makes llama-server cancel the generation (or
  drop the request from its queue);
- a server that dies mid-answer: restarted by the supervisor, the answer resumed there once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
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
from deployments.fallback.llama_cpp_python_server import loosened_schema
from deployments.fallback.supervised_engine import SupervisedEngine
from deployments.fallback.tool_calls import CALL_CLOSE, CALL_OPEN
from policy.context.images import ImageSize, blank_image_url, image_data

SLOT_WINDOW_ROUND = 256  # llama-server rounds each slot's window up to a multiple of this
_NOT_OUTPUT = frozenset({"eos", "word"})  # a stop whose last sampled token is not in the text


class LlamaServerEngine(SupervisedEngine):
    label = "llama-server"
    name = "llama_server"

    def __init__(
        self,
        *,
        binary: str,
        model_path: str,
        context_window: int,
        threads: int,
        parallel: int,
        n_gpu_layers: int = 0,
        chat_template: str | None = None,
        prompt_cache_mib: int = 0,
        mmproj: str | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
    ) -> None:
        self.parallel = parallel
        self._window = context_window
        slot = -(-context_window // SLOT_WINDOW_ROUND) * SLOT_WINDOW_ROUND

        def command(port: int) -> list[str]:
            return [
                binary,
                *("--model", model_path, "--host", "127.0.0.1", "--port", str(port)),
                # One window per slot, each its own KV cache (no shared pool to run out of).
                *("--parallel", str(parallel), "--ctx-size", str(parallel * slot)),
                *("--threads", str(threads), "--n-gpu-layers", str(n_gpu_layers)),
                *("--fit", "off", "--jinja", "--no-prefill-assistant", "--no-webui"),
                *("--cache-ram", str(prompt_cache_mib)),
                *(("--chat-template-file", chat_template) if chat_template else ()),
                *(("--mmproj", mmproj) if mmproj else ()),
            ]

        super().__init__(command, n_gpu_layers=n_gpu_layers, ready_check=self_test, sleep=sleep)

    @property
    def base_url(self) -> str:
        return str(self._server.client.base_url)

    async def _chat_once(
        self, params: ChatParams, resume_text: str, forced: dict[str, Any] | None
    ) -> AsyncGenerator[Piece | Finish, None]:
        client = self._client()
        prompt = await self._render(client, params) + (CALL_OPEN if forced is not None else "")
        images = image_data(params.messages)
        if images:
            turn = self._with_images(client, params, prompt, images, resume_text, forced)
            async for item in turn:
                yield item
            return
        base = await self._tokenize(client, prompt)
        continued = prompt + params.continue_text
        resumed = continued + resume_text
        before = await self._tokenize(client, continued) if continued != prompt else base
        tokens = await self._tokenize(client, resumed) if resumed != continued else before
        if len(tokens) >= self._window:
            raise PromptTooLong(
                f"Requested tokens ({len(tokens)}) exceed context window of {self._window}"
            )
        done = len(tokens) - len(before)  # resumed tokens: already part of the answer
        max_tokens = min(params.max_tokens - done, self._window - len(tokens))
        if max_tokens <= 0:  # the resumed text had reached the limit
            yield Finish("length", len(base), done)
            return
        body: dict[str, Any] = {
            "prompt": tokens,
            "n_predict": max_tokens,
            "stop": list(params.stop),
            **_sampling(params.temperature, params.top_p, params.seed),
        }
        if forced is not None:
            body["json_schema"] = loosened_schema(forced)
            yield Piece(CALL_OPEN)  # in the prompt: the answer is read as one call
        async for item in self._generate(client, body, len(base), done):
            if isinstance(item, Finish) and forced is not None and item.reason == "stop":
                yield Piece(CALL_CLOSE)
            yield item

    async def _with_images(
        self,
        client: httpx.AsyncClient,
        params: ChatParams,
        prompt: str,
        images: list[str],
        resume_text: str,
        forced: dict[str, Any] | None,
    ) -> AsyncGenerator[Piece | Finish, None]:
        """A chat with images: its rendered prompt (a media marker where each image was) and
        the images' bytes, which llama-server's projector reads and counts (the prompt cannot
        be tokenized here). Its count is llama-server's, less what follows the rendered prompt."""
        after = params.continue_text + resume_text
        following = len(await self._tokenize(client, after, special=False)) if after else 0
        done = (
            following - len(await self._tokenize(client, params.continue_text, special=False))
            if resume_text
            else 0
        )
        max_tokens = params.max_tokens - done
        if max_tokens <= 0:  # the resumed text had reached the limit, as the text path says
            yield Finish("length", 0, done)
            return
        body: dict[str, Any] = {
            "prompt": {"prompt_string": prompt + after, "multimodal_data": images},
            "n_predict": max_tokens,
            "stop": list(params.stop),
            **_sampling(params.temperature, params.top_p, params.seed),
        }
        if forced is not None:
            body["json_schema"] = loosened_schema(forced)
            yield Piece(CALL_OPEN)
        async for item in self._generate(client, body, None, done, following):
            if isinstance(item, Finish) and forced is not None and item.reason == "stop":
                yield Piece(CALL_CLOSE)
            yield item

    async def image_tokens(self, sizes: Sequence[ImageSize]) -> list[int]:
        """The tokens an image of each (width, height) adds to a chat prompt, by llama-server's
        template and projector: a chat of one blank image of the size and one text part, less
        the same chat without the image, as llama-server evaluates each."""
        client = self._client()
        text = {"type": "text", "text": "."}
        base = await self._evaluated(client, [text], [])
        counts = []
        for size in sizes:
            url = await asyncio.to_thread(blank_image_url, size)  # off the replica's event loop
            image = {"type": "image_url", "image_url": {"url": url}}
            counts.append(
                await self._evaluated(client, [image, text], [url.partition(",")[2]]) - base
            )
        return counts

    async def _evaluated(
        self, client: httpx.AsyncClient, content: list[dict[str, Any]], images: list[str]
    ) -> int:
        messages = [{"role": "user", "content": content}]
        prompt = await self._render(client, ChatParams(messages=messages, max_tokens=1))
        body = {
            "prompt": {"prompt_string": prompt, "multimodal_data": images} if images else prompt,
            "n_predict": 0,
            "cache_prompt": False,
        }
        reply = await self._post(client, "/completion", body)
        if reply.status_code != 200:
            raise EngineUnavailable(f"llama-server would not count an image: {_message(reply)}")
        return int(reply.json()["tokens_evaluated"])

    async def complete(self, params: CompletionParams) -> AsyncGenerator[Piece | Finish, None]:
        """One attempt: a completion is not resumed on a restarted server (its client sees a
        503 and may retry; the router has already tried every other link)."""
        client = self._client()
        if isinstance(params.prompt, list):
            tokens = list(params.prompt)
        else:
            tokens = await self._tokenize(client, params.prompt)
        if not tokens or len(tokens) >= self._window:
            raise PromptTooLong(
                f"Requested tokens ({len(tokens)}) exceed context window of {self._window}"
            )
        if params.echo:
            yield Piece(await self._detokenize(client, tokens))
        body = {
            "prompt": tokens,
            "n_predict": min(params.max_tokens, self._window - len(tokens)),
            "stop": list(params.stop),
            **_sampling(params.temperature, params.top_p, params.seed),
        }
        async for item in self._generate(client, body, len(tokens), 0):
            yield item

    async def _generate(
        self,
        client: httpx.AsyncClient,
        body: dict[str, Any],
        prompt_tokens: int | None,
        done: int,
        following: int = 0,
    ) -> AsyncGenerator[Piece | Finish, None]:
        """The answer's pieces and its Finish. `prompt_tokens` None: llama-server's count of
        the prompt it evaluated, less the `following` tokens after the rendered prompt."""
        body = {**body, "stream": True, "cache_prompt": True}
        try:
            async with client.stream("POST", "/completion", json=body, timeout=None) as reply:
                if reply.status_code != 200:
                    raise _refusal(reply.status_code, await reply.aread())
                async for line in reply.aiter_lines():
                    if not line.startswith("data: "):
                        continue  # blank separators and ": " keep-alive comments
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        raise EngineUnavailable(f"llama-server: {chunk['error']}")
                    if chunk.get("content"):
                        yield Piece(chunk["content"])
                    if chunk.get("stop"):
                        stop_type = chunk.get("stop_type", "none")
                        generated = int(chunk.get("tokens_predicted", 0))
                        if stop_type in _NOT_OUTPUT and generated:
                            generated -= 1
                        reason = "length" if stop_type == "limit" else "stop"
                        if prompt_tokens is None:
                            prompt_tokens = int(chunk.get("tokens_evaluated", 0)) - following
                        yield Finish(reason, prompt_tokens, done + generated)
                        return
        except httpx.HTTPError as error:  # the server died, or never answered
            raise EngineUnavailable(f"llama-server unreachable: {error!r}") from error
        raise EngineUnavailable("llama-server ended the answer without its last chunk")

    async def _render(self, client: httpx.AsyncClient, params: ChatParams) -> str:
        body: dict[str, Any] = {"messages": params.messages, "add_generation_prompt": True}
        if params.tools:
            body["tools"] = params.tools
        reply = await self._post(client, "/apply-template", body)
        if reply.status_code != 200:  # the template rejects the conversation (roles, order)
            raise InvalidChat(f"the chat template rejects the messages: {_message(reply)}")
        return str(reply.json()["prompt"])

    async def _tokenize(
        self, client: httpx.AsyncClient, text: str, special: bool = True
    ) -> list[int]:
        """Tokens as `/completion` would make them of this text: with the BOS (unless not
        `special`: a piece after the prompt), specials parsed."""
        body = {"content": text, "add_special": special, "parse_special": True}
        reply = await self._post(client, "/tokenize", body)
        if reply.status_code != 200:
            raise EngineUnavailable(f"llama-server /tokenize: HTTP {reply.status_code}")
        return [int(t) for t in reply.json()["tokens"]]

    async def _detokenize(self, client: httpx.AsyncClient, tokens: list[int]) -> str:
        reply = await self._post(client, "/detokenize", {"tokens": tokens})
        if reply.status_code != 200:
            raise InvalidChat(f"the prompt's tokens cannot be read back: {_message(reply)}")
        return str(reply.json()["content"])

    @staticmethod
    async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return await client.post(path, json=body, timeout=30)
        except httpx.HTTPError as error:
            raise EngineUnavailable(f"llama-server unreachable: {error!r}") from error


async def self_test(client: httpx.AsyncClient) -> None:
    """Ready means loaded (`/health` says 200, 503 while loading) and one token generated."""
    health = await client.get("/health", timeout=5)
    if health.status_code != 200:
        raise EngineUnavailable(f"llama-server /health: HTTP {health.status_code}")
    reply = await client.post("/completion", json={"prompt": "Hi", "n_predict": 1}, timeout=30)
    if reply.status_code != 200 or not reply.json().get("stop"):
        raise EngineUnavailable(f"self-test failed: HTTP {reply.status_code}: {reply.text[:200]}")


def _sampling(temperature: float | None, top_p: float | None, seed: int | None) -> dict[str, Any]:
    options = {"temperature": temperature, "top_p": top_p, "seed": seed}
    return {key: value for key, value in options.items() if value is not None}


def _refusal(status: int, raw: bytes) -> Exception:
    """llama-server's answer before any output: the client's (400) or the engine's."""
    try:
        error = json.loads(raw).get("error") or {}
    except ValueError:
        error = {}
    message = str(error.get("message") or raw[:200])
    if status == 400 and error.get("type") == "exceed_context_size_error":
        return PromptTooLong(message)
    if status == 400 and message == "Prompt contains invalid tokens":
        return InvalidChat("a token id of the prompt is outside the vocabulary")
    if status == 400:
        return InvalidChat(message)
    return EngineUnavailable(f"llama-server: HTTP {status}: {message}")


def _message(reply: httpx.Response) -> str:
    try:
        return str(reply.json().get("error", {}).get("message") or reply.text[:200])
    except ValueError:
        return reply.text[:200]
