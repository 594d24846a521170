"""The Ollama engine: a supervised `ollama serve` on a loopback port, spoken to natively.

We use Ollama's native API, not its OpenAI-style `/v1`, because only the native one sets
`num_ctx` (the window) per model and per request. At start the model is made to exist: from a
GGUF file it is created (`/api/blobs` upload, then `/api/create` with `files` and
`parameters.num_ctx`, the API form of a Modelfile's `FROM` and `PARAMETER num_ctx`); by name it
is pulled. The supervisor (`supervisor.py`) restarts `ollama serve` when it dies, and the model
is made to exist again before it counts as ready.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import signal
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path
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
from deployments.fallback.supervisor import Supervisor
from deployments.fallback.tool_calls import CALL_CLOSE, CALL_OPEN, call_text, forced_call_schema

logger = logging.getLogger("ray.serve")

HASH_CHUNK = 1 << 20


class OllamaError(Exception):
    """Ollama answered with an error (`status`: its HTTP status, where it gave one)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def file_digest(path: Path) -> str:
    """Ollama names blobs by the SHA-256 of their content."""
    sha = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(HASH_CHUNK):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


class OllamaApi:
    """Ollama's documented native API (docs/api.md): what the fallback uses of it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def version(self) -> str:
        reply = await self._client.get("/api/version")
        _raise_for_error(reply)
        return str(reply.json().get("version", ""))

    async def has_model(self, name: str) -> bool:
        reply = await self._client.post("/api/show", json={"model": name})
        if reply.status_code == 404:
            return False
        _raise_for_error(reply)
        return True

    async def push_blob(self, path: Path) -> str:
        """Upload a file as a blob unless Ollama has it already; its digest."""
        digest = await asyncio.to_thread(file_digest, path)
        exists = await self._client.head(f"/api/blobs/{digest}")
        if exists.status_code != 200:
            reply = await self._client.post(
                f"/api/blobs/{digest}", content=_file_chunks(path), timeout=None
            )
            _raise_for_error(reply)
        return digest

    async def create(self, name: str, files: Mapping[str, str], parameters: dict[str, Any]) -> None:
        body = {"model": name, "files": dict(files), "parameters": parameters, "stream": False}
        reply = await self._client.post("/api/create", json=body, timeout=None)
        _raise_for_error(reply)

    async def pull(self, name: str) -> None:
        reply = await self._client.post(
            "/api/pull", json={"model": name, "stream": False}, timeout=None
        )
        _raise_for_error(reply)

    async def chat(
        self, body: dict[str, Any], path: str = "/api/chat"
    ) -> AsyncIterator[dict[str, Any]]:
        """`/api/chat` (or `/api/generate`) with `stream: true`: one JSON object per line."""
        async with self._client.stream("POST", path, json=body, timeout=None) as reply:
            if reply.status_code >= 400:
                await reply.aread()
                _raise_for_error(reply)
            async for line in reply.aiter_lines():
                if not line.strip():
                    continue
                item = json.loads(line)
                if "error" in item:
                    raise OllamaError(str(item["error"]))
                yield item


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(HASH_CHUNK):
            yield chunk


def _raise_for_error(reply: httpx.Response) -> None:
    if reply.status_code < 400:
        return
    try:
        message = reply.json().get("error", reply.text)
    except ValueError:
        message = reply.text
    raise OllamaError(f"HTTP {reply.status_code}: {message}", reply.status_code)


def chat_body(
    model: str, params: ChatParams, model_options: Mapping[str, int], keep_alive: str
) -> dict[str, Any]:
    """An `/api/chat` request: the model's options (window, GPU layers) and the limit in it."""
    messages = [_message(m) for m in params.messages]
    if params.continue_text:  # Ollama continues a trailing assistant message
        messages.append({"role": "assistant", "content": params.continue_text})
    body = {"model": model, "messages": messages, "stream": True, "keep_alive": keep_alive}
    body["options"] = _options(params, model_options)
    if params.tools:
        body["tools"] = params.tools
    forced = forced_call_schema(params.tools, params.tool_choice)
    if forced is not None:  # Ollama has no tool_choice: the call's schema as the answer's format
        body["format"] = forced
    return body


