"""Chats with images fitted to a window (policy.context.images): each image counted as its
engine expands it, the oldest images dropped first behind a marker, then old turns, the newest
message's images last; a request that cannot fit even so is a ContextOverflow."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from policy.context.fit import PROMPT_OVERHEAD_TOKENS, ContextOverflow, FitPolicy, budget_for
from policy.context.images import (
    IMAGE_MARKER,
    ImageCounter,
    ImagesNotCounted,
    estimated_image_tokens,
    fit_with_images,
    image_size,
    image_urls,
)
from policy.context.tokens import Message, message_text
from tests.unit.test_continuation_fit import COUNTER, words

PER_IMAGE = 100


def png_url(width: int, height: int, colour: str = "red") -> str:
    png = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def user(text: str, *urls: str) -> Message:
    return {"role": "user", "content": [*(image(u) for u in urls), {"type": "text", "text": text}]}


def counter_for(messages: list[Message], cost: int = PER_IMAGE) -> ImageCounter:
    urls = {url for m in messages for _, url in image_urls(m)}
    return ImageCounter(COUNTER, dict.fromkeys(urls, cost))


def images_in(messages: list[Message]) -> list[str]:
    return [url for m in messages for _, url in image_urls(m)]


def markers_in(messages: list[Message]) -> int:
    return sum(message_text(m).count(IMAGE_MARKER) for m in messages)


A, B, C = png_url(8, 8, "red"), png_url(8, 8, "blue"), png_url(8, 8, "green")


def conversation(answer_words: int = 50) -> list[Message]:
    return [
        user("what is this", A),
        {"role": "assistant", "content": words(answer_words, "a")},
        user("and this", B),
        {"role": "assistant", "content": words(answer_words, "b")},
        user("and this one", C),
    ]


def test_the_images_header_gives_its_size_as_the_engine_turns_it_upright() -> None:
    assert image_size(png_url(640, 480)) == (640, 480)
    exif = Image.Exif()
    exif[0x0112] = 6  # a phone held upright: stored on its side, shown turned a quarter
    jpeg = io.BytesIO()
    Image.new("RGB", (640, 480)).save(jpeg, "JPEG", exif=exif)
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg.getvalue()).decode()
    assert image_size(url) == (480, 640)


def test_the_newest_messages_images_never_go_on_an_estimate_of_their_cost() -> None:
    messages = [user("look at this " + words(20), A)]
    guessed = ImageCounter(COUNTER, {A: 500}, costs_exact=False)
    with pytest.raises(ImagesNotCounted):
        fit_with_images(messages, window=300, requested_max_tokens=50, counter=guessed)
    # Older ones may: an estimate above the real cost drops no more than is needed to be sure.
    older = [user("first", A), {"role": "assistant", "content": "ok"}, user("and now?")]
    guessed = ImageCounter(COUNTER, {A: 500}, costs_exact=False)
    fit = fit_with_images(older, window=300, requested_max_tokens=50, counter=guessed)
    assert fit.dropped_images == 1
    assert not fit.counted  # an estimate: X-Prompt-Tokens is not sent


def test_a_chat_with_images_counts_each_image_as_its_engine_does() -> None:
    messages = conversation()
    counter = counter_for(messages)
    assert counter.count_prompt(messages) == COUNTER.count_prompt(messages) + 3 * PER_IMAGE
    fit = fit_with_images(messages, window=2000, requested_max_tokens=100, counter=counter)
    assert fit.messages == messages
    assert fit.counted
    assert fit.prompt_tokens == counter.count_prompt(messages)
    assert not fit.fitted


def test_the_oldest_images_go_first_each_behind_a_marker_and_no_turn_goes() -> None:
    messages = conversation()
    counter = counter_for(messages)
    whole = counter.count_prompt(messages)
    # Room for all but one image's tokens: the oldest goes, its words stay.
    window = whole - PER_IMAGE // 2 + 100 + FitPolicy().margin_tokens
    fit = fit_with_images(messages, window=window, requested_max_tokens=100, counter=counter)
    assert images_in(fit.messages) == [B, C]
    # The marker joins the message's words, as one text: counted as the template renders it.
    assert fit.messages[0]["content"] == f"{IMAGE_MARKER}\nwhat is this"
    assert fit.dropped_images == 1
    assert fit.dropped_messages == 0
    assert fit.fitted
    assert [m["role"] for m in fit.messages] == [m["role"] for m in messages]
    assert fit.prompt_tokens == counter.count_prompt(fit.messages)
    assert fit.prompt_tokens + fit.max_tokens + FitPolicy().margin_tokens <= window


def test_old_turns_go_once_every_older_image_has() -> None:
    messages = conversation(answer_words=400)
    counter = counter_for(messages)
    fit = fit_with_images(messages, window=900, requested_max_tokens=100, counter=counter)
    assert fit.dropped_images == 2
    # Then old turns gave way: text now, compressed into what was left, or dropped.
    assert fit.dropped_messages + fit.compressed_messages > 0
    assert images_in(fit.messages) == [C]  # the newest message keeps its image
    assert fit.prompt_tokens == counter.count_prompt(fit.messages)


def test_the_newest_messages_image_goes_only_where_nothing_else_can_make_room() -> None:
    messages = [user("look at this " + words(20), A)]
    counter = counter_for(messages, cost=500)
    fit = fit_with_images(messages, window=300, requested_max_tokens=50, counter=counter)
    assert images_in(fit.messages) == []
    assert markers_in(fit.messages) == 1
    assert fit.dropped_images == 1
    assert fit.messages[0]["content"] == f"{IMAGE_MARKER}\nlook at this {words(20)}"


def test_a_message_too_long_even_without_its_images_is_a_context_overflow() -> None:
    messages = [user(words(900), A)]
    with pytest.raises(ContextOverflow) as overflow:
        fit_with_images(
            messages, window=500, requested_max_tokens=50, counter=counter_for(messages)
        )
    assert overflow.value.window == 500
    assert "500 tokens" in str(overflow.value)


def test_an_engine_that_cannot_count_leaves_an_estimate_above_any_processor() -> None:
    # Idefics3 at 512 pixels: 5 tiles of 64; Qwen2-VL: a token per 28 x 28 pixels.
    assert estimated_image_tokens((512, 512)) > 5 * 64 + 13
    assert estimated_image_tokens((1920, 1080)) > (1920 // 28 + 1) * (1080 // 28 + 1)
    assert estimated_image_tokens((8000, 4000)) == 16_384  # the most any processor gives
    counter = ImageCounter(COUNTER, {A: 1}, costs_exact=False)
    assert not counter.exact  # so the fit keeps the estimate's margin
    window = 1000
    assert budget_for(window, 10, counter, FitPolicy()).margin > FitPolicy().margin_tokens


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 3)), min_size=1, max_size=6),
    window=st.integers(300, 3000),
    cost=st.integers(1, 400),
)
# The latest message leaves less room than the omission marker needs (found by Hypothesis).
@example(turns=[(0, 0), (0, 0), (200, 3)], window=300, cost=10)
@example(turns=[(100, 0), (230, 0)], window=300, cost=10)
def test_whatever_is_sent_the_fit_is_within_the_window_or_an_overflow(
    turns: list[tuple[int, int]], window: int, cost: int
) -> None:
    colours = iter(f"#{i:06x}" for i in range(1, 100))
    messages: list[Message] = []
    for n, (length, count) in enumerate(turns):
        urls = [png_url(4, 4, next(colours)) for _ in range(count)]
        messages.append(user(words(length, f"u{n}"), *urls))
        messages.append({"role": "assistant", "content": words(length // 2, f"a{n}")})
    messages.pop()
    counter = counter_for(messages, cost)
    try:
        fit = fit_with_images(messages, window=window, requested_max_tokens=64, counter=counter)
    except ContextOverflow:
        # Even with its images replaced by markers the newest message and the least output
        # do not fit (within the search's estimate of the template's own tokens).
        marked = [
            {**m, "content": "\n".join(p.get("text", IMAGE_MARKER) for p in m["content"])}
            for m in messages[-1:]
        ]
        # (The word counter's prompt adds 3 tokens; the search reckons 24.)
        least = COUNTER.count_prompt(marked) - 3 + PROMPT_OVERHEAD_TOKENS
        assert least + FitPolicy().min_output_tokens + FitPolicy().margin_tokens > window
        return
    assert fit.prompt_tokens == counter.count_prompt(fit.messages)
    assert fit.prompt_tokens + fit.max_tokens + FitPolicy().margin_tokens <= window
    kept = images_in(fit.messages)
    sent = images_in(messages)
    assert fit.dropped_images == len(sent) - len(kept) >= markers_in(fit.messages)
    # What stays is the newest images: those dropped come before every one kept.
    assert kept == [url for url in sent if url in kept]
    newest = images_in(messages[-1:])
    if any(url in kept for url in sent if url not in newest):
        assert all(url in kept for url in newest)
