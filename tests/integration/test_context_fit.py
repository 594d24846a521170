"""Fitting on the demo model's real tokenizer: exact counts, never an overflow, nothing lost."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy.context.compress import compress
from policy.context.fit import (
    MARKER,
    MESSAGE_OVERHEAD_TOKENS,
    PROMPT_OVERHEAD_TOKENS,
    ContextOverflow,
    Fit,
    FitPolicy,
    fit_messages,
)
from policy.context.tokens import CharEstimateCounter, ChatTemplateCounter

WORDS = (
    "the model serves requests on pools of GPUs and falls back to a CPU replica when memory "
    "runs short config window token budget cache router breaker queue priority user agent"
).split()

sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(" ".join)
texts = st.lists(sentences, min_size=1, max_size=8).map("\n".join)


@st.composite
def turns(draw: Any) -> list[dict[str, Any]]:
    user = {"role": "user", "content": draw(texts)}
    if draw(st.booleans()) and draw(st.booleans()):
        call: dict[str, Any] = {"id": f"call_{draw(st.integers(0, 9999))}", "type": "function"}
        call["function"] = {"name": "lookup", "arguments": '{"q": "x"}'}
        return [
            user,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": draw(texts)},
            {"role": "assistant", "content": draw(texts)},
        ]
    return [user, {"role": "assistant", "content": draw(texts)}]


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        lines = draw(st.lists(sentences, min_size=1, max_size=80))
        messages.append({"role": "system", "content": "\n".join(lines)})
    for turn in draw(st.lists(turns(), max_size=12)):
        messages.extend(turn)
    messages.append({"role": "user", "content": draw(texts)})
    return messages


def positions_in(kept: list[str], original: list[str]) -> list[int]:
    """Where each kept line stands in the original: every one whole, but at most one, the head
    of a line that did not fit whole (policy/context/compress.py)."""
    whole = [line for line in kept if line in original]
    assert len(kept) - len(whole) <= 1, [line for line in kept if line not in original]
    return [
        original.index(line)
        if line in original
        else next(i for i, full in enumerate(original) if full.startswith(line))
        for line in kept
    ]


def check_invariants(
    original: list[dict[str, Any]], fit: Fit, window: int, counter: ChatTemplateCounter
) -> None:
    exact = counter.count_prompt(fit.messages)
    if fit.counted:
        assert fit.prompt_tokens == exact
    else:  # passed through on the upper bound
        assert exact <= fit.prompt_tokens
        assert fit.messages == original
    assert exact + fit.max_tokens <= window
    assert 1 <= fit.max_tokens <= int(window * 0.6)
    # The latest user message (the last message here) is untouched, byte for byte.
    assert fit.messages[-1] == original[-1]
    sources = [s for s in fit.sources if s is not None]
    assert sources == sorted(set(sources)), "message order must be preserved"
    markers = [m for m, s in zip(fit.messages, fit.sources, strict=True) if s is None]
    assert len(markers) <= (1 if fit.dropped_messages else 0)
    if markers:
        assert f"{fit.dropped_messages} earlier messages" in markers[0]["content"]
    elif fit.dropped_messages:  # no room for the marker: every earlier turn went
        assert fit.dropped_messages == sum(1 for m in original[:-1] if m["role"] != "system")
        assert [m["role"] for m in fit.messages[:-1]] in ([], ["system"])
    kept = set(sources)
    for i, message in enumerate(original):
        if message.get("role") == "tool":  # a tool result travels with the call that asked
            assert (i in kept) == (i - 1 in kept)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversation=conversations(),
    window=st.integers(min_value=256, max_value=4096),
    requested=st.none() | st.integers(min_value=1, max_value=10_000),
)
def test_fitted_prompt_never_overflows_and_keeps_the_latest_message(
    demo_counter: ChatTemplateCounter,
    conversation: list[dict[str, Any]],
    window: int,
    requested: int | None,
) -> None:
    try:
        fit = fit_messages(
            conversation, window=window, requested_max_tokens=requested, counter=demo_counter
        )
    except ContextOverflow as overflow:  # refusing is one of the two right outcomes
        alone = demo_counter.count_prompt(conversation[-1:])
        assert overflow.over_by > 0  # noqa: PT017
        assert alone + FitPolicy().min_output_tokens > window - 3 * FitPolicy().margin_tokens
        return
    check_invariants(conversation, fit, window, demo_counter)


def chat(turn_count: int, words_per_message: int) -> list[dict[str, Any]]:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words_per_message))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for i in range(turn_count):
        messages.append({"role": "user", "content": f"question {i}: {body}"})
        messages.append({"role": "assistant", "content": f"answer {i}: {body}"})
    messages.append({"role": "user", "content": "What did we decide about the router?"})
    return messages


def test_short_request_is_untouched_and_max_tokens_honoured(
    demo_counter: ChatTemplateCounter,
) -> None:
    messages = chat(2, 10)
    fit = fit_messages(messages, window=8192, requested_max_tokens=100, counter=demo_counter)
    assert fit.messages == messages
    assert not fit.fitted
    assert fit.max_tokens == 100
    assert not fit.output_clamped


def test_missing_max_tokens_gets_the_clamp_not_the_window(
    demo_counter: ChatTemplateCounter,
) -> None:
    fit = fit_messages(chat(1, 5), window=8192, requested_max_tokens=None, counter=demo_counter)
    assert fit.max_tokens == int(8192 * 0.6)
    assert fit.output_clamped


def test_conversation_ten_times_the_window_fits_and_uses_the_budget(
    demo_counter: ChatTemplateCounter,
) -> None:
    window = 2048
    messages = chat(60, 200)
    assert demo_counter.count_prompt(messages) > 10 * window
    fit = fit_messages(messages, window=window, requested_max_tokens=256, counter=demo_counter)
    check_invariants(messages, fit, window, demo_counter)
    assert fit.dropped_messages > 0
    assert fit.messages[1]["content"].startswith("question 0")  # the pinned first turn
    budget = window - 256 - FitPolicy().margin_tokens
    assert fit.prompt_tokens >= 0.9 * budget


def test_huge_system_prompt_is_compressed_keeping_its_headers(
    demo_counter: ChatTemplateCounter,
) -> None:
    sections = []
    for i in range(400):
        sections.append(f"## Section {i}")
        sections.extend(f"detail {i}.{j}: " + " ".join(WORDS[:12]) for j in range(8))
    system = "\n".join(sections)
    assert demo_counter.count_text(system) > 40_000
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Section 7?"}]
    fit = fit_messages(messages, window=4096, requested_max_tokens=512, counter=demo_counter)
    check_invariants(messages, fit, 4096, demo_counter)
    assert fit.system_compressed
    kept_lines = fit.messages[0]["content"].split("\n")
    positions_in(kept_lines, system.split("\n"))
    assert sum(line.startswith("## Section") for line in kept_lines) > 50


def test_latest_message_that_cannot_fit_says_by_how_much(
    demo_counter: ChatTemplateCounter,
) -> None:
    huge = {"role": "user", "content": " ".join(WORDS * 200)}
    with pytest.raises(ContextOverflow) as raised:
        fit_messages([huge], window=1024, requested_max_tokens=None, counter=demo_counter)
    needed = demo_counter.count_prompt([huge])
    assert raised.value.over_by >= needed - 1024
    assert f"{raised.value.over_by} tokens" in str(raised.value)


def test_long_latest_message_borrows_the_output_share(demo_counter: ChatTemplateCounter) -> None:
    long = {"role": "user", "content": " ".join(WORDS[:20] * 30)}
    prompt = demo_counter.count_prompt([long])
    window = prompt + 100
    assert prompt > window * 0.4  # more than the input share alone allows
    fit = fit_messages([long], window=window, requested_max_tokens=None, counter=demo_counter)
    assert fit.messages == [long]
    assert fit.prompt_tokens + fit.max_tokens <= window
    assert fit.max_tokens >= FitPolicy().min_output_tokens


def test_a_latest_message_that_leaves_no_room_for_the_marker_goes_alone(
    demo_counter: ChatTemplateCounter,
) -> None:
    history = [
        {"role": "user", "content": " ".join(WORDS * 2)},
        {"role": "assistant", "content": " ".join(WORDS)},
    ]
    long = {"role": "user", "content": " ".join(WORDS[:20] * 30)}
    # The search's reckoning of the latest message, and half of what the marker would take.
    tail = demo_counter.count_text(long["content"]) + MESSAGE_OVERHEAD_TOKENS
    tail += PROMPT_OVERHEAD_TOKENS
    marker = demo_counter.count_text(MARKER.format(n=2)) + MESSAGE_OVERHEAD_TOKENS
    policy = FitPolicy()
    window = tail + policy.min_output_tokens + policy.margin_tokens + marker // 2
    fit = fit_messages(
        [*history, long], window=window, requested_max_tokens=None, counter=demo_counter
    )
    assert fit.messages == [long]
    assert fit.dropped_messages == 2
    assert fit.prompt_tokens == demo_counter.count_prompt([long])
    assert fit.prompt_tokens + fit.max_tokens + policy.margin_tokens <= window
    assert fit.max_tokens >= policy.min_output_tokens


def test_the_output_gives_way_before_the_history_goes_without_its_marker() -> None:
    # The history and the latest message fit beside a squeezed output: nothing is dropped.
    history = [
        {"role": "user", "content": "first question " * 5},
        {"role": "assistant", "content": "first answer " * 5},
        {"role": "user", "content": "second question " * 5},
        {"role": "assistant", "content": "second answer " * 5},
    ]
    latest = {"role": "user", "content": "x" * 1004}
    counter = CharEstimateCounter()
    fit = fit_messages([*history, latest], window=1000, requested_max_tokens=None, counter=counter)
    assert fit.messages == [*history, latest]
    assert fit.dropped_messages == 0
    assert fit.max_tokens < int(1000 * FitPolicy().output_share)  # the output gave way


def test_a_system_note_after_the_users_message_is_compressed_only_as_a_last_resort(
    demo_counter: ChatTemplateCounter,
) -> None:
    """A client's note after the user's words (Claude Code's environment) is compressed only
    where even the output cut to its minimum leaves no room for it as sent; the user's words
    stay whole."""
    system = {
        "role": "system",
        "content": "\n".join(" ".join(WORDS[i:] + WORDS[:i]) for i in range(20)),
    }
    user = {"role": "user", "content": "Which router breaker opened?"}
    note = {
        "role": "system",
        "content": "\n".join(f"## Env {i}: " + " ".join(WORDS) for i in range(30)),
    }
    conversation = [system, user, note]
    tail = demo_counter.count_prompt([user, note])
    roomy = fit_messages(
        conversation, window=tail + 200, requested_max_tokens=None, counter=demo_counter
    )
    assert roomy.messages[1:] == [user, note]  # the note as sent: the output gave way first
    tight = tail * 2 // 3
    fit = fit_messages(conversation, window=tight, requested_max_tokens=None, counter=demo_counter)
    assert fit.system_compressed
    assert fit.messages[1] == user
    kept = fit.messages[2]["content"].split("\n")
    assert fit.messages[2]["role"] == "system"
    assert 0 < len(kept) < 30
    positions_in(kept, note["content"].split("\n"))
    assert demo_counter.count_prompt(fit.messages) + fit.max_tokens <= tight
    with pytest.raises(ContextOverflow):  # the user's words alone do not fit: refused, as ever
        fit_messages(
            [system, {"role": "user", "content": " ".join(WORDS * 40)}, note],
            window=256,
            requested_max_tokens=None,
            counter=demo_counter,
        )


def test_estimate_counter_keeps_a_wider_margin() -> None:
    messages = chat(40, 30)
    fit = fit_messages(
        messages, window=2048, requested_max_tokens=256, counter=CharEstimateCounter()
    )
    assert fit.prompt_tokens + fit.max_tokens <= 2048 - 204
    assert fit.dropped_messages > 0


def test_compress_keeps_order_and_budget(demo_counter: ChatTemplateCounter) -> None:
    text = "\n".join(
        ["# Title", "intro line about pools"]
        + [f"filler {i} " + " ".join(WORDS) for i in range(50)]
        + ["def route(request):", "timeout: 30", "closing summary"]
    )
    out = compress(text, 120, demo_counter.count_text, query="how does route work")
    lines = out.split("\n")
    assert demo_counter.count_text(out) <= 120
    assert lines[0] == "# Title"
    assert "def route(request):" in lines
    assert "timeout: 30" in lines
    original = text.split("\n")
    positions = positions_in(lines, original)
    assert positions == sorted(positions)
    assert compress(text, 120, demo_counter.count_text, "how does route work") == out


def test_overflow_always_names_a_positive_excess(demo_counter: ChatTemplateCounter) -> None:
    system = {"role": "system", "content": "Be brief. " * 50}
    huge = {"role": "user", "content": " ".join(WORDS * 40)}
    for window in (256, 300, 400):
        try:
            fit_messages(
                [system, huge], window=window, requested_max_tokens=8, counter=demo_counter
            )
        except ContextOverflow as overflow:  # some windows fit, some refuse
            assert overflow.over_by >= 1  # noqa: PT017


plain_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=300)}
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=plain_messages)
def test_the_upper_bound_is_never_below_the_exact_count(
    demo_counter: ChatTemplateCounter, messages: list[dict[str, Any]]
) -> None:
    bound = demo_counter.upper_bound(messages)
    assert bound is not None
    assert bound >= demo_counter.count_prompt(messages)


def test_messages_with_tool_traffic_get_no_bound(demo_counter: ChatTemplateCounter) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    assert demo_counter.upper_bound(messages) is None
    assert CharEstimateCounter().upper_bound(messages[:1]) is None


def test_a_short_request_is_passed_through_without_counting(
    demo_counter: ChatTemplateCounter,
) -> None:
    messages = [{"role": "user", "content": "Say hello"}]
    fit = fit_messages(messages, window=8192, requested_max_tokens=16, counter=demo_counter)
    assert not fit.counted
    assert not fit.fitted
    assert (fit.messages, fit.max_tokens) == (messages, 16)
    assert fit.prompt_tokens >= demo_counter.count_prompt(messages)
