"""The CPU fallback replica: a Serve deployment with no GPU, at the end of every chain.

It takes the gateway's requests (core/requests.py) and answers in the plain data a vLLM replica
does (core/answers.py), so the router drives it as any other link. Nothing is sent until the
engine has produced its first piece: a failure before
that is a 503 the router fails over on; a failure after it ends the stream with an error event.
The engine is chosen on the node the replica runs on: `auto` takes Ollama where its binary is
on PATH, llama.cpp otherwise; either runs as a supervised child process (`supervisor`), so a
crash of native code costs a restart, never the replica.
Requests beyond the engine's width wait their turn here (`turns`), by the router's classes and
shares; a `make reload` retunes that line in place (deployments/live_config.py: the replica
follows its build's published config as the ingress and router replicas do, and acks it).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.answers import EngineError, Item
from core.config import ClusterConfig, RouterConfig
from core.errors import ErrorCode
from core.requests import ChatRequest, CompletionRequest
from deployments.engine.quiet_polls import quiet_polls
from deployments.fallback.engine import (
    FallbackEngine,
    Finish,
    InvalidChat,
    Piece,
    PromptTooLong,
    ReadsImages,
)
from deployments.fallback.openai_format import (
    ChatShaper,
    CompletionShaper,
    chat_params,
    completion_params,
    error_response,
)
from deployments.fallback.turns import PriorityTurns, TurnRules
from deployments.live_config import Homes, LiveConfigSync, serve_live_config
from policy.context.prompt_fit import COMPLETION_DEFAULT_MAX_TOKENS
from policy.request.tools import calls_tools

logger = logging.getLogger("ray.serve")


class NoEngine(Exception):
    """The configured engine cannot run on this node; the message says what to change."""


@dataclass(frozen=True)
class FallbackSettings:
    """What the replica needs of the config, resolved where the app is built."""

    engine: str  # ollama | llama_cpp | auto
    source: str  # absolute GGUF path, or an Ollama model name
    model_id: str  # the name it answers as
    context_window: int
    threads: int
    ollama_model: str
    keep_alive: str
    ollama_models_dir: str | None = None
    n_gpu_layers: int = 0  # layers offloaded to a GPU (0: the GPU hidden from the engine; -1 all)
    parallel: int = 4  # sequences decoded at once (llama-server's slots, OLLAMA_NUM_PARALLEL)
    prompt_cache_mib: int = 0  # llama-server's --cache-ram
    chat_template: str | None = None  # llama.cpp: the template file for the GGUF's own (tools)
    mmproj: str | None = None  # llama-server: the projector GGUF it reads images with
    # The line's rules as built (router.aging_s, class_shares, engine_priorities): TurnRules
    # at the engine's width, which only the engine knows; a reload retunes them.
    router: RouterConfig = field(default_factory=RouterConfig)


def choose_engine(
    requested: str,
    ollama_binary: str | None,
    source_is_file: bool,
    jinja_template: bool = False,
    llama_server_binary: str | None = None,
    llama_cpp_installed: bool = True,
    reads_images: bool = False,
) -> str:
    """`auto` prefers Ollama, unless a Jinja chat template is configured (`fallback.tools`),
    which only llama.cpp renders; then llama.cpp's own server where make install built it,
    else the Python one. llama.cpp needs a GGUF file, Ollama needs its binary. A projector
    (`fallback.mmproj`: images) is read by llama-server only."""
    if reads_images:
        if llama_server_binary is None:
            raise NoEngine(
                "fallback.mmproj: only llama-server reads images here, and there is no "
                "`llama-server` binary beside this node's Python or on its PATH (make install "
                "builds it)"
            )
        return "llama_server"
    if requested == "auto":
        if ollama_binary is not None and not (jinja_template and source_is_file):
            requested = "ollama"
        elif llama_server_binary is not None and source_is_file:
            requested = "llama_server"
        else:
            requested = "llama_cpp" if source_is_file or ollama_binary is None else "ollama"
    if requested == "ollama" and ollama_binary is None:
        raise NoEngine(
            "fallback.engine is ollama but there is no `ollama` binary on this node's PATH; "
            "install Ollama there or use engine llama_server, llama_cpp (or auto)"
        )
    if requested == "llama_server" and llama_server_binary is None:
        raise NoEngine(
            "fallback.engine is llama_server but there is no `llama-server` binary beside this "
            "node's Python or on its PATH (make install builds it); use llama_cpp (or auto)"
        )
    if requested in ("llama_cpp", "llama_server") and not source_is_file:
        raise NoEngine(
            "fallback.source names an Ollama model, which llama.cpp cannot load, and there is "
            "no `ollama` binary on this node's PATH; point source at a .gguf file"
        )
    if requested == "llama_cpp" and not llama_cpp_installed:
        raise NoEngine(
            "fallback.engine is llama_cpp (or auto found no llama-server or ollama) but "
            "llama-cpp-python is not installed in this node's Python: `make llama-cpp-python` "
            "installs it; or use engine llama_server (make install builds it)"
        )
    return requested


def llama_server_binary() -> str | None:
    """The `llama-server` make install put beside this Python (the venv's bin), or one on PATH."""
    beside = Path(sys.executable).with_name("llama-server")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("llama-server")


def make_engine(settings: FallbackSettings) -> FallbackEngine:
    binary, server = shutil.which("ollama"), llama_server_binary()
    chosen = choose_engine(
        settings.engine,
        binary,
        settings.source.endswith(".gguf"),
        jinja_template=settings.chat_template is not None,
        llama_server_binary=server,
        # An optional extra (make llama-cpp-python): the default engine is llama-server.
        llama_cpp_installed=importlib.util.find_spec("llama_cpp") is not None,
        reads_images=settings.mmproj is not None,
    )
    if chosen == "ollama":
        from deployments.fallback.ollama import OllamaEngine

        assert binary is not None
        return OllamaEngine(
            binary=binary,
            source=settings.source,
            model=settings.ollama_model,
            context_window=settings.context_window,
            keep_alive=settings.keep_alive,
            models_dir=settings.ollama_models_dir,
            n_gpu_layers=settings.n_gpu_layers,
            parallel=settings.parallel,
        )
    if chosen == "llama_server":
        from deployments.fallback.llama_server_engine import LlamaServerEngine

        assert server is not None
        return LlamaServerEngine(
            binary=server,
            model_path=settings.source,
            context_window=settings.context_window,
            threads=settings.threads,
            parallel=settings.parallel,
            n_gpu_layers=settings.n_gpu_layers,
            chat_template=settings.chat_template,
            prompt_cache_mib=settings.prompt_cache_mib,
            mmproj=settings.mmproj,
        )
    from deployments.fallback.llama_cpp_python_engine import LlamaCppEngine

    return LlamaCppEngine(
        model_path=settings.source,
        context_window=settings.context_window,
        threads=settings.threads,
        n_gpu_layers=settings.n_gpu_layers,
        chat_template=settings.chat_template,
    )


async def _first_piece(
    pieces: AsyncGenerator[Piece | Finish, None],
) -> Piece | Finish | EngineError:
    """The engine's first piece, or the error to answer with: the request's (400) or, with
    nothing sent yet, the engine's (503, which the router fails over on)."""
    try:
        return await anext(pieces)
    except PromptTooLong as error:
        return error_response(400, ErrorCode.CONTEXT_LENGTH_EXCEEDED, str(error))
    except InvalidChat as error:
        return error_response(400, ErrorCode.INVALID_REQUEST, str(error))
    except (Exception, StopAsyncIteration) as error:  # noqa: BLE001 - nothing sent: the router fails over
        return error_response(503, ErrorCode.BACKEND_UNAVAILABLE, f"CPU fallback: {error!r}")


def _completion_refusal(request: CompletionRequest) -> str | None:
    """What the fallback's engines cannot do for a completion, said as the client's 400."""
    if (request.n or 1) > 1:
        return "The CPU fallback answers n=1 only."
    if request.logprobs is not None:
        return "The CPU fallback gives no logprobs; ask again without them, or later."
    if request.suffix is not None:  # the router writes FIM prompts; a suffix here was not fitted
        return "The CPU fallback takes no suffix."
    return None


class CpuFallback:
    async def __init__(  # type: ignore[misc]  # Serve awaits an async __init__
        self,
        settings: FallbackSettings,
        engine_factory: Callable[[FallbackSettings], FallbackEngine] = make_engine,
        build: str = "",
    ) -> None:
        quiet_polls()
        self._settings = settings
        self._engine = engine_factory(settings)
        width = self._engine.parallel
        self._turns = PriorityTurns(width, TurnRules.of(width, settings.router))
        # Before the engine starts (minutes, for a model's load): a reload published meanwhile
        # is applied and acked while it loads, not held up by it.
        self._live: LiveConfigSync | None = (
            serve_live_config(build, self.apply_config) if build else None
        )
        await self._engine.start()
        logger.info("CPU fallback serving %s with %s", settings.source, self._engine.name)

    def apply_config(self, config: ClusterConfig, homes: Homes | None = None) -> None:
        """A reload (deployments/live_config.py): the router's aging, shares and engine numbers
        order the line from now."""
        self._turns.retune(TurnRules.of(self._turns.width, config.router))

    async def engine(self) -> str:
        """Which engine serves (ollama or llama_cpp)."""
        return self._engine.name

    async def chat(self, request: ChatRequest) -> AsyncIterator[Item]:
        if (request.n or 1) > 1:
            yield error_response(
                400, ErrorCode.INVALID_REQUEST, "The CPU fallback answers n=1 only."
            )
            return
        # Closed as soon as the client leaves: the engine stops now and the next waiter goes.
        async with self._turns.turn(request.priority or 0), aclosing(self._chat(request)) as items:
            async for item in items:
                yield item

    async def _chat(self, request: ChatRequest) -> AsyncGenerator[Any, None]:
        default_max = max(1, self._settings.context_window // 4)
        pieces = self._engine.chat(chat_params(request, default_max))
        shaper = ChatShaper(self._settings.model_id, request.include_usage)
        try:
            first = await _first_piece(pieces)
            if isinstance(first, EngineError):
                yield first
            elif calls_tools(request):  # calls are read from the whole text, then sent
                answer = await self._collect(first, pieces)
                named = isinstance(request.tool_choice, dict)
                if isinstance(answer, EngineError):
                    yield answer
                else:
                    text, finish = answer
                    yield (
                        shaper.with_calls(text, finish, named=named)
                        if request.stream
                        else shaper.whole(text, finish, tools=True, named=named)
                    )
            elif request.stream:
                async for item in self._stream(first, pieces, shaper):
                    yield item
            else:
                answer = await self._collect(first, pieces)
                yield answer if isinstance(answer, EngineError) else shaper.whole(*answer)
        finally:
            await pieces.aclose()  # a client that left stops the engine now, not at collection

    async def completions(self, request: CompletionRequest) -> AsyncIterator[Any]:
        """A raw prompt (the router has fitted it, a FIM prompt written out), no template."""
        refusal = _completion_refusal(request)
        if refusal is not None:
            yield error_response(400, ErrorCode.INVALID_REQUEST, refusal)
            return
        # Closed as soon as the client leaves: the engine stops now and the next waiter goes.
        async with (
            self._turns.turn(request.priority or 0),
            aclosing(self._completions(request)) as items,
        ):
            async for item in items:
                yield item

    async def _completions(self, request: CompletionRequest) -> AsyncGenerator[Any, None]:
        pieces = self._engine.complete(completion_params(request, COMPLETION_DEFAULT_MAX_TOKENS))
        shaper = CompletionShaper(self._settings.model_id, request.include_usage)
        try:
            first = await _first_piece(pieces)
            if isinstance(first, EngineError):
                yield first
            elif request.stream:
                async for lines in self._stream_completion(first, pieces, shaper):
                    yield lines
            else:
                answer = await self._collect(first, pieces)
                yield answer if isinstance(answer, EngineError) else shaper.whole(*answer)
        finally:
            await pieces.aclose()

    async def _stream_completion(
        self,
        first: Piece | Finish,
        pieces: AsyncGenerator[Piece | Finish, None],
        shaper: CompletionShaper,
    ) -> AsyncIterator[list[Any]]:
        item: Piece | Finish = first
        try:
            while isinstance(item, Piece):
                yield [shaper.text(item.text)]
                item = await anext(pieces)
        except Exception as error:  # noqa: BLE001 - after the first token: an error event, never a hang
            logger.warning("CPU fallback failed mid-stream: %s", error)
            yield [error_response(503, ErrorCode.BACKEND_UNAVAILABLE, f"CPU fallback: {error}")]
            return
        yield shaper.closing(item)

    async def _stream(
        self,
        first: Piece | Finish,
        pieces: AsyncGenerator[Piece | Finish, None],
        shaper: ChatShaper,
    ) -> AsyncIterator[Any]:
        if isinstance(first, Finish):  # nothing generated at all
            yield [*shaper.opening(""), *shaper.closing(first)]
            return
        yield shaper.opening(first.text)
        try:
            async for piece in pieces:
                if isinstance(piece, Finish):
                    yield shaper.closing(piece)
                    return
                yield [shaper.text(piece.text)]
        except Exception as error:  # noqa: BLE001 - after the first token: an error event, never a hang
            logger.warning("CPU fallback failed mid-stream: %s", error)
            yield [error_response(503, ErrorCode.BACKEND_UNAVAILABLE, f"CPU fallback: {error}")]

    async def _collect(
        self, first: Piece | Finish, pieces: AsyncGenerator[Piece | Finish, None]
    ) -> tuple[str, Finish] | EngineError:
        """The whole text and its Finish, or the error that ended it before any was sent."""
        text: list[str] = []
        item: Piece | Finish = first
        try:
            while isinstance(item, Piece):
                text.append(item.text)
                item = await anext(pieces)
        except Exception as error:  # noqa: BLE001 - nothing was sent yet: a fault the router fails over on
            return error_response(503, ErrorCode.BACKEND_UNAVAILABLE, f"CPU fallback: {error}")
        return "".join(text), item

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def image_tokens(self, sizes: list[tuple[int, int]]) -> list[int] | None:
        """The tokens an image of each (width, height) adds to a chat prompt here; None where
        the fallback reads no images (no `fallback.mmproj`)."""
        if self._settings.mmproj is None or not isinstance(self._engine, ReadsImages):
            return None
        return await self._engine.image_tokens([(int(w), int(h)) for w, h in sizes])

    async def kv_cache_usage(self) -> float | None:
        """No KV-cache reading: the router's pressure breaker leaves the fallback alone."""
        return None

    async def engine_counters(self) -> dict[str, Any] | None:
        """No preemptions, no prefix cache to count."""
        return None

    async def aclose(self) -> None:
        """Stop the engine and wait for it (tests; Serve calls `__del__`, which cannot wait)."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            await engine.aclose()

    def __del__(self) -> None:  # Serve calls it when the replica is shut down
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()
