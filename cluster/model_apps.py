"""The engines of the models a reload adds or changes, each backend in a Serve app of its own
beside the gateway's (`<app>--<model>@<pool>--r<revision>`), and the retirement of those a
reload removes or replaces.

Serve redeploys an app whole (every replica of it, engines included) when it is run again, so
a reload never touches the gateway's app: a new engine is its own app, deployed and awaited
RUNNING and healthy before any router sends it work; the routers reach it by its name
(deployments/live_config.py, `Publication.homes`). An engine leaves once every router replica
stopped sending it work: its own app is deleted, and one of the gateway's build is retired to
zero replicas (autoscale/serve_scaling.py). Either way Serve stops its replicas gracefully,
waiting for the requests they still run (`graceful_shutdown_timeout_s`), and the engine's
processes end with the replica (deployments/engine/parent_death.py). A new `serve run` of the
app deletes the engines an earlier build's reloads started, as its replicas start
(deployments/live_config.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from core.config import ClusterConfig
from core.topology import Backend
from deployments.live_config import Homes, delete_apps

STATUS_POLL_S = 2.0
RUNNING = "RUNNING"
FAILED = frozenset({"DEPLOY_FAILED", "UNHEALTHY"})


class EngineStartFailed(Exception):
    """A new engine did not come up; the ones this reload started are deleted again."""


def engine_app(app: str, backend: str, revision: int) -> str:
    """The Serve app a reload of `revision` starts `backend`'s engine in."""
    return f"{app}--{backend}--r{revision}"


def start_engines(
    config: ClusterConfig,
    backends: Iterable[Backend],
    app: str,
    revision: int,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, tuple[str, str]]:
    """Deploy each backend's engine in an app of its own and wait until every one is RUNNING
    (Serve counts a replica running once its health check passed); their homes by backend."""
    # `serve.run` itself waits for RUNNING with no deadline: its inner call, without the wait.
    from ray.serve.api import _run as deploy

    from cluster.backends import build_backend

    homes = {}
    try:
        for backend in backends:
            name = engine_app(app, backend.name, revision)
            # placed=False: a model a reload starts runs on its one pool, at its replicas.
            deploy(
                build_backend(config, backend, placed=False),
                _blocking=False,
                name=name,
                route_prefix=None,
            )
            homes[backend.name] = (name, backend.deployment_name)
        _await_running({home[0] for home in homes.values()}, timeout_s, clock)
    except BaseException:
        delete_apps(home[0] for home in homes.values())
        raise
    return homes


def _await_running(apps: set[str], timeout_s: float, clock: Callable[[], float]) -> None:
    from ray import serve

    deadline = clock() + timeout_s
    while True:
        statuses = serve.status().applications
        states = {n: str(statuses[n].status.value) if n in statuses else "" for n in apps}
        failed = {name: state for name, state in states.items() if state in FAILED}
        if failed:
            messages = "; ".join(f"{n}: {statuses[n].message or failed[n]}" for n in failed)
            raise EngineStartFailed(f"a new engine failed to start ({messages})")
        if all(state == RUNNING for state in states.values()):
            return
        if clock() >= deadline:
            waiting = ", ".join(sorted(n for n, s in states.items() if s != RUNNING))
            raise EngineStartFailed(f"not running after {timeout_s:.0f} s: {waiting}")
        time.sleep(STATUS_POLL_S)


def retire_engines(app: str, build: str, leaving: Homes) -> None:
    """Stop the engines of backends no router sends work to any more: an engine app a reload
    started is deleted; a deployment of the gateway's own build is retired to zero."""
    from autoscale.serve_scaling import retire

    own = [deployment for home_app, deployment in leaving.values() if home_app == app]
    for deployment in own:
        retire(app, deployment, build)
    delete_apps(home_app for home_app, _ in leaving.values() if home_app != app)


def engines_running(homes: Homes) -> dict[str, int]:
    """Running replicas of each backend's deployment, where it is (0 once gone)."""
    from ray import serve

    statuses = serve.status().applications
    counts = {}
    for backend, (app, deployment) in homes.items():
        info = statuses[app].deployments.get(deployment) if app in statuses else None
        counts[backend] = info.replica_states.get(RUNNING, 0) if info is not None else 0
    return counts
