"""An answer cut off mid-stream, fitted to the window of the link that continues it.

Mid-stream failover (`policy.stream_migration`) asks the next link to continue the text the
client already has: the request's messages, then that text as a final assistant message. On a
link with a smaller window (the CPU fallback's) the two may not fit together, and a
continuation is fitted like any request, by the sliding window's rule:
1. The output is what is left of the answer's budget, clamped as for any request.
2. If the prompt and the whole answer so far fit (old turns dropped, the system message
   compressed, as `fit_messages` would), that is the continuation.
3. Else the prompt is fitted into its share of the room (`ANSWER_SHARE` goes to the answer,
   or less when the answer is short), or, where the prompt cannot shrink that far, into the
   least it needs; the answer keeps its newest part in whatever the prompt leaves, behind a
   marker saying its start was cut.
4. Where even the prompt's fitted minimum leaves no room for `MIN_ANSWER_TOKENS` of the answer,
   the output gives up its room down to `FitPolicy.min_output_tokens`, as for a latest message
   too long to fit; only when that is not enough either does this link refuse the continuation
   (`ContextOverflow`).

The marker is written into the assistant message, not a message of its own between the user's
and the assistant's, which templates that want turns to alternate would refuse to render.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policy.context.fit import (
    MAX_ATTEMPTS,
    MESSAGE_OVERHEAD_TOKENS,
    ContextOverflow,
    Fit,
    FitPolicy,
    NoRoom,
    Planner,
    budget_for,
)
from policy.context.tokens import Message, TokenCounter

__all__ = ["ANSWER_MARKER", "ANSWER_SHARE", "MIN_ANSWER_TOKENS", "fit_continuation"]

ANSWER_MARKER = "[The start of this answer was omitted to fit the context window.] ..."
# The room the answer so far may claim when it and the prompt do not fit together: half, so a
# long system message is compressed rather than the model losing its own last paragraphs.
ANSWER_SHARE = 0.5
# Less of its own text than this and the model no longer knows where it was.
MIN_ANSWER_TOKENS = 32


@dataclass(frozen=True)
class _Request:
    """One continuation to fit: what does not change between attempts."""

    messages: Sequence[Message]
    answer: str
    window: int
    requested_max_tokens: int
    counter: TokenCounter
    policy: FitPolicy
    tools: Sequence[Message] | None
    media: Callable[[Message], int] | None = None

    @property
    def marker_tokens(self) -> int:
        return self.counter.count_text(ANSWER_MARKER)

    def least_answer(self, answer_tokens: int) -> int:
        """The room the answer needs at the least: a message holding its newest tokens."""
        kept = min(answer_tokens, MIN_ANSWER_TOKENS)
        return kept + MESSAGE_OVERHEAD_TOKENS + self.marker_tokens


def fit_continuation(
    messages: Sequence[Message],
    answer: str,
    *,
    window: int,
    requested_max_tokens: int,
    counter: TokenCounter,
    policy: FitPolicy | None = None,
    tools: Sequence[Message] | None = None,
    media: Callable[[Message], int] | None = None,
) -> Fit:
    """`messages` with `answer` as the final assistant message to continue, within `window`;
    `requested_max_tokens` is what is left of the answer's budget. `media`: the tokens a
    message's images add (policy.context.images), as for fit_messages."""
    policy = policy or FitPolicy()
    job = _Request(messages, answer, window, requested_max_tokens, counter, policy, tools, media)
    budget = budget_for(window, requested_max_tokens, counter, policy)
    whole = [*messages, {"role": "assistant", "content": answer}]
    try:
        draft, prompt_tokens = Planner(whole, counter, policy, tools, media).plan(budget.prompt)
    except NoRoom:
        pass
    else:
        output = _output(job, budget.max_tokens, prompt_tokens, budget.margin)
        return Fit(
            messages=draft.messages,
            sources=draft.sources,
            max_tokens=output,
            prompt_tokens=prompt_tokens,
            system_compressed=draft.system_compressed,
            dropped_messages=draft.dropped,
            compressed_messages=draft.compressed,
            output_clamped=output < requested_max_tokens,
        )
    answer_tokens = counter.count_text(answer)
    least = job.least_answer(answer_tokens)
    whole_answer = answer_tokens + MESSAGE_OVERHEAD_TOKENS + job.marker_tokens
    share = max(least, min(whole_answer, int(budget.prompt * ANSWER_SHARE)))
    # The prompt gets the room less the answer's share; where it needs more, the least it
    # needs; where even that is too much, the output gives up its room as for a long question.
    squeezed = window - budget.margin - min(policy.min_output_tokens, budget.max_tokens)
    needed = budget.prompt - share
    for total in (budget.prompt, squeezed):
        for _ in range(MAX_ATTEMPTS):
            room = min(total - least, needed)
            try:
                return _with_newest_part(job, room, total, budget.max_tokens, budget.margin)
            except NoRoom as no_room:
                # What the prompt said it needs, and a little for the exact count's surprise.
                grown = max(needed, no_room.needed + max(16, no_room.needed // 20))
                if min(total - least, grown) == room:  # the prompt can have no more here
                    break
                needed = grown
    raise ContextOverflow(max(1, needed + least - squeezed), window)


def _with_newest_part(
    job: _Request, prompt_room: int, total: int, max_tokens: int, margin: int
) -> Fit:
    """The prompt fitted into `prompt_room`, then the newest part of the answer that fits in
    what it left of `total`; NoRoom (with what the prompt needs) when that part would be under
    `MIN_ANSWER_TOKENS`."""
    draft, prompt_tokens = Planner(
        list(job.messages), job.counter, job.policy, job.tools, job.media
    ).plan(prompt_room)
    room = total - prompt_tokens - MESSAGE_OVERHEAD_TOKENS
    least = job.least_answer(job.counter.count_text(job.answer)) - MESSAGE_OVERHEAD_TOKENS
    for _ in range(MAX_ATTEMPTS):
        if room < least:
            break
        content = job.counter.tail(job.answer, room)
        if content != job.answer:  # cut: the marker takes some of the room
            kept = job.counter.tail(job.answer, room - job.marker_tokens).lstrip()
            content = f"{ANSWER_MARKER} {kept}"
        final = [*draft.messages, {"role": "assistant", "content": content}]
        exact = job.counter.count_prompt(final, job.tools)
        if exact <= total:
            output = _output(job, max_tokens, exact, margin)
            return Fit(
                messages=final,
                sources=(*draft.sources, len(job.messages)),
                max_tokens=output,
                prompt_tokens=exact,
                system_compressed=draft.system_compressed,
                dropped_messages=draft.dropped,
                # The answer, when cut to its newest part, counts as one compressed message.
                compressed_messages=draft.compressed + (content != job.answer),
                output_clamped=output < job.requested_max_tokens,
            )
        room -= exact - total + max(1, total // 100)
    raise NoRoom(prompt_tokens)


def _output(job: _Request, max_tokens: int, prompt_tokens: int, margin: int) -> int:
    return max(1, min(max_tokens, job.window - prompt_tokens - margin))
