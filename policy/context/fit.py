"""Fit a chat request to a backend's window: clamp the output, compress, slide, verify exactly.

Layers, applied only as far as needed:
1. `max_tokens` is clamped to `output_share` of the window (a missing one gets the clamp) and
   later to whatever the prompt leaves.
2. The system message is compressed extractively when the prompt exceeds its budget; it keeps at
   least `system_share` of the input budget if it needs it.
3. Old turns are dropped, oldest first, as whole turns (a user message with everything up to the
   next one, so tool calls and their results leave together); pinned turns stay; one marker
   message says how many messages were omitted. The turn at the boundary is compressed into the
   room left rather than lost whole, so little budget goes unused.
4. The result is counted exactly with the model's chat template; if the additive estimate was
   short, the search runs again with a smaller target.
5. Tool definitions the template lists take their room first. Past `tools_share` of the
   prompt's budget their descriptions are shortened, then left out (policy.context.tool_fit),
   before any turn is dropped; within it they stay whole while old turns go, and are shortened
   only where the newest turn cannot fit beside them. No tool is dropped. (A request that fits
   whole is passed through with its tools as sent.)

A request whose cheap upper bound (`TokenCounter.upper_bound`) already fits is passed through
without tokenizing: that is most requests, and it keeps fitting off the hot path.

The latest user message (and anything after it) is never altered, but for system messages a
client puts after it (Claude Code appends its environment, ~2,000 tokens, after the user's
words): where the tail does not fit even with the output cut to `min_output_tokens`, those are
compressed as the system message is, taking up to `system_share` of what the rest of the tail
leaves. If the tail cannot fit even with everything else gone, `ContextOverflow` says by how
much.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policy.context.compress import compress
from policy.context.tokens import Message, TokenCounter, message_text
from policy.context.tool_fit import SHORTENINGS, shortened_tools

__all__ = [
    "MARKER",
    "MAX_ATTEMPTS",
    "MESSAGE_OVERHEAD_TOKENS",
    "PROMPT_OVERHEAD_TOKENS",
    "Budget",
    "ContextOverflow",
    "Fit",
    "FitPolicy",
    "NoRoom",
    "Planner",
    "budget_for",
    "fit_messages",
    "group_turns",
    "pass_through",
]

# Template tokens around one message (ChatML: <|im_start|>role\n ... <|im_end|>\n); the exact
# count at the end corrects any error, this only steers the search.
MESSAGE_OVERHEAD_TOKENS = 5
PROMPT_OVERHEAD_TOKENS = 24  # generation prompt and a template's default system text
MAX_ATTEMPTS = 4
# The least a system note after the latest user message keeps when compressed.
MIN_NOTE_TOKENS = 16
MARKER = "[{n} earlier messages of this conversation were omitted to fit the context window.]"


@dataclass(frozen=True)
class FitPolicy:
    output_share: float = 0.6
    margin_tokens: int = 8
    # Without the model's tokenizer we only estimate, so we keep a tenth of the window spare.
    estimate_margin_share: float = 0.10
    min_output_tokens: int = 16
    system_share: float = 0.5
    pin_first_user_turn: bool = True
    marker_role: str = "system"
    # Tools may take this share of the prompt's budget before their descriptions are shortened
    # (policy.context.tool_fit); past it they are shortened before any turn is dropped.
    tools_share: float = 0.5


@dataclass(frozen=True)
class Fit:
    messages: list[Message]
    # For each fitted message, the index of the message it came from (None for the marker).
    sources: tuple[int | None, ...]
    max_tokens: int
    # The exact count, or (when `counted` is False) an upper bound that already fit.
    prompt_tokens: int
    system_compressed: bool
    dropped_messages: int
    compressed_messages: int
    output_clamped: bool
    counted: bool = True
    # The tools as the engine must get them where they were shortened (None: as sent), and how
    # far (policy.context.tool_fit's steps).
    tools: list[Message] | None = None
    tools_shortened: int = 0
    # Images replaced by a marker to make room (policy.context.images).
    dropped_images: int = 0

    @property
    def fitted(self) -> bool:
        return (
            self.system_compressed
            or self.dropped_messages > 0
            or self.compressed_messages > 0
            or self.tools_shortened > 0
            or self.dropped_images > 0
        )


class ContextOverflow(ValueError):
    """The latest user message alone does not fit the window (beside the tools, at their
    shortest, where the request lists some: `tools_tokens`)."""

    def __init__(self, over_by: int, window: int, tools_tokens: int = 0) -> None:
        super().__init__(over_by, window, tools_tokens)
        self.over_by = over_by
        self.window = window
        self.tools_tokens = tools_tokens

    def __str__(self) -> str:
        if self.tools_tokens:
            return (
                f"The latest message and the request's tools ({self.tools_tokens} tokens with "
                f"their descriptions left out) do not fit the model's context window of "
                f"{self.window} tokens, even with the rest of the conversation omitted: "
                f"{self.over_by} tokens too many; send fewer tools or a shorter message."
            )
        return (
            f"The latest message does not fit the model's context window of {self.window} "
            f"tokens, even with the rest of the conversation omitted: shorten it by at least "
            f"{self.over_by} tokens."
        )


class NoRoom(Exception):
    """What a draft needs: the tokens the part that may not change takes, at least."""

    def __init__(self, needed: int) -> None:
        self.needed = needed


@dataclass(frozen=True)
class _Draft:
    messages: list[Message]
    sources: tuple[int | None, ...]
    system_compressed: bool
    dropped: int
    compressed: int


@dataclass(frozen=True)
class Budget:
    """A window split between the output, a safety margin and the prompt."""

    max_tokens: int  # the clamped output
    margin: int
    prompt: int  # what the prompt may use with that output


def budget_for(
    window: int,
    requested_max_tokens: int | None,
    counter: TokenCounter,
    policy: FitPolicy,
) -> Budget:
    cap = max(1, int(window * policy.output_share))
    max_tokens = cap if requested_max_tokens is None else max(1, min(requested_max_tokens, cap))
    margin = policy.margin_tokens
    if not counter.exact:
        margin += math.ceil(window * policy.estimate_margin_share)
    return Budget(max_tokens, margin, window - max_tokens - margin)


# How far the tools' measured cost (`TokenCounter.count_tools`) may fall short of what they add
# to a given conversation (tokens merge differently where the listing meets the text): measured
# at 3 for the demo model's Hermes template; the exact count decides wherever it is close.
TOOLS_SLACK_TOKENS = 16


def pass_through(
    messages: Sequence[Message],
    *,
    window: int,
    requested_max_tokens: int | None,
    counter: TokenCounter,
    policy: FitPolicy = FitPolicy(),
    tools: Sequence[Message] | None = None,
) -> Fit | None:
    """The request as it is, output clamped, when a cheap upper bound proves the prompt fits
    (no tokenizing: microseconds); None when only `fit_messages` can tell. `tools`: the tools
    the template lists in the prompt (as vLLM renders them), which take room too."""
    budget = budget_for(window, requested_max_tokens, counter, policy)
    bound = counter.upper_bound(messages)
    if bound is not None and tools:
        bound += counter.count_tools(tools) + TOOLS_SLACK_TOKENS
    if bound is None or bound > budget.prompt:
        return None
    return Fit(
        messages=list(messages),
        sources=tuple(range(len(messages))),
        max_tokens=budget.max_tokens,
        prompt_tokens=bound,
        system_compressed=False,
        dropped_messages=0,
        compressed_messages=0,
        output_clamped=_clamped(requested_max_tokens, budget.max_tokens),
        counted=False,
    )


def fit_messages(
    messages: Sequence[Message],
    *,
    window: int,
    requested_max_tokens: int | None,
    counter: TokenCounter,
    policy: FitPolicy = FitPolicy(),
    tools: Sequence[Message] | None = None,
    media: Callable[[Message], int] | None = None,
) -> Fit:
    """`media`: the tokens a message's images add (policy.context.images), which the exact
    count includes and the search's estimates must too."""
    quick = pass_through(
        messages,
        window=window,
        requested_max_tokens=requested_max_tokens,
        counter=counter,
        policy=policy,
        tools=tools,
    )
    if quick is not None:
        return quick
    budget = budget_for(window, requested_max_tokens, counter, policy)
    overflow: ContextOverflow | None = None
    # The tools as sent, then shorter (tool_fit): shortened before any turn is dropped where
    # they take more than their share, and wherever the prompt does not fit beside them. The
    # system notes after the user's message are compressed last, beside the shortest tools.
    steps = range(SHORTENINGS + 1 if tools else 1)
    attempts = [(False, step, False) for step in steps]
    if _has_notes(messages):
        attempts.append((True, steps[-1], False))
    # Last, where the latest message leaves room for everything but the marker: the earlier
    # turns all go without it (an answer without the note beats refusing a prompt that fits).
    last_notes, last_step, _ = attempts[-1]
    attempts.append((last_notes, last_step, True))
    for compress_notes, step, unmarked in attempts:
        listed = shortened_tools(tools, step) if tools else None
        last = step == SHORTENINGS or not tools
        if listed and not last and counter.count_tools(listed) > policy.tools_share * budget.prompt:
            continue
        try:
            draft, prompt_tokens = _plan(
                messages, counter, policy, listed, budget, window, compress_notes, media, unmarked
            )
        except ContextOverflow as error:
            overflow = error
            continue
        final_max_tokens = min(budget.max_tokens, window - prompt_tokens - budget.margin)
        return Fit(
            messages=draft.messages,
            sources=draft.sources,
            max_tokens=final_max_tokens,
            prompt_tokens=prompt_tokens,
            system_compressed=draft.system_compressed,
            dropped_messages=draft.dropped,
            compressed_messages=draft.compressed,
            output_clamped=_clamped(requested_max_tokens, final_max_tokens),
            tools=listed if step else None,
            tools_shortened=step,
        )
    assert overflow is not None  # the last step raised it, or returned
    if tools:
        listed = shortened_tools(tools, SHORTENINGS)
        overflow = ContextOverflow(overflow.over_by, window, counter.count_tools(listed))
    raise overflow


