"""What each image of a chat costs on a link: its size read from its header, and the tokens an
image of that size adds as the link's engine says (asked once per size and model, then kept).

An engine that cannot say (no such method, an error, no answer in time) leaves an estimate above
what any processor gives (policy.context.images), and the count is then not exact: the fit keeps
the estimate's margin, and the engine is asked again next time.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor

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
# An engine's answer for new sizes: blank images, processed in milliseconds.
ASK_TIMEOUT_S = 10.0


class ImageCosts:
    def __init__(self, executor: Executor) -> None:
        self._executor = executor  # the fitter's thread: sizes are read off the event loop
        self._known: dict[str, OrderedDict[ImageSize, int]] = {}

    async def counter(
        self, link: Link, base: TokenCounter, messages: Sequence[Message]
    ) -> ImageCounter:
        """`base` with the images of `messages` counted as `link`'s engine expands them."""
        urls = list(dict.fromkeys(url for m in messages for _, url in image_urls(m)))
        loop = asyncio.get_running_loop()
        sizes = await loop.run_in_executor(self._executor, _sizes, urls)
        tokens, exact = await self._tokens(link, list(dict.fromkeys(sizes.values())))
        return ImageCounter(base, {url: tokens[size] for url, size in sizes.items()}, exact)

    async def _tokens(
        self, link: Link, sizes: list[ImageSize]
    ) -> tuple[dict[ImageSize, int], bool]:
        target = link.target
        known = self._known.setdefault(f"{target.model_id} | {target.counter_key}", OrderedDict())
        missing = [size for size in sizes if size not in known]
        answer = await self._ask(link, missing) if missing else []
        if answer is not None:
            for size, count in zip(missing, answer, strict=True):
                known[size] = count
        tokens = {}
        for size in sizes:
            if size in known:
                known.move_to_end(size)
                tokens[size] = known[size]
            else:
                tokens[size] = estimated_image_tokens(size)
        while len(known) > SIZES_KEPT:
            known.popitem(last=False)
        return tokens, answer is not None

    async def _ask(self, link: Link, sizes: list[ImageSize]) -> list[int] | None:
        try:
            answer = await asyncio.wait_for(link.backend.image_tokens(sizes), ASK_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - any failure leaves the estimate
            logger.warning("%s did not count images (%r): estimated", link.target.name, error)
            return None
        if answer is None or len(answer) != len(sizes):
            logger.warning("%s cannot count images: estimated", link.target.name)
            return None
        return answer


def _sizes(urls: list[str]) -> dict[str, ImageSize]:
    return {url: image_size(url) for url in urls}
