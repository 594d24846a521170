"""The Batch API's durable state: one SQLite database (WAL, or the rollback journal on shared
storage) and the files beside it, under `batches.directory`.

Files are stored as uploaded (`files/<id>.jsonl`) and read as streams. A batch row carries its
status, counts and cursor (`next_line`: every line before it has a committed result); results
are rows keyed by (batch, line), so a line run again after a crash can never be counted or
written twice. A chunk's results and the cursor past them are one transaction.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy.batch import BatchStatus, RequestCounts

__all__ = ["BatchRow", "BatchStore", "ChunkResult", "FileRow", "new_id"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, lines INTEGER NOT NULL,
    urls TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, metadata TEXT,
    status TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
    stamps TEXT NOT NULL DEFAULT '{}', total INTEGER NOT NULL, completed INTEGER NOT NULL
    DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0, next_line INTEGER NOT NULL DEFAULT 1,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, model TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, text TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
"""
READ_BYTES = 1024 * 1024


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class FileRow:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    lines: int
    urls: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}  # fmt: skip


@dataclass(frozen=True)
class BatchRow:
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    status: BatchStatus
    created_at: int
    expires_at: int
    stamps: dict[str, int]
    counts: RequestCounts
    next_line: int
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None
    model: str | None
    input_tokens: int
    output_tokens: int

    def as_json(self) -> dict[str, Any]:
        """OpenAI's Batch object."""
        stamp = self.stamps.get
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status.value, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "in_progress_at": stamp("in_progress_at"), "expires_at": self.expires_at,
            "finalizing_at": stamp("finalizing_at"), "completed_at": stamp("completed_at"),
            "failed_at": stamp("failed_at"), "expired_at": stamp("expired_at"),
            "cancelling_at": stamp("cancelling_at"), "cancelled_at": stamp("cancelled_at"),
            "request_counts": self.counts.as_json(), "metadata": self.metadata,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "model": self.model,
            "usage": {
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }  # fmt: skip


@dataclass(frozen=True)
class ChunkResult:
    line: int
    ok: bool
    text: str  # the output or error file's line
    input_tokens: int = 0
    output_tokens: int = 0


