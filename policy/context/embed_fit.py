"""Fit an embeddings request to a backend's window: an input is never cut unless the request
says so (`truncate_prompt_tokens`, which the engine applies), because a vector of half a text
is a wrong vector, not a shorter one. An input over the window is refused, naming it. A
truncation longer than this backend's window is cut to the window (vLLM would refuse it, and a
failover link may have a smaller window than the one the client knew). A request is refused
past `MAX_REQUEST_TOKENS` in all, OpenAI's own limit: its answer is one item, so it must be done
within the router's first-item timeout.

Pure: the counter is the only tokenizer it touches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policy.context.fit import ContextOverflow
from policy.context.tokens import TokenCounter

__all__ = ["MAX_REQUEST_TOKENS", "EmbedFit", "InputTooLong", "TooManyTokens", "fit_inputs"]

MAX_REQUEST_TOKENS = 300_000  # summed over a request's inputs (OpenAI's limit)


class InputTooLong(ContextOverflow):
    """An input is longer than the window and the request did not ask to truncate it."""

    def __init__(self, index: int, tokens: int, window: int) -> None:
        super().__init__(tokens - window, window)
        self.index = index
        self.tokens = tokens

    def __str__(self) -> str:
        return (
            f"input[{self.index}] is {self.tokens} tokens, over the model's window of "
            f"{self.window}: shorten it, or set truncate_prompt_tokens (-1: cut to the window)."
        )


class TooManyTokens(ContextOverflow):
    """A request's inputs together are past MAX_REQUEST_TOKENS."""

    def __init__(self, tokens: int) -> None:
        super().__init__(tokens - MAX_REQUEST_TOKENS, MAX_REQUEST_TOKENS)
        self.tokens = tokens

    def __str__(self) -> str:
        return (
            f"The inputs are {self.tokens} tokens in all, over the limit of "
            f"{MAX_REQUEST_TOKENS} per request: send them in smaller batches."
        )


@dataclass(frozen=True)
class EmbedFit:
    prompt_tokens: int  # of every input, as the engine will see them (after any truncation)
    truncated: int  # inputs the engine will cut, as the request asked
    truncate_to: int | None = None  # what the engine is sent: the request's, at most the window
    # The longest input: the engine runs each input as its own sequence, so this, not the sum,
    # is what must fit its KV cache (the count the memory guard is sent).
    largest: int = 0
    max_tokens: int = 0  # nothing is generated
    counted: bool = True
    # What a chat Fit says, for the routing headers: nothing was dropped or compressed.
    system_compressed: bool = False
    dropped_messages: int = 0
    output_clamped: bool = False

    @property
    def fitted(self) -> bool:
        return self.truncated > 0


def fit_inputs(
    inputs: Sequence[str | list[int]],
    *,
    window: int,
    truncate_prompt_tokens: int | None,
    counter: TokenCounter,
) -> EmbedFit:
    """Each input's count against the window (or the truncation the request asked for)."""
    limit = window if truncate_prompt_tokens in (None, -1) else min(truncate_prompt_tokens, window)
    total = truncated = largest = 0
    for index, item in enumerate(inputs):
        ids = isinstance(item, list)
        tokens = len(item) if isinstance(item, list) else counter.count_raw(item)
        if tokens > limit:
            if truncate_prompt_tokens is not None:
                truncated += 1
                tokens = limit
            elif ids or counter.exact:  # a mere estimate is left for the engine to judge
                raise InputTooLong(index, tokens, window)
        total += tokens
        largest = max(largest, tokens)
    if total > MAX_REQUEST_TOKENS:
        raise TooManyTokens(total)
    sent = truncate_prompt_tokens if truncate_prompt_tokens in (None, -1) else limit
    return EmbedFit(total, truncated, truncate_to=sent, largest=largest, counted=counter.exact)
