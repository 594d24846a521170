"""A chat answer made over into another API's HTTP answer (Anthropic's Messages, OpenAI's
Responses): its body translated, the gateway's own headers kept, a stream's text translated as
it comes and its chat stream closed with it."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Protocol

from starlette.responses import Response, StreamingResponse

__all__ = ["StreamTranslator", "kept_headers", "translated_stream"]

# Headers the translated body makes anew.
_BODY_HEADERS = frozenset({"content-length", "content-type"})


class StreamTranslator(Protocol):
    """A chat stream's SSE text in, the other API's events out."""

    @property
    def over(self) -> bool: ...

    def feed(self, text: str) -> str: ...

    def end(self) -> str: ...


def kept_headers(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in _BODY_HEADERS}


def translated_stream(response: StreamingResponse, translator: StreamTranslator) -> Response:
    events = _events(response.body_iterator, translator)
    return StreamingResponse(events, media_type="text/event-stream", headers=kept_headers(response))


async def _events(chunks: AsyncIterable[Any], translator: StreamTranslator) -> AsyncIterator[str]:
    """The chat stream's text translated as it comes. Closing this closes the chat stream (the
    client left): its slot and usage are settled there."""
    try:
        async for chunk in chunks:
            text = chunk if isinstance(chunk, str) else bytes(chunk).decode()
            out = translator.feed(text)
            if out:
                yield out
            if translator.over:
                return
        tail = translator.end()
        if tail:
            yield tail
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
