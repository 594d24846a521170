"""Run-time keys (`POST /v1/keys`) in SQLite: one file (`gateway.keys_db`, relative to the
config file), one table for every app that shares it.

Why a file, not Ray's key-value store: the keys must outlive the app (a redeploy, `serve
shutdown`) and the GCS (whose store is memory unless it is backed by Redis); a file on the
gateway's disk, or on storage every gateway node mounts, is still there when both restart.
The rollback journal (SQLite's default, not WAL) is the mode a network filesystem can hold, as
far as its locks are sound: one registry per app writes. Only the secret's SHA-256 is stored;
the secret itself is made by the registry (deployments/keys/registry.py), answered once and
never written anywhere.

Each change bumps the app's version in the same transaction, so a reader that saw version N
knows whether anything changed since. A revoked key keeps its row (who it was, when it went),
out of the active set for good.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import ApiKeyConfig, KeyFields
from deployments.sqlite_file import open_sqlite

__all__ = ["KeyNameTaken", "KeyNotFound", "KeyStore", "StoredKey"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS run_time_keys (
    app TEXT NOT NULL,
    id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    fields TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    revoked_at REAL,
    PRIMARY KEY (app, id)
);
CREATE UNIQUE INDEX IF NOT EXISTS run_time_key_digests ON run_time_keys (sha256);
CREATE TABLE IF NOT EXISTS run_time_key_versions (
    app TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
"""


class KeyNotFound(LookupError):
    """No active run-time key has that id."""


class KeyNameTaken(ValueError):
    """Another active key of the app has that name."""


@dataclass(frozen=True)
class StoredKey:
    id: str
    sha256: str
    fields: KeyFields
    created_at: float
    updated_at: float

    def config(self) -> ApiKeyConfig:
        """The key as the ingress holds a config key (never an admin key)."""
        return ApiKeyConfig(**self.fields.model_dump(), sha256=self.sha256)

    def shown(self) -> dict[str, Any]:
        """What `GET /v1/keys` says of it: never the digest, never the secret."""
        return {
            "id": self.id,
            "object": "api_key",
            "source": "api",
            "created_at": int(self.created_at),
            "updated_at": int(self.updated_at),
            **self.fields.model_dump(mode="json"),
            "admin": False,
        }


class KeyStore:
    """One app's run-time keys in the SQLite file at `path` (created with its folder)."""

    def __init__(self, path: str | Path, app: str, clock: Callable[[], float]) -> None:
        # Transactions are ours (`_writing`).
        self._db, self.path = open_sqlite(path, _SCHEMA)
        self._app = app
        self._clock = clock

    def version(self) -> int:
        row = self._db.execute(
            "SELECT version FROM run_time_key_versions WHERE app = ?", (self._app,)
        ).fetchone()
        return int(row[0]) if row else 0

    def active(self) -> list[StoredKey]:
        rows = self._db.execute(
            "SELECT id, sha256, fields, created_at, updated_at FROM run_time_keys "
            "WHERE app = ? AND revoked_at IS NULL ORDER BY created_at, id",
            (self._app,),
        ).fetchall()
        return [_stored(row) for row in rows]

    def create(self, key_id: str, sha256: str, fields: KeyFields) -> StoredKey:
        now = self._clock()
        with self._writing():
            self._name_free(fields.name, key_id)
            self._db.execute(
                "INSERT INTO run_time_keys (app, id, sha256, fields, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self._app, key_id, sha256, _json(fields), now, now),
            )
            self._bump()
        return StoredKey(key_id, sha256, fields, now, now)

    def update(self, key_id: str, fields: KeyFields) -> StoredKey:
        now = self._clock()
        with self._writing():
            found = self._one(key_id)
            self._name_free(fields.name, key_id)
            self._db.execute(
                "UPDATE run_time_keys SET fields = ?, updated_at = ? WHERE app = ? AND id = ?",
                (_json(fields), now, self._app, key_id),
            )
            self._bump()
        return StoredKey(key_id, found.sha256, fields, found.created_at, now)

    def revoke(self, key_id: str) -> StoredKey:
        with self._writing():
            found = self._one(key_id)
            self._db.execute(
                "UPDATE run_time_keys SET revoked_at = ? WHERE app = ? AND id = ?",
                (self._clock(), self._app, key_id),
            )
            self._bump()
        return found

    def find(self, key_id: str) -> StoredKey:
        return self._one(key_id)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One change, its checks and its version bump in one transaction that holds SQLite's
        write lock from its start: the name check and the insert are one step even if two
        registries ever share the file."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _one(self, key_id: str) -> StoredKey:
        row = self._db.execute(
            "SELECT id, sha256, fields, created_at, updated_at FROM run_time_keys "
            "WHERE app = ? AND id = ? AND revoked_at IS NULL",
            (self._app, key_id),
        ).fetchone()
        if row is None:
            raise KeyNotFound(f"No run-time key has the id {key_id!r}.")
        return _stored(row)

    def _name_free(self, name: str, key_id: str) -> None:
        for other in self.active():
            if other.fields.name == name and other.id != key_id:
                raise KeyNameTaken(f"A key named {name!r} exists ({other.id}).")

    def _bump(self) -> None:
        self._db.execute(
            "INSERT INTO run_time_key_versions (app, version) VALUES (?, 1) "
            "ON CONFLICT (app) DO UPDATE SET version = version + 1",
            (self._app,),
        )


def _json(fields: KeyFields) -> str:
    return json.dumps(fields.model_dump(mode="json"), sort_keys=True)


def _stored(row: tuple[Any, ...]) -> StoredKey:
    key_id, sha256, fields, created_at, updated_at = row
    return StoredKey(
        key_id, sha256, KeyFields.model_validate(json.loads(fields)), created_at, updated_at
    )
