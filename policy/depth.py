"""The depth router's classifier: how much thought a `model: auto` request deserves.

Pure rules, no model call, so it costs microseconds and always says why it chose. In order:
1. an explicit `X-Depth` header;
2. the OpenAI `reasoning_effort` field (none..low -> quick, medium -> balanced, high -> deep,
   xhigh/max -> exhaustive);
3. phrases in the latest user message ("briefly", "step by step", "exhaustive", ...);
4. the message's shape: its length in words, code, how many questions it asks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.config import DepthConfig
from core.types import Depth

__all__ = [
    "CODE",
    "COMPILED_HINTS",
    "DEPTH_HEADER",
    "EFFORT_DEPTHS",
    "HINTS",
    "LIST_ITEM",
    "DepthDecision",
    "UnknownDepth",
    "classify",
]

DEPTH_HEADER = "x-depth"

# vLLM's `reasoning_effort` values.
EFFORT_DEPTHS = {
    "none": Depth.QUICK,
    "minimal": Depth.QUICK,
    "low": Depth.QUICK,
    "medium": Depth.BALANCED,
    "high": Depth.DEEP,
    "xhigh": Depth.EXHAUSTIVE,
    "max": Depth.EXHAUSTIVE,
}

# The strongest hint wins: an exhaustive request that also says "briefly" is still exhaustive.
HINTS = (
    (
        Depth.EXHAUSTIVE,
        r"\b(exhaustive(ly)?|comprehensive(ly)?|leave nothing out|every (possible )?(case|edge "
        r"case|detail)|all (possible )?(cases|edge cases|options))\b",
    ),
    (
        Depth.DEEP,
        r"\b(step[- ]by[- ]step|in[- ]depth|in detail|detailed|thorough(ly)?|think (hard|carefully)"
        r"|prove|derive|analy[sz]e|trade-?offs?|root cause|design a|architecture)\b",
    ),
    (
        Depth.QUICK,
        r"\b(briefly|brief|quick(ly)?|tl;?dr|short answer|one (word|sentence|line)|yes or no"
        r"|in a nutshell)\b",
    ),
)
COMPILED_HINTS = tuple((depth, re.compile(pattern, re.IGNORECASE)) for depth, pattern in HINTS)
CODE = re.compile(
    r"```|^\s*(def |class |function |import |#include|SELECT |for \(|\w+\(.*\);$)", re.M
)
LIST_ITEM = re.compile(r"^\s*(\d+[.)]|[-*])\s+\S", re.M)


@dataclass(frozen=True)
class DepthDecision:
    depth: Depth
    reason: str  # short, for the X-Depth-Reason header and logs


class UnknownDepth(ValueError):
    def __init__(self, value: str) -> None:
        names = ", ".join(d.value for d in Depth)
        super().__init__(f"Unknown X-Depth {value!r}; use one of: {names}.")


def classify(
    latest_user_text: str,
    *,
    rules: DepthConfig,
    header: str | None = None,
    reasoning_effort: str | None = None,
) -> DepthDecision:
    if header:
        try:
            return DepthDecision(Depth(header.strip().lower()), "header")
        except ValueError:
            raise UnknownDepth(header) from None
    if reasoning_effort in EFFORT_DEPTHS:
        return DepthDecision(EFFORT_DEPTHS[reasoning_effort], "reasoning_effort")
    for depth, pattern in COMPILED_HINTS:
        if pattern.search(latest_user_text):
            return DepthDecision(depth, "hint")
    return _by_shape(latest_user_text, rules)


def _by_shape(text: str, rules: DepthConfig) -> DepthDecision:
    words = len(text.split())
    has_code = bool(CODE.search(text))
    asks = text.count("?") + len(LIST_ITEM.findall(text))
    if words >= rules.exhaustive_min_words:
        return DepthDecision(Depth.EXHAUSTIVE, "length")
    if words >= rules.deep_min_words:
        return DepthDecision(Depth.DEEP, "length")
    if asks >= rules.deep_min_questions:
        return DepthDecision(Depth.DEEP, "questions")
    if has_code:
        return DepthDecision(Depth.BALANCED, "code")
    if words <= rules.quick_max_words and asks <= 1:
        return DepthDecision(Depth.QUICK, "short")
    return DepthDecision(Depth.BALANCED, "default")
