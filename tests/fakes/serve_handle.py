"""What the ingress uses of a Serve deployment handle, for tests that drive an `Ingress` with a
router of their own: `handle.method.remote(job)` and the stream it gives back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.requests import EmbeddingRequest
from core.wire import ChatJob, Opening, Routed
from deployments.fallback.engine import Finish
from deployments.fallback.openai_format import ChatShaper


class ItemStream:
    """A DeploymentResponseGenerator over fixed items."""

    def __init__(self, items: list[Any]) -> None:
        self._items = iter(items)

    def __aiter__(self) -> ItemStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        pass


class HandleMethod:
    """`handle.<method>`: `.remote(job)` calls `answer(job)`."""

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self._answer = answer

    def remote(self, job: Any) -> Any:
        return self._answer(job)


PROMPT, COMPLETION = 30, 25  # what EngineLikeRouter's engine reports for every answer


class EngineLikeRouter:
    """Answers like an engine: `usage` in a whole answer; in a stream only when asked."""

    def __init__(self) -> None:
        self.jobs: list[ChatJob] = []
        self.chat = HandleMethod(self._stream)
        self.chat_once = HandleMethod(self._once)

    def options(self, **_: Any) -> EngineLikeRouter:
        return self

    def _shaper(self, job: ChatJob) -> ChatShaper:
        self.jobs.append(job)
        request = job.request
        usage = not isinstance(request, EmbeddingRequest) and request.include_usage
        return ChatShaper("orchestrator", usage)

    async def _once(self, job: ChatJob) -> Opening:
        shaper = self._shaper(job)
        return Opening(_routed(), shaper.whole("Hi.", Finish("stop", PROMPT, COMPLETION)))

    def _stream(self, job: ChatJob) -> Any:
        shaper = self._shaper(job)
        closing = shaper.closing(Finish("stop", PROMPT, COMPLETION))
        return ItemStream(
            [Opening(_routed(), [*shaper.opening("Hi."), *closing, "data: [DONE]\n\n"])]
        )


def _routed() -> Routed:
    return Routed("orchestrator@local", 32, PROMPT, False, 0, False, False, engine_wait_s=0.004)
