"""Extractive compression under budgets smaller than the text's units (policy/context/compress.py):
a text of long lines or one long paragraph keeps the head of its best unit, not nothing."""

from __future__ import annotations

from policy.context.compress import MIN_HEAD_TOKENS, compress, split_units
from policy.context.fit import fit_messages
from policy.context.tokens import CharEstimateCounter

ESTIMATE = CharEstimateCounter()  # a token for every 4 characters
# One paragraph: no line break and no sentence end, so its units are slices of MAX_UNIT_CHARS
# (about 300 tokens each here, the last 230).
PARAGRAPH = " ".join(f"rule{i} always answer politely" for i in range(380))
LAST_QUESTION = {"role": "user", "content": "Which rule comes first?"}


def words(count: int) -> str:
    return " ".join(f"w{i}" for i in range(count))


def test_a_paragraph_under_a_budget_smaller_than_its_units_keeps_its_head() -> None:
    assert min(ESTIMATE.count_text(unit) for unit in split_units(PARAGRAPH)) > 100
    out = compress(PARAGRAPH, 100, ESTIMATE.count_text)
    assert PARAGRAPH.startswith(out)
    assert 90 <= ESTIMATE.count_text(out) <= 100  # the budget, nearly all of it
    assert PARAGRAPH[len(out)] == " "  # cut after a word, not inside one


def test_text_without_spaces_is_cut_between_characters() -> None:
    text = "规" * 5000  # Chinese has no spaces to cut at
    assert compress(text, 40, len) == "规" * 40


def test_a_space_far_before_the_cut_does_not_cost_the_head() -> None:
    """One English word, then Chinese: cut between characters, not back at that word."""
    text = "请用 JSON 回答" + "规" * 3000
    out = compress(text, 200, len)
    assert out == text[:200]


def test_a_title_and_a_paragraph_keep_the_title_and_a_head_of_the_paragraph() -> None:
    """The title fits whole; the room it leaves goes to the head of the paragraph's best slice
    (its last: the end of a text scores as its beginning does), not to nothing."""
    text = "You are a helpful assistant.\n\n" + PARAGRAPH
    out = compress(text, 100, ESTIMATE.count_text)
    title, head = out.split("\n")
    assert title == "You are a helpful assistant."
    assert any(unit.strip().startswith(head) for unit in split_units(PARAGRAPH))
    assert ESTIMATE.count_text(head) >= 80  # the room the title left, most of it


def test_a_budget_that_holds_whole_lines_keeps_only_whole_lines() -> None:
    lines = [words(30), words(5), words(30), words(5)]  # 30-word lines do not fit beside others
    text = "\n".join(lines)
    out = compress(text, 20, lambda t: len(t.split()))
    assert out.split("\n") == [lines[1], lines[3]]  # 8 words of room left: no head of one


def test_a_counter_that_shrinks_as_text_grows_still_gets_a_head_within_budget() -> None:
    """A tokenizer's count may fall as a prefix grows (merges): the head stays in budget."""

    def bumpy(text: str) -> int:
        return len(text) // 4 + (3 if text.endswith("e") else 0)

    out = compress(PARAGRAPH, 60, bumpy)
    assert out
    assert PARAGRAPH.startswith(out)
    assert bumpy(out) <= 60


def test_too_small_a_budget_keeps_nothing() -> None:
    assert compress(PARAGRAPH, 0, ESTIMATE.count_text) == ""
    assert compress(PARAGRAPH, MIN_HEAD_TOKENS - 1, ESTIMATE.count_text) == ""


def test_a_one_paragraph_system_prompt_over_the_window_is_kept_compressed() -> None:
    """Its budget beside the user's question is smaller than any of its slices: the system
    message keeps the paragraph's head, the instructions a model most needs, instead of
    going empty."""
    messages = [
        {"role": "system", "content": PARAGRAPH},
        {"role": "user", "content": "Which rule comes first?"},
    ]
    fit = fit_messages(messages, window=384, requested_max_tokens=64, counter=ESTIMATE)
    assert fit.system_compressed
    system = fit.messages[0]
    assert system["role"] == "system"
    assert system["content"].startswith("rule0 always answer politely")
    assert ESTIMATE.count_text(system["content"]) > 150  # most of its room (it went empty before)
    assert PARAGRAPH.startswith(system["content"])
    assert fit.messages[-1] == messages[-1]
    assert ESTIMATE.count_prompt(fit.messages) + fit.max_tokens <= 384


def test_a_turn_whose_question_keeps_no_word_goes_whole() -> None:
    """The newest turn that does not fit is compressed into the room left only where each of
    its messages keeps some words: a reply's head beside an emptied question is dropped with
    it, behind the marker."""
    question = {"role": "user", "content": "Tell me every rule."}
    messages = [question, {"role": "assistant", "content": PARAGRAPH}, LAST_QUESTION]
    fit = fit_messages(messages, window=384, requested_max_tokens=32, counter=ESTIMATE)
    assert fit.dropped_messages == 2
    assert [m["role"] for m in fit.messages] == ["system", "user"]  # the marker, the question
    assert fit.messages[-1] == LAST_QUESTION


def test_a_turn_of_two_long_messages_keeps_the_head_of_each() -> None:
    messages = [
        {"role": "user", "content": PARAGRAPH},
        {"role": "assistant", "content": PARAGRAPH},
        LAST_QUESTION,
    ]
    fit = fit_messages(messages, window=384, requested_max_tokens=32, counter=ESTIMATE)
    user, reply, last = fit.messages
    assert (user["role"], reply["role"], last) == ("user", "assistant", LAST_QUESTION)
    assert PARAGRAPH.startswith(user["content"])
    assert PARAGRAPH.startswith(reply["content"])
    assert min(ESTIMATE.count_text(user["content"]), ESTIMATE.count_text(reply["content"])) > 50
