"""An image request's fitting cost beside a text request's, on the demo vision model's tokenizer.

The router's own path for each, timed in one run on the same machine:
- text (the anchor): a chat of about N tokens, proven to fit by the byte bound where it can
  (`pass_through`), else fitted (`fit_messages`), as the router does for text;
- images: the same chat with k of its user turns carrying a screenshot-sized PNG (each costing the
  333 tokens the demo vision model's engine says a square costs, as the router holds after its
  first ask), and the text shortened by as many tokens: each image's size read from its header
  (base64 decoded, Pillow's lazy open), then `fit_with_images` (always counted exactly).
Both where the chat fits and where it is over the window (the images' case then drops the oldest
images). The target: an image request's fit within 5x the text request's of the same size, and
under 50 ms at p99 (a prefill of one image on a GPU is tens of ms).

Run with `make bench` or `python -m bench.image_fit`. No Ray, no engine.
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from policy.context.fit import Fit, fit_messages, pass_through
from policy.context.images import ImageCounter, fit_with_images, image_size, image_urls
from policy.context.tokens import ChatTemplateCounter, Message

MODEL = Path(__file__).resolve().parent.parent / ".models" / "SmolLM2-135M-Vision"
WINDOW = 8192
MAX_TOKENS = 512
IMAGE_TOKENS = 333  # what the demo vision model's engine says a 1280 x 800 screenshot costs
WORDS = "the router reads each image header once and counts its tiles as the engine".split()
RATIO_TARGET = 5.0
P99_TARGET_MS = 50.0


def screenshot(rng: random.Random) -> str:
    """A 1280 x 800 PNG of coloured bands with noise: about a real screenshot's size in bytes."""
    from PIL import Image

    image = Image.new("RGB", (1280, 800), "white")
    pixels = image.load()
    assert pixels is not None
    for y in range(0, 800, 4):
        shade = rng.randrange(256)
        for x in range(0, 1280, 2):
            pixels[x, y] = (shade, (x * 7) % 256, rng.randrange(256))
    png = io.BytesIO()
    image.save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat(rng: random.Random, tokens: int, images: list[str]) -> list[Message]:
    """About `tokens` tokens in 8 turns; the first len(images) user turns carry one each, and
    the text is shorter by their tokens."""
    per_turn = max(1, (tokens - IMAGE_TOKENS * len(images)) // 16)
    messages: list[Message] = [{"role": "system", "content": words(rng, 40)}]
    for turn in range(8):
        text = {"type": "text", "text": words(rng, per_turn)}
        if turn < len(images):
            image = {"type": "image_url", "image_url": {"url": images[turn]}}
            messages.append({"role": "user", "content": [image, text]})
        else:
            messages.append({"role": "user", "content": text["text"]})
        messages.append({"role": "assistant", "content": words(rng, per_turn)})
    messages.append({"role": "user", "content": "What changed?"})
    return messages


def fit_text(messages: list[Message], counter: ChatTemplateCounter) -> Fit:
    quick = pass_through(messages, window=WINDOW, requested_max_tokens=MAX_TOKENS, counter=counter)
    return quick or fit_messages(
        messages, window=WINDOW, requested_max_tokens=MAX_TOKENS, counter=counter
    )


def fit_images(messages: list[Message], counter: ChatTemplateCounter) -> Fit:
    urls = {url for m in messages for _, url in image_urls(m)}
    sizes = {url: image_size(url) for url in urls}  # read off the event loop, as the router does
    costs = {url: IMAGE_TOKENS for url in sizes}  # the engine's answer, held per size
    counted = ImageCounter(counter, costs)
    return fit_with_images(
        messages, window=WINDOW, requested_max_tokens=MAX_TOKENS, counter=counted
    )


def timed(fit: Callable[[], Fit], samples: int) -> tuple[list[float], Fit]:
    times, result = [], fit()  # the first fills the tokenizer's content cache, as in a session
    for _ in range(samples):
        started = time.perf_counter()
        result = fit()
        times.append((time.perf_counter() - started) * 1000)
    return times, result


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--images", type=int, default=4)
    args = parser.parse_args()
    if not MODEL.exists():
        print(f"{MODEL} is missing: run `make model` first", file=sys.stderr)
        return 2
    counter = ChatTemplateCounter.from_pretrained(MODEL)
    rng = random.Random(5)
    shots = [screenshot(rng) for _ in range(args.images)]
    kib = len(shots[0]) * 3 // 4 // 1024
    print(f"\nFitting into a {WINDOW}-token window, {args.images} screenshots of {kib} KiB")
    print(f"(1280 x 800, {IMAGE_TOKENS} tokens each)")
    print("| chat | text p50 / p99 ms | images p50 / p99 ms | ratio p50 | images dropped |")
    print("|---|---|---|---|---|")
    ok = True
    for label, tokens in (("fits, 4k tokens", 4_000), ("over the window, 12k tokens", 12_000)):
        text_chat, image_chat = (
            chat(random.Random(1), tokens, []),
            chat(random.Random(1), tokens, shots),
        )
        text_times, _ = timed(functools.partial(fit_text, text_chat, counter), args.samples)
        image_fit = functools.partial(fit_images, image_chat, counter)
        image_times, fitted = timed(image_fit, args.samples)
        ratio = statistics.median(image_times) / statistics.median(text_times)
        ok = ok and ratio <= RATIO_TARGET and p99(image_times) <= P99_TARGET_MS
        print(
            f"| {label} | {statistics.median(text_times):.2f} / {p99(text_times):.2f} | "
            f"{statistics.median(image_times):.2f} / {p99(image_times):.2f} | {ratio:.2f} x | "
            f"{fitted.dropped_images} |"
        )
    verdict = "met" if ok else "MISSED"
    print(f"\nTarget: images within {RATIO_TARGET:.0f}x the text's p50, p99 under "
          f"{P99_TARGET_MS:.0f} ms: {verdict}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
