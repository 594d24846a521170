"""Reading a Serve handle's running replica set: the count when the handle knows it, None
("unknown", never a reason to pass a link over) for any handle that cannot tell."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ray.serve._private.request_router.request_router import RequestRouter
from ray.serve._private.router import AsyncioRouter, CurrentLoopRouter, SingletonThreadRouter

from deployments.router.adapters.handle_replicas import routable_replicas


def handle(request_router: Any = None, running: Any = None, populated: bool = True) -> Any:
    router = SimpleNamespace(
        _request_router=request_router,
        _running_replicas=running,
        _running_replicas_populated=populated,
    )
    return SimpleNamespace(_router=SimpleNamespace(_asyncio_router=router))


def test_the_request_routers_replicas_are_counted() -> None:
    replicas = {"r1": object(), "r2": object()}
    assert routable_replicas(handle(SimpleNamespace(curr_replicas=replicas))) == 2
    assert routable_replicas(handle(SimpleNamespace(curr_replicas={}))) == 0


def test_before_the_request_router_is_built_the_pushed_list_counts() -> None:
    assert routable_replicas(handle(running=[object()])) == 1
    assert routable_replicas(handle(running=[])) == 0


def test_a_handle_that_never_had_a_replica_cannot_tell() -> None:
    """At the app's start the set is empty before any update: that is not a death."""
    empty = SimpleNamespace(curr_replicas={})
    assert routable_replicas(handle(empty, populated=False)) is None


def test_anything_else_is_unknown() -> None:
    assert routable_replicas(SimpleNamespace(_router=None)) is None  # not initialized
    assert routable_replicas(object()) is None
    assert routable_replicas(handle(SimpleNamespace(curr_replicas=None))) is None
    assert routable_replicas(handle(SimpleNamespace(curr_replicas=3))) is None  # no length
    assert routable_replicas(handle()) is None  # neither kept


def test_the_pinned_ray_keeps_the_set_where_this_reads_it() -> None:
    """Ray 2.60's routers: a changed layout fails here, not silently in production (where the
    reading would turn to None and dead backends would cost a first-token timeout again)."""
    init = AsyncioRouter.__init__.__code__.co_names
    assert {"_request_router", "_running_replicas", "_running_replicas_populated"} <= set(init)
    for wrapper in (CurrentLoopRouter, SingletonThreadRouter):  # our front's, Serve's default
        assert "_asyncio_router" in wrapper.__init__.__code__.co_names
    assert isinstance(vars(RequestRouter)["curr_replicas"], property)
