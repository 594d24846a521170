"""How many replicas a Serve deployment handle would send a request to, right now.

Every `DeploymentHandle` keeps the deployment's running replica set, pushed to it by the Serve
controller's long poll the moment the set changes, and drops a replica at once when a call to it
fails with `ActorDiedError`. A request made while that set is empty waits inside the handle
until a replica starts: for a vLLM engine, the minutes of a model's load. The router reads the
set before it chooses a link, so a backend whose only replica died is passed over at once
instead of holding the job until `first_token_timeout_s`.

Serve has no public call for this set (its handles only expose `running_replicas_populated`,
which stays True after the set empties), so this reads the handle's router as Ray 2.60 keeps it
(`ray/serve/_private/router.py`: `AsyncioRouter._request_router.curr_replicas`, or
`_running_replicas` before the request router is built), and only once the handle has had a
replica (`_running_replicas_populated`): before that an empty set may only mean that no update
has arrived yet. Any other shape answers None ("unknown"), and an unknown count never takes a
link out: the router then learns of a death from a failed call or its health loop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["routable_replicas"]


def routable_replicas(handle: Any) -> int | None:
    """The replicas `handle` routes to now; None when the handle cannot tell (not initialized,
    never had a replica yet, or a Serve version that keeps the set elsewhere)."""
    router = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    if router is None or getattr(router, "_running_replicas_populated", False) is not True:
        return None
    # The attribute, not the `request_router` property: the property builds the request router
    # on first use, which is the handle's own event loop's job, not a reader's.
    request_router = getattr(router, "_request_router", None)
    if request_router is not None:
        replicas = getattr(request_router, "curr_replicas", None)
    else:
        replicas = getattr(router, "_running_replicas", None)
    try:
        return None if replicas is None else len(replicas)
    except TypeError:
        return None
