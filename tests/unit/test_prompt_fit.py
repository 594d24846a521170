"""Fitting a `/v1/completions` prompt: its end and a FIM suffix stay, its beginning goes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policy.context.fit import FitPolicy
from policy.context.prompt_fit import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    NoFim,
    PromptOverflow,
    fit_prompt,
)
from policy.context.tokens import FimMarkers, Message

MARKERS = FimMarkers(" <pre> ", " <suf> ", " <mid> ")
MARGIN = FitPolicy().margin_tokens


class WordCounter:
    """Exact, one token a word: enough to see what is kept."""

    exact = True

    def __init__(self, fim: bool = True) -> None:
        self._fim = fim

    def count_text(self, text: str) -> int:
        return len(text.split())

    def count_prompt(
        self, messages: Sequence[Message], tools: Sequence[Message] | None = None
    ) -> int:
        raise NotImplementedError

    def upper_bound(self, messages: Sequence[Message]) -> int | None:
        return None

    def count_tools(self, tools: Sequence[Message]) -> int:
        return 0

    def count_raw(self, text: str) -> int:
        return len(text.split())

    def tail(self, text: str, tokens: int) -> str:
        words = text.split()
        return " ".join(words[-tokens:]) if tokens > 0 else ""

    def fim_markers(self) -> FimMarkers | None:
        return MARKERS if self._fim else None


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_a_prompt_that_fits_is_sent_as_it_came_with_openais_default_output() -> None:
    fit = fit_prompt("def add(a, b):", window=100, requested_max_tokens=None, counter=WordCounter())
    assert fit.prompt == "def add(a, b):"
    assert fit.max_tokens == COMPLETION_DEFAULT_MAX_TOKENS
    assert (fit.prompt_tokens, fit.dropped_tokens, fit.fitted) == (3, 0, False)


def test_a_long_prompt_keeps_its_end_and_the_output_asked_for() -> None:
    fit = fit_prompt(words(500), window=200, requested_max_tokens=50, counter=WordCounter())
    assert isinstance(fit.prompt, str)
    assert fit.prompt.endswith("w498 w499")
    assert not fit.prompt.startswith("w0 ")
    assert fit.max_tokens == 50
    assert fit.prompt_tokens + fit.max_tokens + MARGIN == 200
    assert fit.dropped_tokens == 500 - fit.prompt_tokens
    assert fit.fitted


def test_fill_in_the_middle_keeps_the_whole_suffix_and_the_prefixs_end() -> None:
    fit = fit_prompt(
        words(400, "p"),
        suffix=words(30, "s"),
        window=200,
        requested_max_tokens=40,
        counter=WordCounter(),
    )
    assert isinstance(fit.prompt, str)
    before, after = fit.prompt.split(" <suf> ")
    assert before.startswith(" <pre> ")
    assert before.endswith("p399")
    assert after == words(30, "s") + " <mid> "
    assert fit.prompt_tokens + fit.max_tokens + MARGIN <= 200


def test_a_suffix_that_cannot_fit_with_the_least_output_is_refused_by_how_much() -> None:
    with pytest.raises(PromptOverflow) as overflow:
        fit_prompt(
            "x", suffix=words(300, "s"), window=200, requested_max_tokens=40, counter=WordCounter()
        )
    assert overflow.value.over_by > 0
    assert "shorten the suffix" in str(overflow.value)


def test_a_suffix_needs_a_tokenizer_with_fim_markers() -> None:
    with pytest.raises(NoFim):
        fit_prompt("x", suffix="y", window=200, requested_max_tokens=4, counter=WordCounter(False))


def test_token_ids_keep_the_last_ones() -> None:
    ids = list(range(1000))
    fit = fit_prompt(ids, window=300, requested_max_tokens=100, counter=WordCounter())
    assert fit.prompt == ids[-(300 - 100 - MARGIN) :]
    assert fit.dropped_tokens == 1000 - len(fit.prompt)


def test_an_empty_suffix_is_no_suffix_even_without_fim_markers() -> None:
    fit = fit_prompt(
        "x = 1", suffix="", window=100, requested_max_tokens=4, counter=WordCounter(False)
    )
    assert fit.prompt == "x = 1"