def generate_body(
    model: str, params: CompletionParams, model_options: Mapping[str, int], keep_alive: str
) -> dict[str, Any]:
    """An `/api/generate` request with `raw: true`: the prompt as sent, no template."""
    return {
        "model": model,
        "prompt": params.prompt,
        "raw": True,
        "stream": True,
        "keep_alive": keep_alive,
        "options": _options(params, model_options),
    }


def _options(params: ChatParams | CompletionParams, model: Mapping[str, int]) -> dict[str, Any]:
    options: dict[str, Any] = {**model, "num_predict": params.max_tokens}
    if params.temperature is not None:
        options["temperature"] = params.temperature
    if params.top_p is not None:
        options["top_p"] = params.top_p
    if params.stop:
        options["stop"] = list(params.stop)
    if params.seed is not None:
        options["seed"] = params.seed
    return options


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as Ollama takes it: text content, and calls with their arguments as objects."""
    plain: dict[str, Any] = {
        "role": message.get("role", "user"),
        "content": _text(message.get("content")),
    }
    calls = message.get("tool_calls") or []
    if calls:
        plain["tool_calls"] = [
            {"function": {"name": c["function"]["name"], "arguments": _arguments(c["function"])}}
            for c in calls
        ]
    return plain


def _arguments(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return arguments or {}
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _finish(item: dict[str, Any]) -> Finish:
    return Finish(
        reason="length" if item.get("done_reason") == "length" else "stop",
        prompt_tokens=int(item.get("prompt_eval_count", 0)),
        completion_tokens=int(item.get("eval_count", 0)),
    )


def _engine_error(error: OllamaError) -> Exception:
    """Ollama's error as the fallback says it: the request's fault (400) or the engine's."""
    if "context" in str(error).lower() and "exceed" in str(error).lower():
        return PromptTooLong(str(error))
    if error.status == 400:  # the request's fault (a template without tools, a format)
        return InvalidChat(str(error))
    return EngineUnavailable(str(error))


class _Reader:
    """The text of `/api/chat` lines as pieces, with the calls Ollama read itself written back
    in the Hermes format. A forced call's answer (under `format`) is held to the end: the JSON
    Ollama wrote goes between the tags, unless Ollama read it as a call itself."""

    def __init__(self, forced: bool) -> None:
        self._forced = forced
        self._held: list[str] = []
        self._calls = 0

    def pieces(self, item: dict[str, Any]) -> list[Piece]:
        message = item.get("message", {})
        pieces = []
        if message.get("content"):
            if self._forced:
                self._held.append(message["content"])
            else:
                pieces.append(Piece(message["content"]))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            self._calls += 1
            pieces.append(Piece(call_text(function.get("name", ""), function.get("arguments"))))
        if item.get("done") and self._forced and not self._calls and self._held:
            pieces.append(Piece(f"{CALL_OPEN}{''.join(self._held)}{CALL_CLOSE}"))
        return pieces


