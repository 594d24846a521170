"""Fitting a continuation (an answer cut off mid-stream, going on elsewhere) to a smaller window:
the prompt fitted as any request's, the answer so far cut to its newest part behind a marker."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy.context.continuation_fit import (
    ANSWER_MARKER,
    MIN_ANSWER_TOKENS,
    fit_continuation,
)
from policy.context.fit import PROMPT_OVERHEAD_TOKENS, ContextOverflow, FitPolicy
from policy.context.tokens import FimMarkers, Message, message_text

MARGIN = FitPolicy().margin_tokens
PER_MESSAGE = 5


class WordCounter:
    """Exact, one token a word and five around each message: enough to see what is kept."""

    exact = True

    def count_text(self, text: str) -> int:
        return len(text.split())

    def count_prompt(
        self, messages: Sequence[Message], tools: Sequence[Message] | None = None
    ) -> int:
        return sum(self.count_text(message_text(m)) + PER_MESSAGE for m in messages) + 3

    def upper_bound(self, messages: Sequence[Message]) -> int | None:
        return None

    def count_tools(self, tools: Sequence[Message]) -> int:
        return 0

    def count_raw(self, text: str) -> int:
        return self.count_text(text)

    def tail(self, text: str, tokens: int) -> str:
        words = text.split()
        return " ".join(words[-tokens:]) if tokens > 0 else ""

    def fim_markers(self) -> FimMarkers | None:
        return None


COUNTER = WordCounter()


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def ask(question: str = "tell me a long story", system: str | None = None) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": question}]


def test_a_continuation_that_fits_is_the_prompt_and_the_whole_answer() -> None:
    answer = words(100, "a")
    fit = fit_continuation(ask(), answer, window=1000, requested_max_tokens=200, counter=COUNTER)
    assert fit.messages == [*ask(), {"role": "assistant", "content": answer}]
    assert fit.max_tokens == 200
    assert not fit.fitted


def test_an_answer_longer_than_the_window_keeps_its_newest_part_behind_the_marker() -> None:
    answer = words(2100, "a")  # a stream cut after 2,100 tokens, going on on a 2,048 window
    fit = fit_continuation(ask(), answer, window=2048, requested_max_tokens=1900, counter=COUNTER)
    *prompt, last = fit.messages
    assert prompt == ask()  # the short prompt whole
    assert last["role"] == "assistant"
    assert last["content"].startswith(ANSWER_MARKER)
    kept = last["content"][len(ANSWER_MARKER) :].split()
    assert kept == answer.split()[-len(kept) :]  # the newest part, in order, to the last word
    assert len(kept) > 500  # most of the room the prompt left
    assert fit.max_tokens == int(2048 * FitPolicy().output_share)  # clamped like any request
    assert fit.output_clamped
    assert fit.prompt_tokens == COUNTER.count_prompt(fit.messages)
    assert fit.prompt_tokens + fit.max_tokens + MARGIN <= 2048
    assert fit.fitted


def test_a_long_system_message_is_compressed_before_the_answer_loses_its_share() -> None:
    system = "\n".join(f"Rule {i}: " + words(20, f"r{i}_") for i in range(60))  # ~1,300 words
    answer = words(1500, "a")
    fit = fit_continuation(
        ask(system=system), answer, window=2048, requested_max_tokens=300, counter=COUNTER
    )
    system_kept, user, last = fit.messages
    assert fit.system_compressed
    assert len(system_kept["content"].split()) < len(system.split())
    assert user == ask()[0] | {"content": "tell me a long story"}
    kept = last["content"][len(ANSWER_MARKER) :].split()
    prompt_room = 2048 - fit.max_tokens - MARGIN
    assert len(kept) >= prompt_room // 2 - 2 * PER_MESSAGE - len(ANSWER_MARKER.split())


def test_old_turns_go_before_the_answer_is_cut() -> None:
    history: list[Message] = []
    for i in range(10):
        history += [
            {"role": "user", "content": words(80, f"u{i}_")},
            {"role": "assistant", "content": words(80, f"b{i}_")},
        ]
    messages = [*history, *ask()]
    answer = words(300, "a")
    fit = fit_continuation(messages, answer, window=1024, requested_max_tokens=200, counter=COUNTER)
    assert fit.dropped_messages > 0
    assert fit.messages[-1] == {"role": "assistant", "content": answer}  # whole: it fits
    assert fit.messages[-2] == ask()[0]


def test_a_latest_message_that_fills_the_window_leaves_nothing_to_continue_with() -> None:
    with pytest.raises(ContextOverflow) as overflow:
        fit_continuation(
            ask(words(2000, "q")),
            words(500),
            window=2048,
            requested_max_tokens=600,
            counter=COUNTER,
        )
    assert overflow.value.over_by > 0


def test_a_long_latest_message_still_leaves_the_answer_its_minimum() -> None:
    question = words(700, "q")  # more than half the prompt's room, less than all of it
    fit = fit_continuation(
        ask(question), words(2000, "a"), window=2048, requested_max_tokens=1000, counter=COUNTER
    )
    assert fit.messages[0]["content"] == question
    kept = fit.messages[-1]["content"][len(ANSWER_MARKER) :].split()
    assert len(kept) >= MIN_ANSWER_TOKENS
    assert kept[-1] == "a1999"


def test_a_system_message_never_costs_the_answer_its_place() -> None:
    """The question takes more than half the room: the system message goes (compressed), the
    answer keeps more than its minimum."""
    fit = fit_continuation(
        ask(words(915, "q"), words(881, "s")),
        words(3311, "a"),
        window=2473,
        requested_max_tokens=1800,
        counter=COUNTER,
    )
    assert fit.messages[-2]["content"] == words(915, "q")
    kept = fit.messages[-1]["content"][len(ANSWER_MARKER) :].split()
    assert len(kept) > MIN_ANSWER_TOKENS
    assert kept[-1] == "a3310"


def test_an_answer_kept_whole_carries_no_marker() -> None:
    fit = fit_continuation(
        ask(words(1154, "q"), words(1463, "s")),
        words(63, "a"),
        window=3187,
        requested_max_tokens=500,
        counter=COUNTER,
    )
    assert fit.messages[-1] == {"role": "assistant", "content": words(63, "a")}


def test_a_question_that_fills_the_window_squeezes_the_output_before_it_gives_up() -> None:
    """As a question too long for the output's share borrows it (fit_messages), so does a
    continuation behind one."""
    question = words(1300, "q")  # more than the 2048 window leaves the prompt beside 1228 out
    fit = fit_continuation(
        ask(question), words(2000, "a"), window=2048, requested_max_tokens=1500, counter=COUNTER
    )
    assert fit.messages[0]["content"] == question
    assert fit.messages[-1]["content"].split()[-1] == "a1999"
    assert FitPolicy().min_output_tokens <= fit.max_tokens < int(2048 * FitPolicy().output_share)
    assert COUNTER.count_prompt(fit.messages) + fit.max_tokens + MARGIN <= 2048


def history(turns: int, words_each: int) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out.append({"role": "user", "content": words(words_each, f"u{i}_")})
        out.append({"role": "assistant", "content": words(words_each, f"b{i}_")})
    return out


@settings(deadline=None)  # a shared CI machine's pauses are not this test's subject
@given(
    question=st.integers(1, 1500),
    answer=st.integers(1, 4000),
    system=st.integers(0, 1500),
    turns=st.integers(0, 6),
    window=st.integers(256, 4096),
    left=st.integers(1, 4000),
)
def test_a_continuation_fits_its_window_or_says_it_cannot(
    question: int, answer: int, system: int, turns: int, window: int, left: int
) -> None:
    question_text = words(question, "q")
    messages = [
        *([{"role": "system", "content": words(system, "s")}] if system else []),
        *history(turns, 60),
        {"role": "user", "content": question_text},
    ]
    text = words(answer, "a")
    try:
        fit = fit_continuation(
            messages, text, window=window, requested_max_tokens=left, counter=COUNTER
        )
    except ContextOverflow:
        # Only where the question, the template around it and the answer's minimum behind its
        # marker leave no room for the least output (a system message, even compressed, and
        # the marker of dropped turns take up to 40 tokens more): nothing else had to stay.
        least = min(answer, MIN_ANSWER_TOKENS) + len(ANSWER_MARKER.split()) + 2 * PER_MESSAGE
        output = min(FitPolicy().min_output_tokens, left, int(window * FitPolicy().output_share))
        assert question + least + PROMPT_OVERHEAD_TOKENS + output + MARGIN > window - 40
        return
    assert COUNTER.count_prompt(fit.messages) + fit.max_tokens + MARGIN <= window
    assert 1 <= fit.max_tokens <= left
    last = fit.messages[-1]
    assert last["role"] == "assistant"
    assert last["content"].split()[-1] == f"a{answer - 1}"  # it goes on from where it stopped
    assert last["content"].startswith(ANSWER_MARKER) == (last["content"] != text)
    assert fit.messages[-2]["content"] == question_text  # the question, whole
