"""A chat answer made over into another API's HTTP answer (Anthropic's Messages, OpenAI's
Responses): its body translated, the gateway's own headers kept, a stream's text translated as
it comes and its chat stream closed with it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import orjson
from starlette.responses import Response, StreamingResponse

__all__ = [
    "ChatStreamTranslator",
    "StreamTranslator",
    "json_text",
    "kept_headers",
    "translated_events",
    "translated_stream",
]


def json_text(body: Mapping[str, Any]) -> str:
    """An event's JSON (UTF-8 kept as it is, as `ensure_ascii=False` would). The stdlib's
    where orjson refuses: an integer past 64 bits that a client's own fields brought along."""
    try:
        return orjson.dumps(body).decode()
    except TypeError:
        return json.dumps(body, ensure_ascii=False)


# Headers the translated body makes anew.
_BODY_HEADERS = frozenset({"content-length", "content-type"})


class StreamTranslator(Protocol):
    """A chat stream's SSE text in, the other API's events out."""

    @property
    def over(self) -> bool: ...

    def feed(self, text: str) -> str: ...

    def end(self) -> str: ...


class ChatStreamTranslator:
    """The part both translations share: the chat stream's SSE text cut into whole events (a
    part waits for the rest), each read as a chunk, an error after the stream began, its
    `[DONE]`, or a keep-alive comment; nothing once the translation is over. Subclasses say
    what each becomes."""

    def __init__(self) -> None:
        self._pending = ""  # text after the last whole SSE event
        self._over = False

    @property
    def over(self) -> bool:
        return self._over

    def feed(self, text: str) -> str:
        """The events for the chat stream's `text` (whole SSE events; a part waits)."""
        self._pending += text
        *whole, self._pending = self._pending.split("\n\n")
        return "".join(self._sse(raw) for raw in whole)

    def end(self) -> str:
        """What closes the translation once the chat stream is over (nothing after an error)."""
        out = self._sse(self._pending) if self._pending.strip() else ""
        self._pending = ""
        if self._over:
            return out
        self._over = True
        return out + self._closing()

    def _sse(self, raw: str) -> str:
        if self._over:
            return ""
        data = "".join(
            line[5:].lstrip() for line in raw.splitlines() if line.startswith("data:")
        ).strip()
        if not data:
            return self._keep_alive(raw.strip()) if raw.lstrip().startswith(":") else ""
        if data == "[DONE]":
            return self.end()
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return ""  # nothing a chat stream sends: not the client's to see
        if not isinstance(chunk, dict):
            return ""
        if "error" in chunk:
            self._over = True
            return self._failed(chunk["error"])
        return self._chunk(chunk)

    def _chunk(self, chunk: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def _failed(self, error: Any) -> str:
        """The events of a failure after the stream began; the translation is over."""
        raise NotImplementedError

    def _keep_alive(self, comment: str) -> str:
        """A comment the router sends while a paused answer waits for its slot."""
        raise NotImplementedError

    def _closing(self) -> str:
        """The events that end a whole answer."""
        raise NotImplementedError


def kept_headers(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in _BODY_HEADERS}


Ended = Callable[[], Awaitable[None]]


def translated_stream(
    response: StreamingResponse, translator: StreamTranslator, ended: Ended | None = None
) -> Response:
    """`ended`, where given, is awaited once the translation is over and before its last
    events go out (a stored response is kept before the client can ask for it)."""
    events = translated_events(response.body_iterator, translator, ended)
    return StreamingResponse(events, media_type="text/event-stream", headers=kept_headers(response))


async def translated_events(
    chunks: AsyncIterable[Any], translator: StreamTranslator, ended: Ended | None = None
) -> AsyncIterator[str]:
    """The chat stream's text translated as it comes. Closing this closes the chat stream (the
    client left): its slot and usage are settled there."""
    try:
        async for chunk in chunks:
            text = chunk if isinstance(chunk, str) else bytes(chunk).decode()
            out = translator.feed(text)
            if translator.over and ended is not None:
                await ended()
            if out:
                yield out
            if translator.over:
                return
        tail = translator.end()
        if ended is not None:
            await ended()
        if tail:
            yield tail
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