def _plan(
    messages: Sequence[Message],
    counter: TokenCounter,
    policy: FitPolicy,
    tools: Sequence[Message] | None,
    budget: Budget,
    window: int,
    compress_notes: bool = False,
    media: Callable[[Message], int] | None = None,
    unmarked: bool = False,
) -> tuple[_Draft, int]:
    """A draft within the input budget, else within the output's share too (the tail alone
    needs more); `compress_notes`: the latter only, the system notes after the latest user
    message compressed (the output gave way already, without that); `unmarked`: the latter
    only, the earlier turns all gone without the marker (every other way failed)."""
    planner = Planner(list(messages), counter, policy, tools, media)
    squeezed_budget = window - budget.margin - min(policy.min_output_tokens, budget.max_tokens)
    if not compress_notes and not unmarked:
        try:
            return planner.plan(budget.prompt)
        except NoRoom:
            pass
    try:
        return planner.plan(squeezed_budget, compress_notes=compress_notes, unmarked=unmarked)
    except NoRoom as no_room:
        raise ContextOverflow(max(1, no_room.needed - squeezed_budget), window) from None


def _has_notes(messages: Sequence[Message]) -> bool:
    """A system message after the latest user message (Claude Code's environment)."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return bool(users) and any(m.get("role") == "system" for m in messages[users[-1] + 1 :])


def _clamped(requested_max_tokens: int | None, max_tokens: int) -> bool:
    return requested_max_tokens is None or max_tokens < requested_max_tokens


def group_turns(indices: Sequence[int], messages: Sequence[Message]) -> list[list[int]]:
    """Whole turns: each user message with what follows it up to the next user message."""
    turns: list[list[int]] = []
    for i in indices:
        if messages[i].get("role") == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    return turns


class Planner:
    """Drafts of a conversation within a prompt budget: the system message compressed, old
    turns dropped behind a marker, the latest user message and all after it kept whole."""

    def __init__(
        self,
        messages: list[Message],
        counter: TokenCounter,
        policy: FitPolicy,
        tools: Sequence[Message] | None = None,
        media: Callable[[Message], int] | None = None,
    ) -> None:
        self._messages = messages
        self._counter = counter
        self._policy = policy
        self._media = media
        # The tools' room comes off every target; the exact count renders them.
        self._tools = list(tools) if tools else None
        self._listed = counter.count_tools(tools) if tools else 0
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        self._tail_start = users[-1] if users else max(len(messages) - 1, 0)
        has_system = bool(messages) and messages[0].get("role") == "system"
        self._system = 0 if has_system and self._tail_start > 0 else None
        first_history = 1 if self._system is not None else 0
        self._turns = group_turns(range(first_history, self._tail_start), messages)
        self._query = message_text(messages[self._tail_start]) if messages else ""

    def plan(
        self, budget: int, *, compress_notes: bool = False, unmarked: bool = False
    ) -> tuple[_Draft, int]:
        """A draft within `budget` by exact count; shrinks the target when the estimate was low.
        `compress_notes`: the system notes after the latest user message may be compressed;
        `unmarked`: where the marker does not fit, the earlier turns may all go without it."""
        target = budget - self._listed
        for _ in range(MAX_ATTEMPTS):
            try:
                draft = self._draft(target, compress_notes, unmarked)
            except NoRoom as no_room:  # what the messages need; the tools need their room too
                raise NoRoom(no_room.needed + self._listed) from None
            exact = self._counter.count_prompt(draft.messages, self._tools)
            if exact <= budget:
                return draft, exact
            target -= exact - budget + max(1, budget // 100)
        raise NoRoom(exact)

    def _cost(self, message: Message) -> int:
        images = self._media(message) if self._media is not None else 0
        return self._counter.count_text(message_text(message)) + MESSAGE_OVERHEAD_TOKENS + images

    def _cost_of(self, indices: Sequence[int]) -> int:
        return sum(self._cost(self._messages[i]) for i in indices)

    def _draft(self, target: int, compress_notes: bool, unmarked: bool = False) -> _Draft:
        tail = list(range(self._tail_start, len(self._messages)))
        notes, tail_cost = self._fit_tail(tail, target, compress_notes)
        room = target - tail_cost
        history_cost = sum(self._cost_of(turn) for turn in self._turns)
        system_cost = self._cost_of([self._system]) if self._system is not None else 0
        if system_cost + history_cost <= room:
            return self._assemble(None, [], self._turns, None, tail, dropped=0, notes=notes)
        marker_cost = self._cost({"content": MARKER.format(n=len(self._messages))})
        system_text, system_cost = self._fit_system(room, history_cost, marker_cost)
        room -= system_cost
        pinned, turns = self._split_pinned()
        pinned_cost = sum(self._cost_of(t) for t in pinned)
        if pinned_cost + marker_cost > room:
            pinned, pinned_cost = [], 0
            turns = self._turns
        room -= pinned_cost + marker_cost
        if room < 0 and unmarked and room + marker_cost + system_cost >= 0:
            # No room for the marker: every earlier turn goes without it, and the system
            # message may take what they and the marker leave.
            system_text, _ = self._fit_system(target - tail_cost, 0, 0)
            dropped = sum(len(t) for t in self._turns)
            return self._assemble(system_text, [], [], None, tail, dropped, notes, marked=False)
        if room < 0:
            raise NoRoom(target - room)
        kept: list[list[int]] = []
        for turn in reversed(turns):
            cost = self._cost_of(turn)
            if cost > room:
                break
            kept.insert(0, turn)
            room -= cost
        squeezed = None
        if len(kept) < len(turns):  # the newest dropped turn may fit, compressed, in what is left
            boundary = turns[len(turns) - len(kept) - 1]
            squeezed = self._squeeze(boundary, room)
            if squeezed is not None:
                kept.insert(0, boundary)
        kept_count = sum(len(t) for t in pinned + kept)
        dropped = sum(len(t) for t in self._turns) - kept_count
        return self._assemble(system_text, pinned, kept, squeezed, tail, dropped, notes)

    def _fit_tail(
        self, tail: list[int], target: int, compress_notes: bool
    ) -> tuple[dict[int, str] | None, int]:
        """The tail's system notes compressed where the tail as sent exceeds `target` and that
        is allowed (None: as sent), and the tail's cost with them."""
        cost = self._cost_of(tail) + PROMPT_OVERHEAD_TOKENS
        if cost <= target:
            return None, cost
        if not compress_notes:
            raise NoRoom(cost)
        notes = [
            i
            for i in tail[1:]
            if self._messages[i].get("role") == "system"
            and isinstance(self._messages[i].get("content"), str)
        ]
        notes_cost = self._cost_of(notes)
        fixed = cost - notes_cost
        # Their share beside the system message and the history, as `_fit_system` gives it,
        # and all that those do not need.
        share = self._policy.system_share if self._system is not None else 1.0
        rest = sum(self._cost_of(turn) for turn in self._turns)
        rest += self._cost_of([self._system]) if self._system is not None else 0
        room = target - fixed
        allowed = max(int(room * share), room - rest)
        least = (MESSAGE_OVERHEAD_TOKENS + MIN_NOTE_TOKENS) * len(notes)
        if not notes or allowed < least:
            raise NoRoom(fixed + math.ceil(least / share))
        texts = {}
        for i in notes:
            budget = allowed * self._cost_of([i]) // notes_cost - MESSAGE_OVERHEAD_TOKENS
            texts[i] = compress(
                message_text(self._messages[i]), budget, self._counter.count_text, self._query
            )
            fixed += self._counter.count_text(texts[i]) + MESSAGE_OVERHEAD_TOKENS
        return texts, fixed

    def _fit_system(self, room: int, history_cost: int, marker_cost: int) -> tuple[str | None, int]:
        if self._system is None:
            return None, 0
        text = message_text(self._messages[self._system])
        cost = self._cost_of([self._system])
        allowed = max(int(room * self._policy.system_share), room - history_cost)
        allowed = min(allowed, room - marker_cost)
        if cost <= allowed:
            return None, cost
        budget = max(allowed - MESSAGE_OVERHEAD_TOKENS, 0)
        compressed = compress(text, budget, self._counter.count_text, self._query)
        return compressed, self._counter.count_text(compressed) + MESSAGE_OVERHEAD_TOKENS

    def _split_pinned(self) -> tuple[list[list[int]], list[list[int]]]:
        first = self._turns[:1]
        if self._policy.pin_first_user_turn and first and self._is_user_turn(first[0]):
            return first, self._turns[1:]
        return [], self._turns

    def _is_user_turn(self, turn: list[int]) -> bool:
        return self._messages[turn[0]].get("role") == "user"

    def _squeeze(self, turn: list[int], room: int) -> dict[int, str] | None:
        """Compress a plain-text turn into `room`; None when it has tool traffic or no room."""
        plain = all(
            isinstance(self._messages[i].get("content"), str)
            and not self._messages[i].get("tool_calls")
            and self._messages[i].get("role") in {"user", "assistant"}
            for i in turn
        )
        total = self._cost_of(turn)
        if not plain or room < MESSAGE_OVERHEAD_TOKENS * len(turn) + 16:
            return None
        texts = {}
        for i in turn:
            share = room * self._cost_of([i]) // total - MESSAGE_OVERHEAD_TOKENS
            texts[i] = compress(
                message_text(self._messages[i]), share, self._counter.count_text, self._query
            )
        # Each message keeps some of its words, or the turn goes whole: a reply kept beside an
        # emptied question (or the reverse) misleads more than the marker's count of dropped ones.
        kept = all(t.strip() for i, t in texts.items() if message_text(self._messages[i]).strip())
        return texts if kept and any(t.strip() for t in texts.values()) else None

    def _assemble(
        self,
        system_text: str | None,
        pinned: list[list[int]],
        kept: list[list[int]],
        squeezed: dict[int, str] | None,
        tail: list[int],
        dropped: int,
        notes: dict[int, str] | None = None,
        marked: bool = True,
    ) -> _Draft:
        out: list[Message] = []
        sources: list[int | None] = []

        def add(index: int | None, message: Message) -> None:
            out.append(message)
            sources.append(index)

        if self._system is not None:
            original = self._messages[self._system]
            add(
                self._system,
                original if system_text is None else {**original, "content": system_text},
            )
        for turn in pinned:
            for i in turn:
                add(i, self._messages[i])
        if dropped and marked:
            add(None, {"role": self._policy.marker_role, "content": MARKER.format(n=dropped)})
        for turn in kept:
            for i in turn:
                message = self._messages[i]
                if squeezed and i in squeezed:
                    message = {**message, "content": squeezed[i]}
                add(i, message)
        for i in tail:
            message = self._messages[i]
            add(i, message if not notes or i not in notes else {**message, "content": notes[i]})
        compressed = system_text is not None or bool(notes)
        return _Draft(out, tuple(sources), compressed, dropped, len(squeezed or {}))
