"""The Batch API's pure decisions: lines read from any split of the bytes, what each answer
makes of its line, and chunk sizes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policy.batch import Outcome, chunk_size, judge_answer, parse_line
from policy.batch.lines import BatchLine, LineProblem, LineReader

LINE = st.binary(max_size=40).map(lambda raw: raw.replace(b"\n", b""))


@settings(max_examples=300, derandomize=True)
@given(st.lists(LINE, max_size=12), st.lists(st.integers(1, 17), min_size=1))
def test_lines_come_out_whole_and_numbered_however_the_bytes_are_split(
    lines: list[bytes], cuts: list[int]
) -> None:
    data = b"\n".join(lines)
    reader = LineReader(max_line_bytes=30)
    out: list[tuple[int, bytes]] = []
    start, turn = 0, 0
    while start < len(data):
        size = cuts[turn % len(cuts)]
        out += reader.feed(data[start : start + size])
        start, turn = start + size, turn + 1
    out += reader.close()
    expected = [
        (n, raw.rstrip(b"\r"))
        for n, raw in enumerate(lines, start=1)
        if raw.strip() and len(raw) <= 30
    ]
    assert out == expected
    assert reader.too_long == [n for n, raw in enumerate(lines, start=1) if len(raw) > 30]


def test_a_line_is_parsed_or_its_problem_named() -> None:
    good = b'{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"input":"x"}}'
    assert parse_line(good, 3, 64) == BatchLine(3, "a", "/v1/embeddings", {"input": "x"})
    for raw, param in [
        (b'{"custom_id":"","method":"POST","url":"/v1/embeddings","body":{}}', "custom_id"),
        (b'{"custom_id":"a","method":"PUT","url":"/v1/embeddings","body":{}}', "method"),
        (b'{"custom_id":"a","method":"POST","url":"/v1/images","body":{}}', "url"),
        (b'{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":[]}', "body"),
        (b"[1]", None),
        (b'{"custom_id": NaN}', None),
    ]:
        problem = parse_line(raw, 7, 64)
        assert isinstance(problem, LineProblem)
        assert (problem.line, problem.param) == (7, param)


def test_answers_are_kept_failed_or_tried_again() -> None:
    assert judge_answer(200, 1, None, 2.0).outcome is Outcome.OUTPUT
    assert judge_answer(400, 1, None, 2.0).outcome is Outcome.ERROR
    assert judge_answer(404, 1, None, 2.0).outcome is Outcome.ERROR
    shed = judge_answer(429, 9, 7.0, 2.0)  # the gateway's load: never failed, after Retry-After
    assert (shed.outcome, shed.retry_after_s) == (Outcome.RETRY, 7.0)
    assert judge_answer(503, 50, None, 2.0).retry_after_s == 2.0
    assert judge_answer(None, 50, None, 2.0).outcome is Outcome.RETRY  # no answer at all
    assert judge_answer(500, 2, None, 2.0).outcome is Outcome.RETRY
    assert judge_answer(500, 3, None, 2.0).outcome is Outcome.ERROR


def test_a_chunk_is_rounds_of_the_slots_within_its_bounds() -> None:
    assert chunk_size(2, 4, 256) == 8
    assert chunk_size(0, 4, 256) == 4  # no slot known: one at a time
    assert chunk_size(100, 4, 256) == 256
