"""The Batch API's service: files and batches as OpenAI's API has them, and the runs.

One per app (a named Ray actor, deployments/batch/actor.py), so every ingress replica sees the
same batches and each batch runs once. Every method answers `(status, body)`: the body is
OpenAI's object, or its error JSON. At start the service takes up every batch that had not
ended (a restart after a crash): each goes on from its last committed chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from core.config import BatchConfig
from core.errors import ApiError, ErrorCode
from deployments.batch.ports import Gateway
from deployments.batch.runner import BatchRunner
from deployments.batch.store import BatchRow, BatchStore, FileRow, new_id
from policy.batch import ENDPOINTS, BatchStatus, LineReader, RequestCounts, can_cancel
from policy.batch.lines import FileCheck

logger = logging.getLogger("ray.serve")

__all__ = ["BatchService", "Reply"]

Reply = tuple[int, dict[str, Any]]
PURPOSE = "batch"
WINDOW_UNITS = {"h": 3600, "d": 86400}
MAX_METADATA = 16


@dataclass
class Upload:
    owner: str
    filename: str
    stream: IO[bytes]
    reader: LineReader
    check: FileCheck
    size: int = 0
    refused: ApiError | None = None
    started: float = 0.0


def replying(method: Callable[..., Reply]) -> Callable[..., Reply]:
    """A client's mistake as its error JSON, not an exception across Ray."""

    def answer(*args: Any, **kwargs: Any) -> Reply:
        try:
            return method(*args, **kwargs)
        except ApiError as error:
            return error.status, error.body()

    answer.__name__ = method.__name__
    answer.__doc__ = method.__doc__
    return answer


