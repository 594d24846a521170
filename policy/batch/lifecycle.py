"""A batch's statuses and counts, as OpenAI defines them (so `client.batches.*` reads ours).

validating -> in_progress -> finalizing -> completed
     |             |  \\-> cancelling -> cancelled     (cancel: lines not yet run are
     v             |                                  dropped, those run are kept)
   failed          \\-> expired  (past completion_window: what ran is kept)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ENDPOINTS", "FINAL", "BatchStatus", "RequestCounts", "can_cancel"]

# The endpoints a batch may name (the gateway's own; OpenAI's others are not served here).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


FINAL = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


def can_cancel(status: BatchStatus) -> bool:
    """OpenAI cancels a batch that has not ended; cancelling one already cancelling is a no-op."""
    return status in {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING}


@dataclass(frozen=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0

    def as_json(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}
