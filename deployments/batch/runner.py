"""One batch, run to its end: its input streamed from the cursor in chunks, each chunk's lines
sent at background priority through the gateway (as many at once as the model's backends run
at that priority), the chunk's results committed with the cursor past it, then the next.

After a crash the batch goes on from its cursor: lines of the chunk that was running may run
again (their results were not committed), no committed line does. Cancel and expiry are seen
between tries; what finished by then is committed (the cursor stays), and the output and error
files are written from the committed results. Lines an expired batch never ran go to its error
file with code `batch_expired`, as OpenAI writes them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from core.config import BatchConfig
from deployments.batch.ports import Answer, Gateway, Unreachable
from deployments.batch.store import BatchRow, BatchStore, ChunkResult, FileRow
from policy.batch import BatchStatus, LineReader, Outcome, judge_answer, parse_line, result_line
from policy.batch.chunks import chunk_size
from policy.batch.lines import BatchLine

logger = logging.getLogger("ray.serve")

__all__ = ["BatchRunner"]

# A line's nesting was checked at upload (and its body is again, at the ingress).
ANY_DEPTH = 10_000
SLOTS_READ_EVERY_S = 10.0  # the backends' capacity follows autoscaling within this


class Stopped(Exception):
    """The batch was cancelled, or expired, while it ran."""


@dataclass
class BatchRunner:
    store: BatchStore
    gateway: Gateway
    settings: BatchConfig
    clock: Callable[[], float] = time.time
    _slots_read: dict[str, tuple[float, int]] = field(default_factory=dict)

    async def run(self, batch_id: str) -> BatchRow:
        row = self._row(batch_id)
        if row.status is BatchStatus.VALIDATING:
            row = self.store.set_status(batch_id, BatchStatus.IN_PROGRESS)
        expired = False
        if row.status is BatchStatus.IN_PROGRESS:
            try:
                await self._run_chunks(row)
            except Stopped as stop:
                expired = str(stop) == "expired"
        return self._finish(batch_id, expired)

    async def _run_chunks(self, row: BatchRow) -> None:
        lines = self._lines(row)
        while True:
            self._check_going(row.id)
            slots = await self._slots(row)
            size = chunk_size(slots, self.settings.chunk_rounds, self.settings.max_chunk)
            chunk = [line for _, line in zip(range(size), lines, strict=False)]
            if not chunk:
                return
            await self._run_chunk(row, chunk, slots)

    async def _slots(self, row: BatchRow) -> int:
        """The model's background slots, read at most every SLOTS_READ_EVERY_S (a reading
        costs the router a read of Serve's status)."""
        model = row.model or ""
        read_at, slots = self._slots_read.get(model, (float("-inf"), 1))
        if self.clock() - read_at >= SLOTS_READ_EVERY_S:
            try:
                slots = max(1, await self.gateway.background_slots(model))
            except Unreachable:
                slots = 1
            self._slots_read[model] = (self.clock(), slots)
        return slots

    def _lines(self, row: BatchRow) -> Iterator[BatchLine]:
        """The input's lines from the cursor on, but those a stop already committed (checked
        at upload: each parses)."""
        # Checked at upload under that day's limits: read with none (a lower limit since
        # must not drop a line of a batch already accepted).
        reader = LineReader(sys.maxsize)

        def raw_lines() -> Iterator[tuple[int, bytes]]:
            for chunk in self.store.read_file(row.input_file_id):
                yield from reader.feed(chunk)
            yield from reader.close()

        for number, raw in raw_lines():
            if number >= row.next_line and not self.store.has_result(row.id, number):
                yield _parsed(raw, number, ANY_DEPTH)

    async def _run_chunk(self, row: BatchRow, chunk: list[BatchLine], slots: int) -> None:
        gate = asyncio.Semaphore(slots)
        done: list[ChunkResult] = []

        async def one(line: BatchLine) -> None:
            async with gate:
                done.append(await self._run_line(row, line))

        tasks = [asyncio.ensure_future(one(line)) for line in chunk]
        try:
            await asyncio.gather(*tasks)
        except BaseException as error:
            for task in tasks:  # no line goes on being sent for a chunk that has stopped
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not isinstance(error, asyncio.CancelledError):  # cancelled: the process ends
                # What finished is kept (a resumed, cancelled or failed batch does not run it
                # again); the cursor stays before the chunk.
                self.store.commit_chunk(row.id, done, self._row(row.id).next_line)
            raise
        self.store.commit_chunk(row.id, done, chunk[-1].number + 1)

    async def _run_line(self, row: BatchRow, line: BatchLine) -> ChunkResult:
        server_errors = 0  # 5xx answers but 503: the ones a line may fail for
        while True:
            self._check_going(row.id)
            answer: Answer | None
            try:
                answer = await self.gateway.answer(row.endpoint, line.body, row.owner)
            except Unreachable as error:
                logger.info("batch %s line %d: no answer: %s", row.id, line.number, error)
                answer = None
            status = None if answer is None else answer.status
            server_errors += status is not None and status >= 500 and status != 503
            verdict = judge_answer(
                status,
                server_errors,
                None if answer is None else answer.retry_after_s,
                self.settings.retry_pause_s,
            )
            if verdict.outcome is Outcome.RETRY or answer is None:
                await asyncio.sleep(verdict.retry_after_s)
                continue
            text = result_line(_line_id(row, line.number), line.custom_id, answer.status,
                               answer.request_id, answer.body)  # fmt: skip
            return ChunkResult(line.number, verdict.outcome is Outcome.OUTPUT, text, *answer.usage)

    def _check_going(self, batch_id: str) -> None:
        row = self._row(batch_id)
        if row.status is not BatchStatus.IN_PROGRESS:
            raise Stopped(row.status.value)
        if self.clock() >= row.expires_at:
            raise Stopped("expired")

    def fail(self, batch_id: str, message: str) -> BatchRow:
        """The run broke (not the lines: the service): FAILED, with what was committed in its
        output and error files."""
        row = self._row(batch_id)
        output = self._write(row, "output", self.store.result_lines(row.id, ok=True))
        errors = self._write(row, "error", self.store.result_lines(row.id, ok=False))
        problem = {"code": "batch_failed", "message": message, "line": None, "param": None}
        return self.store.set_status(batch_id, BatchStatus.FAILED, output_file_id=output,
                                     error_file_id=errors, errors=[problem])  # fmt: skip

    def _finish(self, batch_id: str, expired: bool) -> BatchRow:
        """The output and error files from what was committed, and the final status."""
        row = self._row(batch_id)
        if row.status is BatchStatus.IN_PROGRESS and not expired:
            row = self.store.set_status(batch_id, BatchStatus.FINALIZING)
        if row.status not in (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING,
                              BatchStatus.CANCELLING):  # fmt: skip
            return row  # ended already (a restart found it so)
        final = {
            BatchStatus.IN_PROGRESS: BatchStatus.EXPIRED,
            BatchStatus.FINALIZING: BatchStatus.COMPLETED,
            BatchStatus.CANCELLING: BatchStatus.CANCELLED,
        }[row.status]
        output = self._write(row, "output", self.store.result_lines(row.id, ok=True))
        failed: Iterator[str] = self.store.result_lines(row.id, ok=False)
        if final is BatchStatus.EXPIRED:
            failed = _chain(failed, self._expired_lines(row))
        errors = self._write(row, "error", failed)
        return self.store.set_status(batch_id, final, output_file_id=output,
                                     error_file_id=errors)  # fmt: skip

    def _expired_lines(self, row: BatchRow) -> Iterator[str]:
        for line in self._lines(self._row(row.id)):
            error = {"code": "batch_expired",
                     "message": "This request could not be executed before the completion "
                                "window expired."}  # fmt: skip
            yield json.dumps({"id": _line_id(row, line.number), "custom_id": line.custom_id,
                              "response": None, "error": error}, separators=(",", ":"))  # fmt: skip

    def _write(self, row: BatchRow, kind: str, texts: Iterator[str]) -> str | None:
        """A result file streamed to disk, then known; None when it would be empty. Its id is
        the batch's: finishing again after a crash replaces it, never adds another."""
        file_id = f"file-{row.id.removeprefix('batch-')}-{kind}"
        upload = self.store.upload_path(file_id)
        lines = 0
        with upload.open("w", encoding="utf-8") as out:
            for text in texts:
                out.write(text + "\n")
                lines += 1
        if not lines:
            upload.unlink()
            return None
        record = FileRow(file_id, row.owner, "batch_output", f"{row.id}_{kind}.jsonl",
                         upload.stat().st_size, int(self.clock()), lines, ())  # fmt: skip
        self.store.add_file(record, upload)
        return file_id

    def _row(self, batch_id: str) -> BatchRow:
        row = self.store.batch(batch_id)
        if row is None:
            raise KeyError(batch_id)
        return row


def _line_id(row: BatchRow, number: int) -> str:
    return f"batch_req_{row.id.removeprefix('batch_')}_{number}"


def _chain(*parts: Iterator[str]) -> Iterator[str]:
    for part in parts:
        yield from part


def _parsed(raw: bytes, number: int, max_depth: int) -> BatchLine:
    parsed = parse_line(raw, number, max_depth)
    if not isinstance(parsed, BatchLine):  # checked at upload: the file changed under us
        raise ValueError(f"line {number} of a batch input no longer parses: {parsed.message}")
    return parsed
