"""Stored responses (`store: true`, the Responses API's default) in SQLite: one file
(`gateway.responses_db`, relative to the config file), one table for every app that shares it.

A row is a response as it was answered and the whole conversation's input items up to it
(the chain of `previous_response_id` already unrolled), so continuing a conversation reads one
row, never a chain. A row belongs to the key that made it: another key's lookup finds nothing,
as for an id that never was (no answer tells one from the other). A row lives
`gateway.responses_retention_s` from its creation (given with each put: a redeploy's new
retention holds from its first put); `purge` removes what has expired, and `find` never
returns it meanwhile. The ingress makes the ids (random); a put never replaces another key's
row.

Why a file: stored responses must outlive the ingress replicas, a redeploy and the GCS, as the
run-time keys do (deployments/keys/store.py, whose journal mode and single writer this
follows: deployments/ingress/responses/keeper.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.sqlite_file import open_sqlite

__all__ = ["ResponseStore", "StoredResponse"]

Body = dict[str, Any]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stored_responses (
    app TEXT NOT NULL,
    id TEXT NOT NULL,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    PRIMARY KEY (app, id)
);
CREATE INDEX IF NOT EXISTS stored_responses_expiry ON stored_responses (expires_at);
"""


@dataclass(frozen=True)
class StoredResponse:
    id: str
    owner: str  # the key's name ("anonymous" where keys are off)
    response: Body  # the response object as answered
    input_items: list[Body]  # the conversation's input up to it, each item with its id
    created_at: float = 0.0
    expires_at: float = 0.0

    def conversation(self) -> list[Body]:
        """What a response continuing this one reads first: its input, then its output."""
        output = self.response.get("output")
        return [*self.input_items, *(output if isinstance(output, list) else [])]


class ResponseStore:
    """One app's stored responses in the SQLite file at `path` (created with its folder)."""

    def __init__(self, path: str | Path, app: str, clock: Callable[[], float]) -> None:
        self._db, self.path = open_sqlite(path, _SCHEMA)
        self._app = app
        self._clock = clock

    def put(self, stored: StoredResponse, retention_s: float) -> StoredResponse | None:
        """Kept from now for `retention_s`; the owner's own row of that id (a retried write) is
        replaced, another owner's never (None then)."""
        now = self._clock()
        kept = StoredResponse(
            stored.id,
            stored.owner,
            stored.response,
            stored.input_items,
            created_at=now,
            expires_at=now + retention_s,
        )
        done = self._db.execute(
            "INSERT INTO stored_responses "
            "(app, id, owner, created_at, expires_at, response, input_items) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (app, id) DO UPDATE SET created_at = excluded.created_at, "
            "expires_at = excluded.expires_at, response = excluded.response, "
            "input_items = excluded.input_items WHERE owner = excluded.owner",
            (
                self._app,
                kept.id,
                kept.owner,
                kept.created_at,
                kept.expires_at,
                json.dumps(kept.response, ensure_ascii=False),
                json.dumps(kept.input_items, ensure_ascii=False),
            ),
        )
        return kept if done.rowcount > 0 else None

    def find(self, response_id: str, owner: str) -> StoredResponse | None:
        """The owner's response of that id, unless it has expired."""
        row = self._db.execute(
            "SELECT id, owner, response, input_items, created_at, expires_at "
            "FROM stored_responses WHERE app = ? AND id = ? AND owner = ? AND expires_at > ?",
            (self._app, response_id, owner, self._clock()),
        ).fetchone()
        if row is None:
            return None
        rid, who, response, items, created_at, expires_at = row
        return StoredResponse(
            rid, who, json.loads(response), json.loads(items), created_at, expires_at
        )

    def delete(self, response_id: str, owner: str) -> bool:
        """Whether the owner had such a response (expired ones count as gone)."""
        done = self._db.execute(
            "DELETE FROM stored_responses WHERE app = ? AND id = ? AND owner = ? "
            "AND expires_at > ?",
            (self._app, response_id, owner, self._clock()),
        )
        return done.rowcount > 0

    def purge(self) -> int:
        """Removes every expired response of the app; how many."""
        done = self._db.execute(
            "DELETE FROM stored_responses WHERE app = ? AND expires_at <= ?",
            (self._app, self._clock()),
        )
        return done.rowcount

    def close(self) -> None:
        self._db.close()
