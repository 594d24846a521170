"""llama.cpp as the fallback's engine server, run as a child process of the fallback replica:
`python -m deployments.fallback.llama_cpp_python_server --model X.gguf --port P`.

Why not llama-cpp-python's own OpenAI server: its streams carry no token counts, and the router
bills and fits by exact counts. This server is the same library with a protocol shaped like
Ollama's native one: `POST /chat` answers NDJSON lines, `{"text": ...}` as tokens come and one
closing `{"done": true, "reason", "prompt_tokens", "completion_tokens"}`; errors found before
the first token are HTTP 400 (`{"error", "kind": "prompt_too_long" | "invalid"}`). `GET
/health` answers once the model is loaded (the server listens only after that).

`continue_text` continues an answer cut short (a replica that died mid-stream, or this server
before a restart): the prompt is the chat template with the generation prompt, then that text,
so the model goes on where it stopped. As with vLLM's `continue_final_message` and Ollama, its
tokens are not counted: `max_tokens` and `completion_tokens` are about new tokens. Text this
server produced itself before it died goes in `resume_text`, after it: those tokens do count,
so an answer resumed after a restart has the limit and the count of one that never stopped.

Tools: `tools` render through the chat template (`--chat-template FILE` where the GGUF's own
ignores them); the answer is plain text, its calls in the Hermes format, which the replica reads
back (`tool_calls.py`). A `tool_choice` that forces a call (`required`, a named function) starts
the answer with `<tool_call>` and holds the rest to that call's JSON schema with a grammar.

One llama.cpp context decodes one sequence at a time: requests run in order on one worker
thread; a client that goes away stops its generation at the next token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.fallback.tool_calls import CALL_CLOSE, CALL_OPEN, forced_call_schema

_END = object()


class BadRequest(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Prepared:
    tokens: list[int]  # the prompt, with any continued and resumed text
    prompt_tokens: int  # of the prompt alone
    resumed_tokens: int  # of the resumed text: already part of the answer
    stop: list[str]
    max_tokens: int  # still to generate
    forced: Any = None  # the grammar of a call the answer must be (a LlamaGrammar)


class _TokenTally:
    """A llama.cpp logits processor that counts the tokens it samples."""

    def __init__(self) -> None:
        self.samples = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.samples += 1
        return scores


class LlamaChat:
    """The model, its chat template, and one worker thread that owns both."""

    def __init__(self, llama: Any, template: str | None = None) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._llama = llama
        template = template or llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise SystemExit("the GGUF has no tokenizer.chat_template: it cannot serve chats")
        vocab = llama._model
        eos, bos = llama.token_eos(), llama.token_bos()
        self._format = Jinja2ChatFormatter(
            template=template,
            eos_token=vocab.token_get_text(eos) if eos != -1 else "",
            bos_token=vocab.token_get_text(bos) if bos != -1 else "",
        )
        self.window = llama.n_ctx()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-cpp")
        self.cancelled = 0  # generations stopped because their client left

    def prepare(self, body: dict[str, Any]) -> Prepared:
        tools = body.get("tools") or None
        forced = _grammar(forced_call_schema(tools, body.get("tool_choice")))
        try:
            rendered = self._format(messages=body["messages"], tools=tools)
        except Exception as error:  # noqa: BLE001 - the template rejects the conversation (roles, order)
            raise BadRequest(
                "invalid", f"the chat template rejects the messages: {error}"
            ) from None
        prompt = rendered.prompt + (CALL_OPEN if forced is not None else "")
        base = self._tokenize(prompt, rendered.added_special)
        continued = prompt + str(body.get("continue_text") or "")
        resumed = continued + str(body.get("resume_text") or "")
        before = self._tokenize(continued, rendered.added_special) if continued != prompt else base
        tokens = self._tokenize(resumed, rendered.added_special) if resumed != continued else before
        if len(tokens) >= self.window:
            raise BadRequest(
                "prompt_too_long",
                f"Requested tokens ({len(tokens)}) exceed context window of {self.window}",
            )
        stop = [str(s) for s in body.get("stop") or []]
        stop += rendered.stop if isinstance(rendered.stop, list) else [rendered.stop]
        room = self.window - len(tokens)
        done = len(tokens) - len(before)
        max_tokens = min(int(body.get("max_tokens") or room) - done, room)
        return Prepared(tokens, len(base), done, [s for s in stop if s], max_tokens, forced)

    def prepare_completion(self, body: dict[str, Any]) -> Prepared:
        """A raw prompt (text, FIM markers parsed as the special tokens they are, or token ids),
        no template: what `/v1/completions` sends."""
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            vocabulary = self._llama.n_vocab()
            if not all(isinstance(t, int) and 0 <= t < vocabulary for t in prompt):
                raise BadRequest(
                    "invalid", f"a token id is outside the vocabulary (0..{vocabulary - 1})"
                )
            tokens = list(prompt)
        else:
            tokens = self._llama.tokenize(str(prompt).encode("utf-8"), add_bos=True, special=True)
        if not tokens or len(tokens) >= self.window:
            raise BadRequest(
                "prompt_too_long",
                f"Requested tokens ({len(tokens)}) exceed context window of {self.window}",
            )
        room = self.window - len(tokens)
        max_tokens = min(int(body.get("max_tokens") or 16), room)
        stop = [str(s) for s in body.get("stop") or [] if s]
        return Prepared(tokens, len(tokens), 0, stop, max_tokens)

    def echo(self, prepared: Prepared) -> str:
        """The prompt as text, for `echo` (what a token-id prompt says)."""
        text: bytes = self._llama.detokenize(prepared.tokens)
        return text.decode("utf-8", errors="replace")

    def _tokenize(self, text: str, added_special: bool) -> list[int]:
        tokens: list[int] = self._llama.tokenize(
            text.encode("utf-8"), add_bos=not added_special, special=True
        )
        return tokens

    def generate(
        self, prepared: Prepared, body: dict[str, Any], cancelled: threading.Event
    ) -> Iterator[dict[str, Any]]:
        from llama_cpp import LogitsProcessorList

        if prepared.max_tokens <= 0:  # the resumed text had reached the limit
            yield self._done("length", prepared, 0)
            return
        tally = _TokenTally()
        options = {k: body[k] for k in ("temperature", "top_p", "seed") if body.get(k) is not None}
        if prepared.forced is not None:
            options["grammar"] = prepared.forced
            yield {"text": CALL_OPEN}  # in the prompt: the answer is read as one call
        chunks = self._llama.create_completion(
            prompt=prepared.tokens,
            max_tokens=prepared.max_tokens,
            stop=prepared.stop,
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
            if choice.get("text"):
                yield {"text": choice["text"]}
            if choice.get("finish_reason"):
                reason = "length" if choice["finish_reason"] == "length" else "stop"
        if prepared.forced is not None and reason == "stop":
            yield {"text": CALL_CLOSE}
        # A stop ends on a sampled end token that is not output; a length limit does not.
        generated = tally.samples - 1 if reason == "stop" and tally.samples else tally.samples
        yield self._done(reason, prepared, generated)

    @staticmethod
    def _done(reason: str, prepared: Prepared, generated: int) -> dict[str, Any]:
        return {
            "done": True,
            "reason": reason,
            "prompt_tokens": prepared.prompt_tokens,
            "completion_tokens": prepared.resumed_tokens + generated,
        }


def _grammar(schema: dict[str, Any] | None) -> Any:
    """The grammar that holds an answer to `schema`; a schema llama.cpp cannot turn into one
    is the client's error (a 400), never the engine's."""
    if schema is None:
        return None
    from llama_cpp import LlamaGrammar

    try:
        return LlamaGrammar.from_json_schema(json.dumps(loosened_schema(schema)), verbose=False)
    except Exception as error:  # noqa: BLE001 - the converter raises anything on odd schemas
        raise BadRequest("invalid", f"the tool's parameters cannot be decoded: {error}") from None


# llama.cpp spells a length or count bound out as that many grammar rules: a bound past this
# is left out (the answer is held to the rest of the schema) instead of a grammar of millions.
MAX_GRAMMAR_BOUND = 256
_BOUNDS = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
)


def loosened_schema(schema: Any) -> Any:
    if isinstance(schema, list):
        return [loosened_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: loosened_schema(value)
        for key, value in schema.items()
        if not (key in _BOUNDS and isinstance(value, int) and value > MAX_GRAMMAR_BOUND)
    }


def build_app(chat: LlamaChat) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def health(_: Request) -> Response:
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES")  # "": hidden (n_gpu_layers 0)
        figures = {"ok": True, "window": chat.window, "cancelled": chat.cancelled}
        return JSONResponse({**figures, "cuda_visible_devices": gpus})

    async def chat_route(request: Request) -> Response:
        body = await request.json()
        loop = asyncio.get_running_loop()
        try:
            prepared = await loop.run_in_executor(chat.worker, chat.prepare, body)
        except BadRequest as error:
            return JSONResponse({"error": str(error), "kind": error.kind}, status_code=400)
        return StreamingResponse(_lines(chat, prepared, body), media_type="application/x-ndjson")

    async def complete_route(request: Request) -> Response:
        body = await request.json()
        loop = asyncio.get_running_loop()
        try:
            prepared = await loop.run_in_executor(chat.worker, chat.prepare_completion, body)
        except BadRequest as error:
            return JSONResponse({"error": str(error), "kind": error.kind}, status_code=400)
        echo = None
        if body.get("echo"):  # a text prompt is its own echo; token ids are read by the model
            prompt = body.get("prompt")
            echo = prompt if isinstance(prompt, str) else None
            echo = echo or await loop.run_in_executor(chat.worker, chat.echo, prepared)
        lines = _lines(chat, prepared, body, echo)
        return StreamingResponse(lines, media_type="application/x-ndjson")

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/chat", chat_route, methods=["POST"]),
            Route("/complete", complete_route, methods=["POST"]),
        ]
    )


async def _lines(
    chat: LlamaChat, prepared: Prepared, body: dict[str, Any], echo: str | None = None
) -> AsyncIterator[str]:
    """The generation's lines, as the worker thread produces them (after the prompt's text
    when it is to be echoed: not generated, not counted)."""
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[Any] = asyncio.Queue()
    cancelled = threading.Event()

    def emit(item: Any) -> None:
        loop.call_soon_threadsafe(out.put_nowait, item)

    def work() -> None:
        try:
            if not cancelled.is_set():  # the client left while it waited its turn
                for line in chat.generate(prepared, body, cancelled):
                    emit(line)
        except Exception as error:  # noqa: BLE001 - reported in the stream, never lost in the thread
            emit({"error": f"{type(error).__name__}: {error}", "kind": "engine"})
        finally:
            emit(_END)

    loop.run_in_executor(chat.worker, work)
    try:
        if echo:
            yield json.dumps({"text": echo}) + "\n"
        while (item := await out.get()) is not _END:
            yield json.dumps(item) + "\n"
    finally:
        cancelled.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--chat-template", help="a Jinja chat template file, for the GGUF's own")
    args = parser.parse_args()

    import uvicorn
    from llama_cpp import Llama

    llama = Llama(
        model_path=args.model,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        verbose=False,
    )
    template = Path(args.chat_template).read_text() if args.chat_template else None
    app = build_app(LlamaChat(llama, template))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
