"""Which link of a failover chain takes a request (pure: the router passes what it knows)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["LinkView", "choose_link"]


@dataclass(frozen=True)
class LinkView:
    """A backend as the router sees it at one instant."""

    running: bool  # has a running replica (Serve's status at the last health check)
    breaker_passes: bool  # its breaker would let a request through (CLOSED, or a free probe)
    kv_pressured: bool  # its engine's KV cache is past the high-water mark


def choose_link(
    chain: Sequence[str], views: Mapping[str, LinkView], tried: Collection[str] = ()
) -> str | None:
    """The first link that is deployed, running and not tripped, preferring one without KV
    pressure; when every such link is under pressure, the first of them (the request waits in
    its queue until the pressure falls). None when no link can take work at all."""
    usable = [
        link
        for link in chain
        if link in views
        and link not in tried
        and views[link].running
        and views[link].breaker_passes
    ]
    relaxed = next((link for link in usable if not views[link].kv_pressured), None)
    return relaxed if relaxed is not None else next(iter(usable), None)
