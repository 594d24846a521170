"""The llama.cpp engine, in-process (`llama-cpp-python`, the engine Ollama itself wraps).

For nodes without an `ollama` binary. One llama.cpp context decodes one sequence at a time, so
requests run one after another on a single worker thread (the router's cap bounds how many wait
here); each streams its tokens back to the event loop as they come. A client that goes away
stops its generation at the next token.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from deployments.fallback.engine import (
    ChatParams,
    EngineUnavailable,
    Finish,
    Piece,
    PromptTooLong,
)

_END = object()


class _TokenTally:
    """A llama.cpp logits processor that counts: it sees the prompt plus every sampled token."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.samples = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.samples == 0:
            self.prompt_tokens = len(input_ids)
        self.samples += 1
        return scores


class LlamaCppEngine:
    name = "llama_cpp"

    def __init__(self, *, model_path: str, context_window: int, threads: int) -> None:
        self._model_path = model_path
        self._window = context_window
        self._threads = threads
        self._llama: Any = None
        self.cancelled = 0  # generations stopped early because their client left
        # One thread: the context is not shareable, and queued requests keep their order.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-cpp")

    async def start(self) -> None:
        from llama_cpp import Llama

        def load() -> Any:
            return Llama(
                model_path=self._model_path,
                n_ctx=self._window,
                n_threads=self._threads,
                n_threads_batch=self._threads,
                verbose=False,
            )

        self._llama = await asyncio.get_running_loop().run_in_executor(self._worker, load)

    async def chat(self, params: ChatParams) -> AsyncGenerator[Piece | Finish, None]:
        if self._llama is None:
            raise EngineUnavailable("the llama.cpp model is not loaded")
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[Any] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(item: Any) -> None:
            loop.call_soon_threadsafe(out.put_nowait, item)

        def generate() -> None:
            try:
                if not cancelled.is_set():  # the client left while it waited its turn
                    for item in self._generate(params, cancelled):
                        emit(item)
            except BaseException as error:  # handed to the caller, never lost in the thread
                emit(error)
            finally:
                emit(_END)

        loop.run_in_executor(self._worker, generate)  # it reports through `out`
        try:
            while (item := await out.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancelled.set()

    def _generate(self, params: ChatParams, cancelled: threading.Event) -> Iterator[Piece | Finish]:
        from llama_cpp import LogitsProcessorList

        tally = _TokenTally()
        options: dict[str, Any] = {"stop": list(params.stop)}
        if params.temperature is not None:
            options["temperature"] = params.temperature
        if params.top_p is not None:
            options["top_p"] = params.top_p
        if params.seed is not None:
            options["seed"] = params.seed
        try:
            chunks = self._llama.create_chat_completion(
                messages=params.messages,
                max_tokens=params.max_tokens,
                stream=True,
                logits_processor=LogitsProcessorList([tally]),
                **options,
            )
            reason = "stop"
            for chunk in chunks:
                if cancelled.is_set():
                    chunks.close()  # stops decoding now
                    self.cancelled += 1
                    return
                choice = chunk["choices"][0]
                text = choice.get("delta", {}).get("content")
                if text:
                    yield Piece(text)
                if choice.get("finish_reason"):
                    reason = "length" if choice["finish_reason"] == "length" else "stop"
        except ValueError as error:  # "Requested tokens (N) exceed context window of M"
            if "context window" in str(error):
                raise PromptTooLong(str(error)) from error
            raise
        # A stop ends on a sampled end token that is not output; a length limit does not.
        completion = tally.samples - 1 if reason == "stop" and tally.samples else tally.samples
        yield Finish(reason, tally.prompt_tokens, completion)

    async def check_health(self) -> None:
        if self._llama is None:
            raise EngineUnavailable("the llama.cpp model is not loaded")

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._llama = None
