"""What images cost a prompt, and a chat with images fitted to a window.

An image's tokens depend on its size and on the serving model's processor (its resizing and
tiling), so each engine says what an image of a size costs (deployments/engine/image_tokens.py)
and the router fits with that: the prompt's count is the text's, by the model's tokenizer and
template, plus each image's, as the engine would expand it.

A chat that does not fit loses its oldest images first, each replaced by a text marker where it
was; then old turns, as a text chat does (policy.context.fit); the newest message's own images
go last, oldest first, only where nothing else can make room, and never on an estimate of their
cost (ImagesNotCounted: the engine could not say). A request that still does not fit is a
ContextOverflow (the client's 400, naming the window).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from policy.context.fit import (
    MESSAGE_OVERHEAD_TOKENS,
    PROMPT_OVERHEAD_TOKENS,
    ContextOverflow,
    Fit,
    FitPolicy,
    budget_for,
    fit_messages,
)
from policy.context.tokens import FimMarkers, Message, TokenCounter, message_text

__all__ = [
    "IMAGE_MARKER",
    "ImageCounter",
    "ImageSize",
    "ImagesNotCounted",
    "blank_image_url",
    "estimated_image_tokens",
    "fit_with_images",
    "image_data",
    "image_size",
    "image_urls",
]

ImageSize = tuple[int, int]  # width, height in pixels
IMAGE_MARKER = "[An image was omitted here to fit the context window.]"
# Where an engine cannot say: one token a 14-pixel patch, the finest ViT patching in use
# (SigLIP, Qwen2-VL before its 2x2 merge), so more than any tiling processor gives.
ESTIMATE_PATCH_PIXELS = 14
# Qwen2-VL's and Qwen2.5-VL's processors by default: at most 12,845,056 pixels, a token per
# 28 x 28 of them.
MOST_IMAGE_TOKENS = 16_384
DEFAULT_POLICY = FitPolicy()
EXIF_ORIENTATION = 0x0112
# How far the estimate may stray from the exact count (besides 2 tokens a message, a template's
# frame, and 5% of the budget) before a chat it puts over the budget is counted exactly anyway.
ESTIMATE_SLACK_TOKENS = 64


def image_urls(message: Message) -> Iterator[tuple[int, str]]:
    """Each image part of a message (chat's `image_url` parts, as the edge left them): its
    index in the content, and its URL."""
    content = message.get("content")
    if not isinstance(content, list):
        return
    for index, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "image_url":
            url = part.get("image_url", {}).get("url")
            if isinstance(url, str):
                yield index, url


def image_size(url: str) -> ImageSize:
    """An image's width and height from its header (a base64 data URL the edge checked)."""
    from PIL import Image

    raw = base64.b64decode(url.partition(",")[2])
    with Image.open(io.BytesIO(raw)) as image:
        width, height = image.size
        orientation = image.getexif().get(EXIF_ORIENTATION)
    # Engines turn an image upright by its EXIF orientation before they tile it (vLLM's
    # normalize_image): 5 to 8 are a quarter turn, so its tiles are those of the size turned.
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def blank_image_url(size: ImageSize) -> str:
    """A data URL of a one-colour PNG of `size` (a solid colour compresses to almost nothing):
    what an engine is asked to count an image of that size by."""
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", size, "white").save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


def image_data(messages: Sequence[Message]) -> list[str]:
    """The base64 data of each image of the messages, in order."""
    return [url.partition(",")[2] for m in messages for _, url in image_urls(m)]


def estimated_image_tokens(size: ImageSize) -> int:
    """An image's tokens where its engine cannot say: above what any processor gives, and no
    more than the most any gives (Qwen2-VL's, at its default largest size)."""
    width, height = size
    patches = math.ceil(width / ESTIMATE_PATCH_PIXELS) * math.ceil(height / ESTIMATE_PATCH_PIXELS)
    return min(patches, MOST_IMAGE_TOKENS)


class ImagesNotCounted(Exception):
    """The newest message's own images would have to go, by an estimate of their cost (their
    engine could not say): never done on a guess. The request may be tried again."""


@dataclass(frozen=True)
class ImageCounter:
    """A TokenCounter for chats with images: the text by `base`, each image by `costs` (by its
    URL: the tokens an image of its size adds). Exact where both are."""

    base: TokenCounter
    costs: Mapping[str, int]
    costs_exact: bool = True

    @property
    def exact(self) -> bool:
        return self.base.exact and self.costs_exact

    def images(self, message: Message) -> int:
        """The tokens a message's images add."""
        return sum(self.costs[url] for _, url in image_urls(message))

    def count_text(self, text: str) -> int:
        return self.base.count_text(text)

    def count_prompt(
        self, messages: Sequence[Message], tools: Sequence[Message] | None = None
    ) -> int:
        return self.base.count_prompt(messages, tools) + sum(map(self.images, messages))

    def upper_bound(self, messages: Sequence[Message]) -> int | None:
        bound = self.base.upper_bound(messages)
        return None if bound is None else bound + sum(map(self.images, messages))

    def count_tools(self, tools: Sequence[Message]) -> int:
        return self.base.count_tools(tools)

    def count_raw(self, text: str) -> int:
        return self.base.count_raw(text)

    def tail(self, text: str, tokens: int) -> str:
        return self.base.tail(text, tokens)

    def fim_markers(self) -> FimMarkers | None:
        return self.base.fim_markers()


def fit_with_images(
    messages: Sequence[Message],
    *,
    window: int,
    requested_max_tokens: int | None,
    counter: ImageCounter,
    policy: FitPolicy = DEFAULT_POLICY,
    tools: Sequence[Message] | None = None,
) -> Fit:
    """`messages` fitted to `window` (the module's docstring); the Fit's `dropped_images` says
    how many of the images sent the model will not see. Always counted (images make the cheap
    bound far from exact)."""
    places = [(i, url) for i, m in enumerate(messages) for _, url in image_urls(m)]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    newest = users[-1] if users else len(messages)
    older = [place for place in places if place[0] < newest]
    own = [place for place in places if place[0] >= newest]
    budget = budget_for(window, requested_max_tokens, counter, policy)
    current, count = _older_images_dropped(list(messages), older, counter, budget.prompt, tools)
    dropped = len(places) - sum(1 for m in current for _ in image_urls(m))
    if count <= budget.prompt:  # as sent, or with old images gone: no turn need go
        max_tokens = min(budget.max_tokens, window - count - budget.margin)
        return Fit(
            messages=current,
            sources=tuple(range(len(current))),
            max_tokens=max_tokens,
            prompt_tokens=count,
            system_compressed=False,
            dropped_messages=0,
            compressed_messages=0,
            output_clamped=requested_max_tokens is None or max_tokens < requested_max_tokens,
            counted=counter.exact,  # not where an image's cost was estimated
            dropped_images=dropped,
        )
    while True:
        try:
            fit = fit_messages(
                current,
                window=window,
                requested_max_tokens=requested_max_tokens,
                counter=counter,
                policy=policy,
                tools=tools,
                media=counter.images,
            )
        except ContextOverflow:
            if not own:
                raise
            if not counter.costs_exact:
                raise ImagesNotCounted from None
            current = _without_image(current, own.pop(0))
            continue
        # Images of turns that went whole count too: the model sees none of them.
        kept = sum(1 for m in fit.messages for _ in image_urls(m))
        return replace(fit, dropped_images=len(places) - kept, counted=counter.exact)


def _older_images_dropped(
    messages: list[Message],
    older: list[tuple[int, str]],
    counter: ImageCounter,
    budget: int,
    tools: Sequence[Message] | None,
) -> tuple[list[Message], int]:
    """The messages with the fewest of the `older` images gone that bring the prompt within
    `budget` (all of them where none do), and the prompt's count: exact where it is within the
    budget, else above it."""
    count = _estimate(messages, counter, tools)
    if count <= budget + ESTIMATE_SLACK_TOKENS + 2 * len(messages) + budget // 20:
        count = counter.count_prompt(messages, tools)  # near or within the budget: exactly
    if count <= budget or not older:
        return messages, count
    # By their costs less their markers' (a long chat's exact count takes milliseconds: counted
    # once they are gone); one more at a time where that estimate fell short.
    marker = counter.count_text(IMAGE_MARKER) + 1
    gains = [counter.costs[url] - marker for _, url in older]
    needed = next((k for k in range(1, len(older)) if count - sum(gains[:k]) <= budget), len(older))
    for place in older[:needed]:
        messages = _without_image(messages, place)
    if count - sum(gains[:needed]) > budget:
        return messages, budget + 1  # over even with them all gone: the turns' fit decides
    count = counter.count_prompt(messages, tools)
    for place in older[needed:]:
        if count <= budget:
            break
        messages = _without_image(messages, place)
        count = counter.count_prompt(messages, tools)
    return messages, count


def _estimate(
    messages: Sequence[Message], counter: ImageCounter, tools: Sequence[Message] | None
) -> int:
    """The prompt's count from its messages' contents, each counted once and kept by the
    tokenizer's cache (policy.context.tokens): within a few percent of the exact count, so a chat
    far over its budget is known to be without tokenizing all of it again."""
    listed = counter.count_tools(tools) if tools else 0
    return (
        PROMPT_OVERHEAD_TOKENS
        + listed
        + sum(
            counter.count_text(message_text(m)) + MESSAGE_OVERHEAD_TOKENS + counter.images(m)
            for m in messages
        )
    )


def _without_image(messages: list[Message], place: tuple[int, str]) -> list[Message]:
    """The messages with the image at `place` (its message, its URL: the first such image
    there) replaced by the marker text,
    joined to the text parts beside it as one part: the count flattens a message's text parts
    with newlines, and a template that writes parts one after another would render two parts
    a token shorter than it counted (measured: 1,358 against vLLM's 1,357)."""
    index, url = place
    content = list(messages[index]["content"])
    part = next(j for j, sent in image_urls(messages[index]) if sent == url)
    content[part] = {"type": "text", "text": IMAGE_MARKER}
    return [
        *messages[:index],
        {**messages[index], "content": _joined(content)},
        *messages[index + 1 :],
    ]


def _joined(content: list[Any]) -> list[Any] | str:
    """Each run of text parts as one part, its texts joined by newlines; a content of text
    alone as one string."""
    joined: list[Any] = []
    for part in content:
        if _is_text(part) and joined and _is_text(joined[-1]):
            joined[-1] = {"type": "text", "text": f"{joined[-1]['text']}\n{part['text']}"}
        else:
            joined.append(part)
    if all(map(_is_text, joined)):
        return "\n".join(part["text"] for part in joined)
    return joined


def _is_text(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )
