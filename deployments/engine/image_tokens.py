"""What an image of a given size adds to a chat prompt, by the engine's own reckoning.

An image's tokens depend on its width and height and on the model's processor (its tiling, its
resizing, the markers around each tile). vLLM's tokenize endpoint renders a chat with the
engine's chat template and expands each image with that processor, as a chat request is
expanded, so the count is the engine's: a chat of one blank image of the size and one text
part, less the same chat without the image. The router fits with these (policy.context.images).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from policy.context.images import ImageSize, blank_image_url

__all__ = ["image_tokens"]

_TEXT = {"type": "text", "text": "."}


async def image_tokens(engine: Any, model: str, sizes: Sequence[ImageSize]) -> list[int]:
    """The tokens one image of each size adds to a chat prompt, by `engine` (ray.serve.llm's
    vLLM engine, serving `model`). Raises where the engine cannot tokenize images."""
    base = await _prompt_tokens(engine, model, [_TEXT])
    counts = []
    for size in sizes:
        # Megapixels to encode: off the event loop that relays this replica's streams.
        url = await asyncio.to_thread(blank_image_url, size)
        image = {"type": "image_url", "image_url": {"url": url}}
        counts.append(await _prompt_tokens(engine, model, [image, _TEXT]) - base)
    return counts


async def _prompt_tokens(engine: Any, model: str, content: list[dict[str, Any]]) -> int:
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest

    request = TokenizeChatRequest(model=model, messages=[{"role": "user", "content": content}])
    answer = await _tokenization(engine).create_tokenize(request, raw_request=None)
    count = getattr(answer, "count", None)
    if count is None:  # vLLM's ErrorResponse
        raise RuntimeError(f"the engine would not tokenize an image: {answer}")
    return int(count)


def _tokenization(engine: Any) -> Any:
    """vLLM's tokenize serving of the engine's app state. Ray's engine looks for it under the
    name older vLLMs gave it (`openai_serving_tokenization`) and so answers every tokenize with
    "not available" on the vLLM we pin, which names it `serving_tokenization`."""
    state = getattr(engine, "_app_state", None)
    serving = getattr(state, "serving_tokenization", None) or getattr(
        engine, "_oai_serving_tokenization", None
    )
    if serving is None:
        raise RuntimeError("the engine has no tokenize serving")
    return serving
