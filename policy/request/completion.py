"""The whole `/v1/completions` request body, checked before vLLM's schema sees it (as
`schema.py` does for chats): every mistake a 400 naming the field.

One prompt per request: a text, or token ids (or a list holding one of those). A batch of prompts
is several answers to fit, route and bill as one; clients that autocomplete send one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy.request.fields import check_optional, fail, is_int, json_kind
from policy.request.schema import INT64_MAX, INT64_MIN, check_sampling

__all__ = ["COMPLETION_INT_RANGES", "check_completion_request", "single_prompt"]

COMPLETION_INT_RANGES = {
    "max_tokens": (1, INT64_MAX),
    "n": (1, 128),
    "seed": (INT64_MIN, INT64_MAX),
    "logprobs": (0, 20),  # vLLM's most; OpenAI's is 5
}
COMPLETION_BOOL_FIELDS = ("stream", "echo")
MAX_TOKEN_ID = 2**31 - 1


def check_completion_request(payload: Mapping[str, Any]) -> None:
    """Raise ApiError 400 for the first field a completions request gets wrong."""
    for other, endpoint in (("messages", "/v1/chat/completions"), ("input", "/v1/embeddings")):
        if other in payload:  # a body meant for another endpoint: never half-read as one
            fail(other, f"belongs to {endpoint}; a completion takes a prompt")
    _check_prompt(payload.get("prompt"))
    check_sampling(payload, COMPLETION_INT_RANGES, COMPLETION_BOOL_FIELDS)
    check_optional(payload, "suffix", str, "a string")
    best_of = payload.get("best_of")
    if best_of is not None and (not is_int(best_of) or best_of != (payload.get("n") or 1)):
        fail("best_of", "is not supported: leave it out (or equal to n)")
    prompt = single_prompt(payload.get("prompt"))
    if payload.get("suffix") and not isinstance(prompt, str):
        fail("suffix", "needs a text prompt (the prefix), not token ids")
    if payload.get("suffix") and payload.get("echo"):
        fail("echo", "cannot be combined with suffix (the prompt sent is the FIM prompt)")


def single_prompt(prompt: Any) -> Any:
    """The one prompt of a `prompt` field (text or token ids): a list of one unwrapped."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return prompt[0]
    return prompt


def _check_prompt(prompt: Any) -> None:
    if prompt is None:
        fail("prompt", "is required: the text (or token ids) to complete")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) > 1:
            fail("prompt", f"takes one prompt per request; got {len(prompt)}")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            fail("prompt", "must not be empty")
        return
    if not isinstance(prompt, list):
        fail("prompt", f"must be a string or an array of token ids, not {json_kind(prompt)}")
    if not prompt:
        fail("prompt", "must not be empty")
    for index, token in enumerate(prompt):
        if not is_int(token) or not 0 <= token <= MAX_TOKEN_ID:
            fail(f"prompt[{index}]", "must be a token id (a non-negative integer)")
