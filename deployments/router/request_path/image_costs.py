"""What each image of a chat costs on a link: its size read from its header, and the tokens an
image of that size adds as the link's engine says (asked once per size and model, then kept).

An engine that cannot say (no such method, an error, no answer in time) leaves an estimate above
what any processor gives (policy.context.images), and the count is then not exact: the fit keeps
the estimate's margin, never drops the newest message's images on it, and the engine is asked
again after ASK_AGAIN_AFTER_S. One ask at a time per model and size; the blank images are made
off the engines' event loops.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor

from core.clock import Clock
from deployments.router.request_path.link import Link
from policy.context.images import (
    ImageCounter,
    ImageSize,
    estimated_image_tokens,
    image_size,
    image_urls,
)
from policy.context.tokens import Message, TokenCounter

__all__ = ["ImageCosts"]

logger = logging.getLogger("ray.serve")

# Sizes kept per model: screenshots come in a few sizes, photos in many.
SIZES_KEPT = 4096
# An engine's answer for new sizes: blank images, processed in milliseconds (an engine asleep
# gets its model's wake_timeout_s).
ASK_TIMEOUT_S = 10.0
# After an engine could not say, how long its link's images are estimated without asking again.
ASK_AGAIN_AFTER_S = 30.0


class ImageCosts:
    def __init__(self, executor: Executor, clock: Clock) -> None:
        self._executor = executor  # the fitter's thread: sizes are read off the event loop
        self._clock = clock
        self._known: dict[str, OrderedDict[ImageSize, int]] = {}
        # One ask at a time per model and size: requests with a new size wait for its answer.
        self._asking: dict[tuple[str, ImageSize], asyncio.Future[int | None]] = {}
        self._quiet_until: dict[str, float] = {}

    def forget(self) -> None:
        """A reload may change a model's processor (its mm_processor_kwargs): ask again."""
        self._known.clear()

    async def counter(
        self, link: Link, base: TokenCounter, messages: Sequence[Message]
    ) -> ImageCounter:
        """`base` with the images of `messages` counted as `link`'s engine expands them."""
        urls = list(dict.fromkeys(url for m in messages for _, url in image_urls(m)))
        loop = asyncio.get_running_loop()
        sizes = await loop.run_in_executor(self._executor, _sizes, urls)
        tokens = await self._tokens(link, list(dict.fromkeys(sizes.values())))
        exact = all(count is not None for count in tokens.values())
        costs = {url: tokens[size] or estimated_image_tokens(size) for url, size in sizes.items()}
        return ImageCounter(base, costs, exact)

    async def _tokens(self, link: Link, sizes: list[ImageSize]) -> dict[ImageSize, int | None]:
        """Each size's tokens on `link`'s engine; None where it could not say."""
        target = link.target
        key = f"{target.model_id} | {target.counter_key}"
        known = self._known.setdefault(key, OrderedDict())
        tokens: dict[ImageSize, int | None] = {}
        for size in sizes:
            if size in known:
                known.move_to_end(size)
                tokens[size] = known[size]
        missing = [size for size in sizes if size not in tokens]
        new = [size for size in missing if (key, size) not in self._asking]
        if new and self._clock.monotonic() >= self._quiet_until.get(key, 0.0):
            self._ask_for(link, key, new)
        waits = {size: self._asking.get((key, size)) for size in missing}  # before any ends
        for size, waiting in waits.items():
            tokens[size] = await asyncio.shield(waiting) if waiting is not None else None
        while len(known) > SIZES_KEPT:
            known.popitem(last=False)
        return tokens

    def _ask_for(self, link: Link, key: str, sizes: list[ImageSize]) -> None:
        loop = asyncio.get_running_loop()
        futures = {size: loop.create_future() for size in sizes}
        for size, future in futures.items():
            self._asking[(key, size)] = future

        async def ask() -> None:
            answer = await self._ask(link, sizes)
            if answer is None:
                self._quiet_until[key] = self._clock.monotonic() + ASK_AGAIN_AFTER_S
            known = self._known.setdefault(key, OrderedDict())
            for index, (size, future) in enumerate(futures.items()):
                count = None if answer is None else answer[index]
                if count is not None:
                    known[size] = count
                del self._asking[(key, size)]
                future.set_result(count)

        task = loop.create_task(ask())
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _ask(self, link: Link, sizes: list[ImageSize]) -> list[int] | None:
        timeout_s = ASK_TIMEOUT_S
        if link.status().asleep:  # the call waits for a replica to start
            timeout_s = max(timeout_s, link.target.wake_timeout_s)
        try:
            answer = await asyncio.wait_for(link.backend.image_tokens(sizes), timeout_s)
        except Exception as error:  # noqa: BLE001 - any failure leaves the estimate
            logger.warning("%s did not count images (%r): estimated", link.target.name, error)
            return None
        if answer is None or len(answer) != len(sizes):
            logger.warning("%s cannot count images: estimated", link.target.name)
            return None
        return answer


def _sizes(urls: list[str]) -> dict[str, ImageSize]:
    return {url: image_size(url) for url in urls}
