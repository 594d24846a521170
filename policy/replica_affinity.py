"""Which replica a conversation stays on: its session key ranks the replicas the same way in
every router (rendezvous hashing), so a conversation returns to the replica that holds its
prefix in the KV cache, and when that replica goes only its own conversations move.

A conversation leaves its replica while that replica is full or holds `slack` more requests
than the least loaded one: a prefix is worth less than a queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

__all__ = ["keeps_session", "session_ranking"]


def _weight(session: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{session}\0{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def session_ranking(session: str, replicas: Sequence[str]) -> list[str]:
    """`replicas` best first for `session`: the same order in any router, whatever order the
    replicas come in."""
    return sorted(replicas, key=lambda replica: (-_weight(session, replica), replica))


def keeps_session(home: str, queue_lengths: Mapping[str, int | None], slack: int) -> bool:
    """Whether the session stays on `home`: its queue length (None: not known, taken as no
    worse than the rest) no more than `slack` above the shortest known queue."""
    mine = queue_lengths.get(home)
    known = [n for n in queue_lengths.values() if n is not None]
    if mine is None or not known:
        return True
    return mine - min(known) <= slack