class BatchService:
    def __init__(
        self,
        store: BatchStore,
        gateway: Gateway,
        settings: BatchConfig,
        max_json_depth: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._settings = settings
        self._max_depth = max_json_depth
        self._clock = clock
        self._runner = BatchRunner(store, gateway, settings, clock)
        self._uploads: dict[str, Upload] = {}
        self._runs: dict[str, asyncio.Task[BatchRow]] = {}

    # Runs

    def resume(self) -> list[str]:
        """Take up every batch that had not ended (call in the event loop, at start)."""
        unfinished = [row.id for row in self._store.unfinished()]
        for batch_id in unfinished:
            logger.info("batch %s: taken up after a restart", batch_id)
            self._start(batch_id)
        return unfinished

    def _start(self, batch_id: str) -> None:
        if batch_id in self._runs:
            return
        task = asyncio.ensure_future(self._runner.run(batch_id))
        self._runs[batch_id] = task
        task.add_done_callback(lambda done: self._ended(batch_id, done))

    def _ended(self, batch_id: str, task: asyncio.Task[BatchRow]) -> None:
        self._runs.pop(batch_id, None)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        logger.error("batch %s: the run failed: %r", batch_id, error)
        try:
            self._runner.fail(batch_id, f"the batch service failed: {error!r}")
        except Exception:  # the store itself failing: the batch is taken up at the next start
            logger.exception("batch %s: could not be marked failed", batch_id)

    async def stop(self) -> None:
        for task in list(self._runs.values()):
            task.cancel()
        await asyncio.gather(*self._runs.values(), return_exceptions=True)

    async def wait(self, batch_id: str) -> None:
        """Until the batch's run ends (for tests)."""
        task = self._runs.get(batch_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    # Files

    def upload_begin(self, owner: str, filename: str, purpose: str) -> str:
        """An upload's id, to send its parts to; refusals come at `upload_end`."""
        for stale in [u for u, up in self._uploads.items() if self._clock() - up.started > 3600]:
            self.upload_abort(stale)  # its sender died mid-upload: no open file left behind
        upload_id = new_id("upload")
        refused = None
        if purpose != PURPOSE:
            refused = ApiError(400, ErrorCode.INVALID_REQUEST,
                               f"purpose must be {PURPOSE!r}: only batch input is stored here",
                               param="purpose")  # fmt: skip
        stream = self._store.upload_path(upload_id).open("wb")
        check = FileCheck(self._settings.max_lines, self._max_depth)
        self._uploads[upload_id] = Upload(owner, filename or "upload.jsonl", stream,
                                          LineReader(self._settings.max_line_bytes), check,
                                          refused=refused, started=self._clock())  # fmt: skip
        return upload_id

    def upload_part(self, upload_id: str, part: bytes) -> bool:
        """Take a part; False once the upload is refused (the sender may stop sending)."""
        upload = self._uploads[upload_id]
        if upload.refused is not None:
            return False
        upload.size += len(part)
        if upload.size > self._settings.max_file_bytes:
            limit = self._settings.max_file_bytes
            upload.refused = ApiError(413, ErrorCode.REQUEST_TOO_LARGE,
                                      f"The file exceeds {limit} bytes.")  # fmt: skip
            return False
        upload.stream.write(part)
        for number, raw in upload.reader.feed(part):
            upload.check.add(number, raw)
        return True

    @replying
    def upload_end(self, upload_id: str) -> Reply:
        upload = self._uploads.pop(upload_id)
        upload.stream.close()
        path = self._store.upload_path(upload_id)
        try:
            for number, raw in upload.reader.close():
                upload.check.add(number, raw)
            check = upload.check
            check.too_long(upload.reader.too_long, self._settings.max_line_bytes)
            if upload.refused is not None:
                raise upload.refused
            if check.problems or not check.lines:
                raise ApiError(400, ErrorCode.INVALID_REQUEST,
                               f"The batch input file is invalid: {check.summary()}",
                               param="file")  # fmt: skip
            row = FileRow(new_id("file"), upload.owner, PURPOSE, upload.filename, upload.size,
                          int(self._clock()), check.lines, tuple(sorted(check.urls)))  # fmt: skip
            self._store.add_file(row, path)
        finally:
            path.unlink(missing_ok=True)
        return 200, row.as_json()

    def upload_abort(self, upload_id: str) -> None:
        upload = self._uploads.pop(upload_id, None)
        if upload is not None:
            upload.stream.close()
            self._store.upload_path(upload_id).unlink(missing_ok=True)

    @replying
    def file(self, owner: str, file_id: str) -> Reply:
        return 200, self._own_file(owner, file_id).as_json()

    @replying
    def files(self, owner: str, purpose: str | None = None) -> Reply:
        data = [row.as_json() for row in self._store.files(owner, purpose)]
        return 200, {"object": "list", "data": data, "has_more": False}

    @replying
    def delete_file(self, owner: str, file_id: str) -> Reply:
        self._own_file(owner, file_id)
        if any(row.input_file_id == file_id for row in self._store.unfinished()):
            message = "A batch that has not ended reads this file: delete it once it has ended."
            raise ApiError(409, ErrorCode.INVALID_REQUEST, message, param="file_id")
        self._store.delete_file(file_id)
        return 200, {"id": file_id, "object": "file", "deleted": True}

    def content_part(self, owner: str, file_id: str, offset: int) -> tuple[int, Any]:
        """The file's bytes from `offset`, one part (empty at the end), or the error: the
        ingress streams a file part by part, never whole."""
        try:
            self._own_file(owner, file_id)
        except ApiError as error:
            return error.status, error.body()
        return 200, self._store.read_part(file_id, offset)

    def _own_file(self, owner: str, file_id: str, param: str = "file_id") -> FileRow:
        row = self._store.file(file_id)
        if row is None or row.owner != owner:
            raise ApiError(404, ErrorCode.NOT_FOUND, f"No such file: {file_id!r}.", param=param)
        return row

    # Batches

    @replying
    def create(self, owner: str, body: dict[str, Any]) -> Reply:
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise _invalid(f"endpoint must be one of {', '.join(ENDPOINTS)}", "endpoint")
        window = body.get("completion_window")
        if window not in self._settings.completion_windows:
            allowed = ", ".join(self._settings.completion_windows)
            raise _invalid(f"completion_window must be one of {allowed}", "completion_window")
        metadata = _metadata(body.get("metadata"))
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str):
            raise _invalid("input_file_id must be a file's id", "input_file_id")
        source = self._own_file(owner, file_id, "input_file_id")
        if source.purpose != PURPOSE:
            raise _invalid(f"the file's purpose is {source.purpose!r}, not 'batch'",
                           "input_file_id")  # fmt: skip
        others = [url for url in source.urls if url != endpoint]
        if others:
            raise _invalid(f"the file's lines name {', '.join(others)}, not the batch's "
                           f"endpoint {endpoint}", "endpoint")  # fmt: skip
        now = int(self._clock())
        row = BatchRow(
            id=new_id("batch"), owner=owner, endpoint=str(endpoint), input_file_id=file_id,
            completion_window=str(window), metadata=metadata, status=BatchStatus.VALIDATING,
            created_at=now, expires_at=now + _window_s(str(window)), stamps={},
            counts=RequestCounts(total=source.lines), next_line=1, output_file_id=None,
            error_file_id=None, errors=None, model=self._first_model(file_id),
            input_tokens=0, output_tokens=0,
        )  # fmt: skip
        self._store.add_batch(row)
        self._start(row.id)
        return 200, row.as_json()

    @replying
    def batch(self, owner: str, batch_id: str) -> Reply:
        return 200, self._own_batch(owner, batch_id).as_json()

    @replying
    def batches(self, owner: str, after: str | None = None, limit: int = 20) -> Reply:
        rows = self._store.batches(owner)
        if after is not None:
            ids = [row.id for row in rows]
            rows = rows[ids.index(after) + 1 :] if after in ids else []
        page = rows[: max(1, min(limit, 100))]
        return 200, {
            "object": "list",
            "data": [row.as_json() for row in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(rows) > len(page),
        }

    @replying
    def cancel(self, owner: str, batch_id: str) -> Reply:
        row = self._own_batch(owner, batch_id)
        if not can_cancel(row.status):
            raise ApiError(409, ErrorCode.INVALID_REQUEST,
                           f"A batch that is {row.status.value} cannot be cancelled.")  # fmt: skip
        if row.status is not BatchStatus.CANCELLING:
            row = self._store.set_status(batch_id, BatchStatus.CANCELLING)
        if batch_id not in self._runs:  # not running here (it ended, or never started)
            self._start(batch_id)
        return 200, row.as_json()

    def _own_batch(self, owner: str, batch_id: str) -> BatchRow:
        row = self._store.batch(batch_id)
        if row is None or row.owner != owner:
            raise ApiError(404, ErrorCode.NOT_FOUND, f"No such batch: {batch_id!r}.",
                           param="batch_id")  # fmt: skip
        return row

    def _first_model(self, file_id: str) -> str | None:
        reader = LineReader(self._settings.max_line_bytes)
        for part in self._store.read_file(file_id):
            for _, raw in reader.feed(part):
                model = json.loads(raw).get("body", {}).get("model")
                return model if isinstance(model, str) else None
        return None


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, ErrorCode.INVALID_REQUEST, message, param=param)


def _window_s(window: str) -> int:
    return int(window[:-1]) * WINDOW_UNITS[window[-1]]


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 and values up to 512 long."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > MAX_METADATA
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        or any(len(k) > 64 or len(v) > 512 for k, v in value.items())
    ):
        raise _invalid("metadata must be at most 16 string pairs (keys up to 64 characters, "
                       "values up to 512)", "metadata")  # fmt: skip
    return dict(value)