class OllamaEngine:
    """`ollama serve`, a supervised child of this replica, serving one model."""

    name = "ollama"

    def __init__(
        self,
        *,
        binary: str,
        source: str,
        model: str,
        context_window: int,
        keep_alive: str,
        models_dir: str | None = None,
        n_gpu_layers: int = 0,
        parallel: int = 1,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.parallel = parallel  # OLLAMA_NUM_PARALLEL: the replica's turns order the rest
        self._source = source
        self._gpu_layers = n_gpu_layers
        self._model = model
        self._window = context_window
        self._keep_alive = keep_alive

        def port_env(port: int) -> dict[str, str]:
            env = {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_NUM_PARALLEL": str(self.parallel)}
            if models_dir:
                env["OLLAMA_MODELS"] = models_dir
            return {**env, **gpu_env(n_gpu_layers, hidden="-1")}

        self._server = Supervisor(
            name="ollama serve",
            command=lambda _: [binary, "serve"],
            port_env=port_env,
            ready_check=self._ready_check,
            # SIGTERM lets `ollama serve` stop the runner processes it started, also when the
            # replica itself is killed (SIGKILL would orphan the runners).
            stop_signal=signal.SIGTERM,
            death_signal=signal.SIGTERM,
            sleep=sleep,
        )

    @property
    def base_url(self) -> str:
        return str(self._server.client.base_url)

    @property
    def restarts(self) -> int:
        return self._server.restarts

    @property
    def pid(self) -> int | None:
        return self._server.pid

    async def start(self) -> None:
        await self._server.start()

    async def _ready_check(self, client: httpx.AsyncClient) -> None:
        """Up, and the model exists (made again after every restart)."""
        api = OllamaApi(client)
        try:
            await api.version()
        except OllamaError as error:
            raise EngineUnavailable(str(error)) from error
        await self._ensure_model(api)

    async def _ensure_model(self, api: OllamaApi) -> None:
        if self._source.endswith(".gguf"):
            digest = await api.push_blob(Path(self._source))
            # Created every start: cheap once the blob is there, and it keeps num_ctx current.
            files = {Path(self._source).name: digest}
            await api.create(self._model, files, self._model_options())
        elif not await api.has_model(self._source):
            await api.pull(self._source)

    def _model_options(self) -> dict[str, int]:
        """The model's window, and its layers on the GPU where a count is asked (-1: Ollama
        offloads what fits, its own default): the parameters of a model created from the GGUF,
        and in every request's options too, which is how a model pulled by name gets them."""
        parameters = {"num_ctx": self._window}
        if self._gpu_layers > 0:
            parameters["num_gpu"] = self._gpu_layers
        return parameters

    @property
    def _served_model(self) -> str:
        return self._model if self._source.endswith(".gguf") else self._source

    def _api(self) -> OllamaApi:
        return OllamaApi(self._server.client)

    async def chat(self, params: ChatParams) -> AsyncGenerator[Piece | Finish, None]:
        body = chat_body(self._served_model, params, self._model_options(), self._keep_alive)
        reader = _Reader(forced="format" in body)  # the answer is the JSON of one call
        async for item in self._lines(body, "/api/chat"):
            for piece in reader.pieces(item):
                yield piece
            if item.get("done"):
                yield _finish(item)

    async def complete(self, params: CompletionParams) -> AsyncGenerator[Piece | Finish, None]:
        if not isinstance(params.prompt, str):
            raise InvalidChat("the Ollama fallback takes a text prompt, not token ids")
        body = generate_body(self._served_model, params, self._model_options(), self._keep_alive)
        echoed = not params.echo
        async for item in self._lines(body, "/api/generate"):
            if not echoed:
                echoed = True
                yield Piece(params.prompt)
            if item.get("response"):
                yield Piece(item["response"])
            if item.get("done"):
                yield _finish(item)

    async def _lines(self, body: dict[str, Any], path: str) -> AsyncIterator[dict[str, Any]]:
        """Ollama's streamed lines up to the one that says done; its failures as the engine
        errors the replica answers by (EngineUnavailable, PromptTooLong, InvalidChat)."""
        if not self._server.ready:
            raise EngineUnavailable("ollama serve is not running")
        try:
            async for item in self._api().chat(body, path=path):
                yield item
                if item.get("done"):
                    return
        except httpx.HTTPError as error:
            raise EngineUnavailable(f"ollama unreachable: {error}") from error
        except OllamaError as error:
            raise _engine_error(error) from error
        raise EngineUnavailable("ollama ended the stream without done")

    async def check_health(self) -> None:
        if not self._server.ready:
            raise EngineUnavailable("ollama serve is not running")
        try:
            await self._api().version()
        except (httpx.HTTPError, OllamaError) as error:
            raise EngineUnavailable(f"ollama serve does not answer: {error}") from error

    def close(self) -> None:
        self._server.close()

    async def aclose(self) -> None:
        await self._server.aclose()
