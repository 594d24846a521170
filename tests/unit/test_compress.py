"""Extractive compression under budgets smaller than the text's units (policy/context/compress.py):
a text of long lines or one long paragraph keeps the head of its best unit, not nothing."""

from __future__ import annotations

from policy.context.compress import compress, split_units
from policy.context.fit import fit_messages
from policy.context.tokens import CharEstimateCounter

ESTIMATE = CharEstimateCounter()  # a token for every 4 characters
# One paragraph: no line break and no sentence end, so its units are slices of MAX_UNIT_CHARS
# (about 300 tokens each here, the last 230).
PARAGRAPH = " ".join(f"rule{i} always answer politely" for i in range(380))


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
    out = compress(text, 10, len)
    assert out == "规" * 10


def test_a_budget_that_holds_whole_lines_keeps_only_whole_lines() -> None:
    lines = [words(30), words(5), words(30), words(5)]  # 30-word lines do not fit beside others
    text = "\n".join(lines)
    out = compress(text, 20, lambda t: len(t.split()))
    assert out.split("\n") == [lines[1], lines[3]]


def test_no_budget_keeps_nothing() -> None:
    assert compress(PARAGRAPH, 0, ESTIMATE.count_text) == ""
    assert compress("supercalifragilistic", 0, len) == ""


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
