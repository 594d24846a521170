"""Extractive compression: keep the most telling lines of a text, in order, within a token budget.

Deterministic and model-free. Each unit (a line; a sentence or a slice of an overlong line) is
scored: headers and structural markers, code signatures and `key: value` lines score high, and so
do terms shared with the latest user message and the first and last 10% of the text (where
instructions and summaries tend to sit). The best units are kept, in their original order, until
the budget is spent; a unit that does not fit is skipped so that smaller ones can still use the
room left. What room they leave (at least `MIN_HEAD_TOKENS`) goes to the head of the best unit
that did not fit, cut after a word: a text of long lines or one long paragraph (units of up to
`MAX_UNIT_CHARS`, a few hundred tokens) under a budget smaller than its units keeps the
beginning of its best one instead of nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "EDGE_SHARE",
    "MAX_UNIT_CHARS",
    "MIN_HEAD_TOKENS",
    "Unit",
    "compress",
    "query_terms",
    "score_unit",
    "split_units",
]

MAX_UNIT_CHARS = 1200  # longer lines are split into sentences, then into slices of this size
MIN_HEAD_TOKENS = 16  # a head of a unit shorter than this says too little to be worth its place
MAX_WORD_CHARS = 40  # a head is cut after a word only where it loses no more than this
EDGE_SHARE = 0.10

_HEADER = re.compile(r"^\s*(#{1,6}\s|={3,}|-{3,}|\[[^\]]+\]\s*$|[A-Z][A-Z0-9 _-]{2,60}:?\s*$)")
_STRUCTURE = re.compile(r"^\s*([-*+•]\s|\d{1,3}[.)]\s|>\s|\|)")
_CODE_SIGNATURE = re.compile(
    r"^\s*(def |class |async def |function |fn |func |interface |type |struct |enum |impl |"
    r"public |private |protected |export |import |from \S+ import |@\w+)"
)
_KEY_VALUE = re.compile(r"^\s*[\w .\-/]{1,40}:\s+\S")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
_WORD = re.compile(r"[a-zA-Z][a-zA-Z0-9_]{3,}")
_SPACE = re.compile(r"\s")
_STOPWORDS = frozenset(
    "that this with from have what when where which will would could should there their "
    "about into your they them then than been were also just like more some such only".split()
)


@dataclass(frozen=True)
class Unit:
    index: int
    text: str
    score: float


def query_terms(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORD.findall(text)) - _STOPWORDS


def split_units(text: str) -> list[str]:
    """Lines; an overlong line becomes sentences, an overlong sentence becomes slices."""
    units: list[str] = []
    for line in text.split("\n"):
        if len(line) <= MAX_UNIT_CHARS:
            units.append(line)
            continue
        for sentence in _SENTENCE_END.split(line):
            units.extend(_slices(sentence))
    return units


def _slices(text: str) -> list[str]:
    slices = []
    while len(text) > MAX_UNIT_CHARS:
        cut = text.rfind(" ", 0, MAX_UNIT_CHARS)
        cut = cut if cut > MAX_UNIT_CHARS // 2 else MAX_UNIT_CHARS
        slices.append(text[:cut])
        text = text[cut:]
    slices.append(text)
    return slices


def score_unit(text: str, position: float, terms: frozenset[str]) -> float:
    """Higher is more worth keeping; `position` runs from 0 (first unit) to 1 (last)."""
    if not text.strip():
        return -1.0
    score = 0.0
    if _HEADER.match(text):
        score += 3.0
    if _CODE_SIGNATURE.match(text):
        score += 2.0
    if _KEY_VALUE.match(text):
        score += 1.5
    if _STRUCTURE.match(text):
        score += 1.0
    if position <= EDGE_SHARE or position >= 1 - EDGE_SHARE:
        score += 2.0
    shared = len(query_terms(text) & terms)
    return score + min(shared, 3) * 1.0


def compress(text: str, budget: int, count: Callable[[str], int], query: str = "") -> str:
    """The best units of `text` in original order, joined by newlines, within `budget` tokens."""
    if budget <= 0:
        return ""
    if count(text) <= budget:
        return text
    pieces = split_units(text)
    terms = query_terms(query)
    last = max(len(pieces) - 1, 1)
    units = [Unit(i, piece, score_unit(piece, i / last, terms)) for i, piece in enumerate(pieces)]
    ranked = sorted((u for u in units if u.score >= 0), key=lambda u: (-u.score, u.index))
    kept: list[Unit] = []
    skipped: list[Unit] = []
    spent = 0
    for unit in ranked:
        cost = count(unit.text) + 1  # its tokens and the newline that joins it
        if spent + cost <= budget:
            kept.append(unit)
            spent += cost
        else:
            skipped.append(unit)
    # The room whole units left goes to the head of the best one that did not fit: a text of
    # one long paragraph (or a title and one) keeps its beginning, not nothing (or its title).
    room = budget - spent - (1 if kept else 0)
    if skipped and room >= MIN_HEAD_TOKENS:
        head = _head_within(skipped[0].text, room, count)
        if head:
            kept.append(Unit(skipped[0].index, head, skipped[0].score))
    return "\n".join(u.text for u in sorted(kept, key=lambda u: u.index))


def _head_within(text: str, room: int, count: Callable[[str], int]) -> str:
    """The longest head of `text` that counts at most `room` tokens, found by a binary search
    over its length (a dozen counts for a unit of `MAX_UNIT_CHARS`). Cut after a word where a
    space lies within `MAX_WORD_CHARS` before the cut, else between characters (Chinese has no
    spaces, a URL or base64 run no early one)."""
    low, high = 0, len(text)  # the head of `low` characters fits; none longer than `high` does
    while low < high:
        middle = (low + high + 1) // 2
        if count(text[:middle]) <= room:
            low = middle
        else:
            high = middle - 1
    head = text[:low]
    if low < len(text) and not text[low].isspace():  # cut inside a word: back to its start
        spaces = [m.start() for m in _SPACE.finditer(head, max(0, low - MAX_WORD_CHARS))]
        head = head[: spaces[-1]] if spaces else head
    # A counter need not grow with the text (a tokenizer's merges): what was counted as fitting
    # is the fallback where the cleaner head is not.
    for candidate in (head.strip(), text[:low].strip()):
        if candidate and count(candidate) <= room:
            return candidate
    return ""
