"""A replica's own SQLite file, opened as the gateway's stores keep theirs: the folder made,
autocommit (each store runs its own transactions), usable from the replica's threads, and the
store's schema applied."""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["open_sqlite"]


def open_sqlite(path: str | Path, schema: str) -> tuple[sqlite3.Connection, Path]:
    """The connection to the file at `path` (`~` expanded) with `schema` applied, and its path."""
    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    # A change is durable once it returns (SQLite's default synchronous=FULL in rollback-journal
    # mode).
    db = sqlite3.connect(file, isolation_level=None, check_same_thread=False)
    db.executescript(schema)
    return db, file