class BatchStore:
    def __init__(self, directory: Path, shared_storage: bool = False) -> None:
        self.directory = directory
        (directory / "files").mkdir(parents=True, exist_ok=True)
        (directory / "uploads").mkdir(parents=True, exist_ok=True)
        for partial in (directory / "uploads").iterdir():  # cut off with the last process
            partial.unlink()
        # One writer (the batch service). Autocommit: reads see the last commit; each change
        # is one explicit transaction (_transaction).
        self._db = sqlite3.connect(directory / "batches.sqlite3", isolation_level=None,
                                   check_same_thread=False)  # fmt: skip
        self._db.execute("PRAGMA journal_mode=" + ("DELETE" if shared_storage else "WAL"))
        self._db.execute("PRAGMA synchronous=FULL")  # a commit survives a power cut
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """All of it or none of it. (In autocommit mode, which keeps reads outside any
        transaction, `with connection:` alone would commit each statement on its own.)"""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled back already (disk full)
                self._db.execute("ROLLBACK")
            raise

    @property
    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    # Files

    def file_path(self, file_id: str) -> Path:
        return self.directory / "files" / f"{file_id}.jsonl"

    def upload_path(self, upload_id: str) -> Path:
        return self.directory / "uploads" / upload_id

    def add_file(self, row: FileRow, source: Path) -> None:
        """Keep an uploaded (or written) file: on disk and in place first, then known (the
        row commits with synchronous=FULL: the bytes it points at must be there too)."""
        with source.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(source, self.file_path(row.id))
        directory = os.open(self.directory / "files", os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?,?,?)",
                             (row.id, row.owner, row.purpose, row.filename, row.bytes,
                              row.created_at, row.lines, json.dumps(row.urls)))  # fmt: skip

    def file(self, file_id: str) -> FileRow | None:
        found = self._db.execute("SELECT * FROM files WHERE id=?", (file_id,)).fetchone()
        return None if found is None else _file_row(found)

    def files(self, owner: str, purpose: str | None) -> list[FileRow]:
        rows = self._db.execute(
            "SELECT * FROM files WHERE owner=? AND (? IS NULL OR purpose=?) ORDER BY created_at",
            (owner, purpose, purpose),
        )
        return [_file_row(r) for r in rows]

    def delete_file(self, file_id: str) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM files WHERE id=?", (file_id,))
        self.file_path(file_id).unlink(missing_ok=True)

    def read_part(self, file_id: str, offset: int) -> bytes:
        with self.file_path(file_id).open("rb") as stream:
            stream.seek(offset)
            return stream.read(READ_BYTES)

    def read_file(self, file_id: str) -> Iterator[bytes]:
        with self.file_path(file_id).open("rb") as stream:
            while chunk := stream.read(READ_BYTES):
                yield chunk

    # Batches

    def add_batch(self, row: BatchRow) -> None:
        with self._transaction():
            self._db.execute(
                "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window,"
                " metadata, status, created_at, expires_at, stamps, total, model)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (row.id, row.owner, row.endpoint, row.input_file_id, row.completion_window,
                 json.dumps(row.metadata), row.status.value, row.created_at, row.expires_at,
                 json.dumps(row.stamps), row.counts.total, row.model),
            )  # fmt: skip

    def batch(self, batch_id: str) -> BatchRow | None:
        found = self._db.execute("SELECT * FROM batches WHERE id=?", (batch_id,)).fetchone()
        return None if found is None else _batch_row(found)

    def batches(self, owner: str) -> list[BatchRow]:
        rows = self._db.execute(
            "SELECT * FROM batches WHERE owner=? ORDER BY created_at DESC, rowid DESC", (owner,)
        )
        return [_batch_row(r) for r in rows]

    def unfinished(self) -> list[BatchRow]:
        ended = tuple(s.value for s in (BatchStatus.COMPLETED, BatchStatus.FAILED,
                                         BatchStatus.EXPIRED, BatchStatus.CANCELLED))  # fmt: skip
        rows = self._db.execute(
            f"SELECT * FROM batches WHERE status NOT IN ({','.join('?' * len(ended))})"
            " ORDER BY created_at",
            ended,
        )
        return [_batch_row(r) for r in rows]

    def set_status(self, batch_id: str, status: BatchStatus, **fields: Any) -> BatchRow:
        """Move a batch to `status`, stamping `<status>_at` now (and setting `fields`)."""
        row = self.batch(batch_id)
        assert row is not None
        stamps = {**row.stamps, f"{status.value}_at": int(time.time())}
        columns = {"status": status.value, "stamps": json.dumps(stamps), **fields}
        if "errors" in columns:
            columns["errors"] = json.dumps(columns["errors"])
        assignments = ", ".join(f"{name}=?" for name in columns)
        with self._transaction():
            self._db.execute(f"UPDATE batches SET {assignments} WHERE id=?",
                             (*columns.values(), batch_id))  # fmt: skip
        updated = self.batch(batch_id)
        assert updated is not None
        return updated

    def commit_chunk(self, batch_id: str, results: Iterable[ChunkResult], next_line: int) -> None:
        """A chunk's results and the cursor past it, at once. A line already committed (the
        chunk ran again after a crash) is neither written nor counted again."""
        with self._transaction():
            completed = failed = input_tokens = output_tokens = 0
            for result in results:
                cursor = self._db.execute(
                    "INSERT OR IGNORE INTO results VALUES (?,?,?,?)",
                    (batch_id, result.line, int(result.ok), result.text),
                )
                if cursor.rowcount:
                    completed += result.ok
                    failed += not result.ok
                    input_tokens += result.input_tokens
                    output_tokens += result.output_tokens
            self._db.execute(
                "UPDATE batches SET completed=completed+?, failed=failed+?, next_line=?,"
                " input_tokens=input_tokens+?, output_tokens=output_tokens+? WHERE id=?",
                (completed, failed, next_line, input_tokens, output_tokens, batch_id),
            )

    def result_lines(self, batch_id: str, ok: bool) -> Iterator[str]:
        """The committed results of one kind, in input order, streamed from the database."""
        rows = self._db.execute(
            "SELECT text FROM results WHERE batch_id=? AND ok=? ORDER BY line", (batch_id, int(ok))
        )
        for (text,) in rows:
            yield text

    def has_result(self, batch_id: str, line: int) -> bool:
        found = self._db.execute(
            "SELECT 1 FROM results WHERE batch_id=? AND line=?", (batch_id, line)
        ).fetchone()
        return found is not None


def _file_row(found: tuple[Any, ...]) -> FileRow:
    file_id, owner, purpose, filename, size, created, lines, urls = found
    return FileRow(file_id, owner, purpose, filename, size, created, lines,
                   tuple(json.loads(urls)))  # fmt: skip


def _batch_row(found: tuple[Any, ...]) -> BatchRow:
    (batch_id, owner, endpoint, input_file_id, window, metadata, status, created, expires,
     stamps, total, completed, failed, next_line, output_id, error_id, errors, model,
     input_tokens, output_tokens) = found  # fmt: skip
    return BatchRow(
        batch_id, owner, endpoint, input_file_id, window, json.loads(metadata or "null"),
        BatchStatus(status), created, expires, json.loads(stamps),
        RequestCounts(total, completed, failed), next_line, output_id, error_id,
        json.loads(errors) if errors else None, model, input_tokens, output_tokens,
    )  # fmt: skip
