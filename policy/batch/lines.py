"""A batch input file, checked line by line as it streams in (never held whole).

Each line is `{"custom_id", "method": "POST", "url", "body"}` (OpenAI's format); `custom_id`s
are unique in the file. What is wrong with a line is reported with its number, and a file with
any such problem is refused at upload, as OpenAI refuses it at validation. The body itself is
checked when the line runs, by the same checks an HTTP request meets: a bad body fails its own
line (the error file) and no other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from core.errors import ApiError
from policy.batch.lifecycle import ENDPOINTS
from policy.request import parse_object

__all__ = ["MAX_CUSTOM_ID", "BatchLine", "FileCheck", "LineProblem", "LineReader", "parse_line"]

MAX_CUSTOM_ID = 512
MAX_PROBLEMS = 50  # reported per file: past this, one more line says how many were left out


@dataclass(frozen=True)
class BatchLine:
    number: int  # 1-based, as an editor shows it
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineProblem:
    line: int
    message: str
    param: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"code": "invalid_line", "line": self.line, "message": self.message,
                "param": self.param}  # fmt: skip


def parse_line(raw: bytes, number: int, max_depth: int) -> BatchLine | LineProblem:
    """One input line, or what is wrong with it."""
    try:
        entry = parse_object(raw, max_depth)
    except ApiError as error:
        return LineProblem(number, f"not a JSON object: {error.message}")
    custom_id = entry.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineProblem(number, "custom_id must be a non-empty string", "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID:
        return LineProblem(number, f"custom_id is longer than {MAX_CUSTOM_ID}", "custom_id")
    if entry.get("method") != "POST":
        return LineProblem(number, "method must be POST", "method")
    url = entry.get("url")
    if url not in ENDPOINTS:
        return LineProblem(number, f"url must be one of {', '.join(ENDPOINTS)}", "url")
    body = entry.get("body")
    if not isinstance(body, dict):
        return LineProblem(number, "body must be a JSON object", "body")
    return BatchLine(number, custom_id, str(url), body)


class LineReader:
    """Bytes in, whole lines out (numbered from 1; blank lines skipped but counted). A line
    longer than `max_line_bytes` is never buffered: it is dropped and its number kept in
    `too_long`."""

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._tail = b""
        self._number = 0
        self._skipping = False  # inside a line past the limit: dropped up to its newline
        self.too_long: list[int] = []

    def feed(self, chunk: bytes) -> Iterator[tuple[int, bytes]]:
        *whole, tail = (self._tail + chunk).split(b"\n")
        for raw in whole:
            yield from self._line(raw)
        if self._skipping and not whole:
            tail = b""  # more of the long line
        elif len(tail) > self._max:
            self._number += 1
            self.too_long.append(self._number)
            self._skipping, tail = True, b""
        self._tail = tail

    def close(self) -> Iterator[tuple[int, bytes]]:
        tail, self._tail = self._tail, b""
        if tail.strip() and not self._skipping:
            yield from self._line(tail)

    def _line(self, raw: bytes) -> Iterator[tuple[int, bytes]]:
        if self._skipping:  # the end of a long line, counted when it passed the limit
            self._skipping = False
            return
        self._number += 1
        if len(raw) > self._max:
            self.too_long.append(self._number)
        elif raw.strip():
            yield self._number, raw.rstrip(b"\r")


@dataclass
class FileCheck:
    """A whole file's verdict, built as its lines stream past."""

    max_lines: int
    max_depth: int
    lines: int = 0
    urls: set[str] = field(default_factory=set)
    problems: list[LineProblem] = field(default_factory=list)
    left_out: int = 0
    _ids: set[str] = field(default_factory=set)

    def add(self, number: int, raw: bytes) -> None:
        parsed = parse_line(raw, number, self.max_depth)
        if isinstance(parsed, LineProblem):
            self._problem(parsed)
            return
        self.lines += 1
        if self.lines == self.max_lines + 1:
            self._problem(LineProblem(number, f"a batch holds at most {self.max_lines} lines"))
        if parsed.custom_id in self._ids:
            self._problem(LineProblem(number, f"custom_id {parsed.custom_id!r} is repeated",
                                      "custom_id"))  # fmt: skip
        self._ids.add(parsed.custom_id)
        self.urls.add(parsed.url)

    def too_long(self, numbers: list[int], limit: int) -> None:
        for number in numbers:
            self._problem(LineProblem(number, f"the line is longer than {limit} bytes"))

    def _problem(self, problem: LineProblem) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)
        else:
            self.left_out += 1

    def summary(self) -> str:
        """What is wrong with the file, for the 400 that refuses it."""
        shown = "; ".join(f"line {p.line}: {p.message}" for p in self.problems)
        more = f" (and {self.left_out} more)" if self.left_out else ""
        if not self.lines and not self.problems:
            return "the file holds no request lines"
        return shown + more
