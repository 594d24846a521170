"""The request router of a backend with more than one replica: Ray Serve LLM's
`PrefixCacheAffinityRouter` (the replica whose prefix tree matches the prompt best, while the
load is balanced), with a session key first.

A request that carries a session (`X-Session-Id`, else OpenAI's `user`: Serve's handle
`session_id`) goes to the session's replica (policy.replica_affinity) while that replica is
among the candidates, not full, and not `session_slack` requests busier than the least loaded
one; otherwise, and without a session, the prefix router chooses. Requests with no prompt text
to match (embeddings, token-id prompts, empty messages) get Serve's power-of-two choice, never
an error.

The prefix tree lives in the router's own process (`InProcessTree`), not in the detached actor
the prefix router would start: the router runs on the gateway's event loop (front_options.py),
where the prefix router's `ray.get` on a remote actor would stall every stream for a round trip
(and forever, were the actor never scheduled: it asks for a CPU the engines hold), and a
detached actor would outlive the app. Each router replica learns from what it routed itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray

# The router's module, not ray.serve.llm's public re-export of it: ray.serve.llm's package
# imports vLLM (and torch), and this runs in the router's process.
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTree
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

from policy.replica_affinity import keeps_session, session_ranking

__all__ = ["MAX_PREFIX_CHARS", "ROUTER_PATH", "InProcessTree", "SessionPrefixRouter"]

logger = logging.getLogger("ray.serve")

ROUTER_PATH = f"{__name__}.SessionPrefixRouter"
# The tree matches and learns only a prompt's first characters: its work runs on the gateway's
# loop and grows with the text (a few ms per 100k characters), as does each result's ray.put into
# the node's object store. 32k characters is the system prompt and the first thousands of tokens
# of a conversation: enough to tell conversations apart.
MAX_PREFIX_CHARS = 32_768


class _Call:
    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Run now; the result is already in the object store when the caller asks for it."""
        return ray.put(self._method(*args, **kwargs))


class InProcessTree:
    """Ray's PrefixTree, shaped as the actor handle the prefix router calls
    (`tree.method.remote(...)`, then `ray.get`)."""

    def __init__(self) -> None:
        self._tree = PrefixTree()

    def __getattr__(self, name: str) -> _Call:
        return _Call(getattr(self._tree, name))


class SessionPrefixRouter(PrefixCacheAffinityRouter):  # type: ignore[misc]
    def initialize_state(self, session_slack: int = 2, **prefix_kwargs: Any) -> None:
        super().initialize_state(**{"tree_actor": InProcessTree(), **prefix_kwargs})
        self._session_slack = session_slack

    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        session = getattr(getattr(pending_request, "metadata", None), "session_id", None)
        if session and candidate_replicas:
            by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
            ranked = session_ranking(session, list(by_id))
            home = by_id[ranked[0]]
            # Serve's own cache of replica queue lengths (what its power-of-two choice reads);
            # a full replica counts as busier than any slack.
            lengths = {rid: self._queue_length(r) for rid, r in by_id.items()}
            if keeps_session(ranked[0], lengths, self._session_slack):
                # The session's replica first, then the rest one rank each in the session's
                # order should it refuse; all refusing, Serve backs off before asking again.
                pending_request.routing_context.should_backoff = True
                return [[home], *([by_id[rid]] for rid in ranked[1:])]
        try:
            chosen: list[list[Any]] = await super().choose_replicas(
                candidate_replicas, pending_request
            )
        except Exception:  # a request Serve dequeued must still get a replica
            logger.exception("prefix routing failed; power-of-two chooses")
            chosen = await PowerOfTwoChoicesRequestRouter.choose_replicas(
                self, candidate_replicas, pending_request
            )
        return chosen

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        """Learn the prompt for its replica; a failure to learn must not fail the request."""
        try:
            super().on_request_routed(pending_request, replica_id, result)
        except Exception:
            logger.exception("the prefix tree did not learn a routed request")

    def _queue_length(self, replica: Any) -> int | None:
        length: int | None = self._replica_queue_len_cache.get(replica.replica_id)
        if length is not None and length >= replica.max_ongoing_requests:
            return length + self._session_slack + 1  # full: never kept there
        return length

    def _extract_text_from_request(self, pending_request: Any) -> str | None:
        """The prompt's text, or None where there is none to match (the prefix router then
        leaves the choice to power-of-two; its own would raise or divide by zero)."""
        try:
            text = super()._extract_text_from_request(pending_request)
        except ValueError:  # no messages or prompt: an embedding
            return None
        return text[:MAX_PREFIX_CHARS] or None
