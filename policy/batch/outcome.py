"""What an answer makes of a batch line: a line of the output file, a line of the error
file, or another try later.

A client's mistake (4xx but 429) is final: the line goes to the error file with the answer's
status and error, as OpenAI writes it. Refusals the gateway may lift (429: shed, or over the
key's limits; 503: every link down; the gateway unreachable) are tried again after a pause,
until the batch expires: a line is never failed for the gateway's load. Another server error
(a 504 for a line the gateway took too long to answer, too) is tried until it has had
`MAX_SERVER_ERRORS` of them (the router has failed the job over already), then failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["MAX_SERVER_ERRORS", "Outcome", "Verdict", "judge_answer", "result_line"]

MAX_SERVER_ERRORS = 3
RETRYABLE = frozenset({429, 503})


class Outcome(StrEnum):
    OUTPUT = "output"
    ERROR = "error"
    RETRY = "retry"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    retry_after_s: float = 0.0


def judge_answer(
    status: int | None, server_errors: int, retry_after_s: float | None, pause_s: float
) -> Verdict:
    """`status` None: no answer (the gateway unreachable). `server_errors`: the line's answers
    so far with a 5xx other than 503, this one included."""
    if status is not None and 200 <= status < 300:
        return Verdict(Outcome.OUTPUT)
    if status is None or status in RETRYABLE:
        return Verdict(Outcome.RETRY, retry_after_s if retry_after_s else pause_s)
    if status >= 500 and server_errors < MAX_SERVER_ERRORS:
        return Verdict(Outcome.RETRY, pause_s)
    return Verdict(Outcome.ERROR)


def result_line(
    line_id: str, custom_id: str, status: int, request_id: str, body: dict[str, Any]
) -> str:
    """A line of the output or error file, OpenAI's shape: the answer as the endpoint gave it."""
    return json.dumps(
        {
            "id": line_id,
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        },
        separators=(",", ":"),
    )
