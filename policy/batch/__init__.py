"""The OpenAI Batch API's decisions, pure: input lines checked one by one, a batch's life
(statuses, counts), what each answer makes of its line (output, error, or try again), and how
many lines a chunk holds. The batch service (deployments/batch) carries them out."""

from policy.batch.chunks import chunk_size
from policy.batch.lifecycle import (
    ENDPOINTS,
    FINAL,
    BatchStatus,
    RequestCounts,
    can_cancel,
)
from policy.batch.lines import BatchLine, LineProblem, LineReader, parse_line
from policy.batch.outcome import Outcome, judge_answer, result_line

__all__ = [
    "ENDPOINTS",
    "FINAL",
    "BatchLine",
    "BatchStatus",
    "LineProblem",
    "LineReader",
    "Outcome",
    "RequestCounts",
    "can_cancel",
    "chunk_size",
    "judge_answer",
    "parse_line",
    "result_line",
]
