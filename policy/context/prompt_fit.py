"""Fit a completions prompt to a backend's window: clamp the output, keep the prompt's end.

What an editor sends to `/v1/completions` is the text before the cursor (and, for fill-in-the-
middle, the text after it in `suffix`): what matters most is nearest the cursor. So an over-long
prompt loses its beginning, never its end; with a suffix, the suffix stays whole and the prefix
loses its beginning. Only when what must stay (the suffix and the FIM markers, or for a prompt of
token ids nothing at all) cannot fit with the smallest output is the request refused.

`suffix` is served by writing the FIM prompt with the tokenizer's own markers (vLLM does not
take `suffix`); a tokenizer without markers cannot do it, which `NoFim` says.

Pure: the counter is the only tokenizer it touches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policy.context.fit import ContextOverflow, FitPolicy
from policy.context.tokens import TokenCounter

__all__ = ["COMPLETION_DEFAULT_MAX_TOKENS", "NoFim", "PromptFit", "PromptOverflow", "fit_prompt"]

# OpenAI's (and vLLM's) default for `/v1/completions` when `max_tokens` is not given.
COMPLETION_DEFAULT_MAX_TOKENS = 16


class PromptOverflow(ContextOverflow):
    """What must stay of a prompt (its suffix and the FIM markers) does not fit the window."""

    def __str__(self) -> str:
        return (
            f"The prompt does not fit the model's context window of {self.window} tokens even "
            f"with its beginning cut: what must stay (a suffix, one token of the prompt) and "
            f"the smallest output need {self.over_by} more tokens; shorten the suffix."
        )


class NoFim(ValueError):
    """`suffix` was sent to a model whose tokenizer has no fill-in-the-middle markers."""


@dataclass(frozen=True)
class PromptFit:
    prompt: str | list[int]  # what the engine is sent: text (the FIM prompt too) or token ids
    max_tokens: int
    prompt_tokens: int
    dropped_tokens: int  # cut from the prompt's beginning
    output_clamped: bool
    counted: bool = True
    # What a chat Fit says, for the routing headers: a prompt has no messages to drop.
    system_compressed: bool = False
    dropped_messages: int = 0

    @property
    def fitted(self) -> bool:
        return self.dropped_tokens > 0


def fit_prompt(
    prompt: str | list[int],
    *,
    window: int,
    requested_max_tokens: int | None,
    counter: TokenCounter,
    suffix: str | None = None,
    policy: FitPolicy | None = None,
) -> PromptFit:
    policy = policy or FitPolicy()
    cap = max(1, int(window * policy.output_share))
    wanted = COMPLETION_DEFAULT_MAX_TOKENS if requested_max_tokens is None else requested_max_tokens
    max_tokens = max(1, min(wanted, cap))
    margin = policy.margin_tokens
    if not counter.exact:
        margin += math.ceil(window * policy.estimate_margin_share)
    if isinstance(prompt, list):
        return _fit_ids(prompt, window, max_tokens, margin, requested_max_tokens, policy)
    suffix = suffix or None  # an empty suffix (the cursor at the end) is no suffix
    markers = counter.fim_markers() if suffix is not None else None
    if suffix is not None:
        if markers is None:
            raise NoFim(
                "this model's tokenizer has no fill-in-the-middle tokens, so `suffix` cannot "
                "be served; send the prompt alone, or use a FIM-trained model"
            )
        frame = markers.prompt("", suffix)  # what must stay: the markers and the suffix
        fixed = counter.count_raw(frame)
        text = markers.prompt(prompt, suffix)
    else:
        frame, fixed, text = "", counter.count_raw(""), prompt
    total = counter.count_raw(text)
    room = window - margin
    if total + max_tokens <= room:  # most requests: as sent
        clamped = _clamped(requested_max_tokens, max_tokens)
        return PromptFit(text, max_tokens, total, 0, clamped, counted=counter.exact)
    # The prompt's beginning goes first; only if what must stay leaves no room for the output
    # asked for does the output shrink, to `min_output_tokens` at the least.
    least = 0 if suffix is not None else 1  # a prompt keeps one token; a suffix is enough
    keep = room - max_tokens - fixed
    if keep < least:
        max_tokens = max(1, min(policy.min_output_tokens, max_tokens))
        keep = room - max_tokens - fixed
    if keep < least:
        raise PromptOverflow(least - keep, window)
    kept = counter.tail(prompt, keep)
    text = markers.prompt(kept, suffix) if markers is not None and suffix is not None else kept
    counted = counter.count_raw(text)
    max_tokens = max(1, min(max_tokens, room - counted))
    dropped = max(0, total - counted)
    clamped = _clamped(requested_max_tokens, max_tokens)
    return PromptFit(text, max_tokens, counted, dropped, clamped, counted=counter.exact)


def _fit_ids(
    ids: list[int],
    window: int,
    max_tokens: int,
    margin: int,
    requested_max_tokens: int | None,
    policy: FitPolicy,
) -> PromptFit:
    """Token ids are exact: keep the last ones that fit."""
    room = window - margin
    keep = room - max_tokens
    if keep < 1:  # the output asked for leaves no room: the least output, then
        max_tokens = max(1, min(policy.min_output_tokens, max_tokens))
        keep = room - max_tokens
    if keep < 1:
        raise PromptOverflow(1 - keep, window)
    kept = ids[-keep:]
    clamped = _clamped(requested_max_tokens, max_tokens)
    return PromptFit(kept, max_tokens, len(kept), len(ids) - len(kept), clamped)


def _clamped(requested_max_tokens: int | None, max_tokens: int) -> bool:
    return requested_max_tokens is not None and max_tokens < requested_max_tokens
