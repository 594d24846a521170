"""A new config for the running app, applied in place: `make reload CONFIG=path [APP=name]`
(`python -m cluster.reload CONFIG [--app NAME]`, `gps reload ...`).

1. The new config is loaded and guarded as at a start (`gps check`): a refusal changes nothing.
2. The running config is read from an ingress replica, and core/config/reload.py sorts what
   changed. A change built into a deployment (pools, the fallback, a model placement moves or
   load sizes...) refuses the whole reload, naming each field: nothing changes, and such a
   change takes a new `make run`.
3. The engines of models added or changed are started, each in a Serve app of its own
   (cluster/model_apps.py), and awaited running and healthy (--start-timeout). One that fails
   refuses the reload: the engines it started are deleted, and nothing else changed.
4. The config is published (deployments/live_config.py) for the running build of the app,
   with where each new engine runs. Every ingress, router and CPU fallback replica (the
   fallback's line takes the router's aging, shares and engine numbers) reads it once a second
   and applies it, without a restart and with nothing in flight lost; the command waits until
   each replica alive has acked it, and names the keys added and removed
   (GPU_POOL_SERVE_API_KEYS is read here, from this command's environment, as `serve run` reads
   it from its own).
5. Once every replica runs it, no router sends work to the engines of models removed or
   changed: they are stopped (Serve lets their replicas finish what they run first).

Exit status: 0 applied (or nothing to change), 2 refused (nothing changed), 1 published but not
acknowledged by every replica within --wait seconds (those that did run it; the engines it
would have stopped are left running, for a reload of the same config to stop).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cluster import config as config_check
from core.config import ClusterConfig, ConfigError, load_config
from core.config.reload import reload_changes
from core.topology import Backend
from core.types import DEPLOYMENT_PREFIX, FALLBACK_BACKEND
from deployments.live_config import Homes, Publication

DEFAULT_APP = "default"  # `serve run`'s name for the app
WAIT_S = 30.0
START_TIMEOUT_S = 900.0  # a new engine: a model's download, load and warm-up
POLL_S = 0.2
# The replicas that apply a reload: the fallback's name is fixed (core/topology.py,
# fallback_target), and a replica bound without the app's build never acks (build_fallback).
FALLBACK_DEPLOYMENT = f"{DEPLOYMENT_PREFIX}{FALLBACK_BACKEND}"
ROUTING_DEPLOYMENTS = ("ingress", "router")  # those that send work to the engines
SYNCED_DEPLOYMENTS = (*ROUTING_DEPLOYMENTS, FALLBACK_DEPLOYMENT)


class RunningApp(Protocol):
    """The app as the reload sees it (`ServeApp` is Serve's)."""

    name: str  # the Serve app of the gateway and the engines it was built with

    def running(self) -> Running: ...  # as an ingress replica answers
    def published_revision(self) -> int: ...
    def publish(self, publication: Publication) -> None: ...
    # The replicas of `deployments` alive now (ids).
    def replicas(self, deployments: tuple[str, ...] = SYNCED_DEPLOYMENTS) -> set[str]: ...
    def acked(self, revision: int) -> set[str]: ...  # replicas that run `revision` (ids)
    def homes(self) -> dict[str, tuple[str, str]]: ...  # backends earlier reloads started
    def start(self, config: ClusterConfig, backends: list[Backend], revision: int) -> Homes: ...
    def retire(self, build: str, leaving: Homes) -> None: ...


@dataclass(frozen=True)
class Running:
    revision: int
    build: str
    config: ClusterConfig


class ReloadRefused(Exception):
    """Nothing was changed; the message says why."""


@dataclass(frozen=True)
class Outcome:
    revision: int
    live: tuple[str, ...]
    replicas: int
    acked: int
    keys_added: tuple[str, ...] = ()
    keys_removed: tuple[str, ...] = ()
    seconds: float = 0.0  # from the publication to the last acknowledgement awaited
    started: tuple[str, ...] = ()  # backends whose new engines serve now
    stopped: tuple[str, ...] = ()  # backends whose engines are being stopped

    @property
    def complete(self) -> bool:
        return self.acked >= self.replicas


def reload(
    new: ClusterConfig,
    app: RunningApp,
    wait_s: float = WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome | None:
    """Publish `new` to `app` if every change applies in place, and wait until every replica
    alive runs it; None when nothing changes."""
    running = app.running()
    changes = reload_changes(running.config, new)
    if changes.fixed:
        fields = "\n".join(f"  {path}" for path in changes.fixed)
        raise ReloadRefused(
            "these changes are built into a deployment and take a new `make run`; "
            f"nothing was changed:\n{fields}"
        )
    if not changes.live:
        return None
    revision = max(running.revision, app.published_revision()) + 1
    engines = (*changes.added, *changes.replaced)
    leaving_models = (*changes.removed, *changes.replaced)
    earlier = app.homes()
    try:
        started = app.start(new, [b for b in new.backends if b.model in engines], revision)
    except Exception as error:  # noqa: BLE001 - whatever the cause, nothing was changed
        raise ReloadRefused(f"{error}; nothing was changed") from None
    gone = {b.name: b for b in running.config.backends if b.model in leaving_models}
    homes = {name: home for name, home in earlier.items() if name not in gone} | dict(started)
    app.publish(Publication(revision, running.build, new.model_dump(mode="json"), homes))
    published = clock()
    deadline = published + wait_s
    while True:
        # A replica that died after its ack is not counted; one that started since must ack.
        alive = app.replicas()
        done = alive & app.acked(revision)
        if done == alive or clock() >= deadline:
            break
        sleep(POLL_S)
    seconds = clock() - published
    # No router sends them work now: the fallback's ack (it sends none) is not waited for, so
    # a fallback that cannot ack (its pool's node down) never keeps old engines running.
    routed = app.replicas(ROUTING_DEPLOYMENTS) <= done
    if routed and gone:
        leaving = {n: earlier.get(n, (app.name, b.deployment_name)) for n, b in gone.items()}
        app.retire(running.build, leaving)
    before = {k.name for k in running.config.api_keys}
    after = {k.name for k in new.api_keys}
    added, removed = tuple(sorted(after - before)), tuple(sorted(before - after))
    stopped = tuple(sorted(gone)) if routed else ()
    return Outcome(
        revision, changes.live, len(alive), len(done), added, removed, seconds,
        tuple(sorted(started)), stopped,
    )  # fmt: skip


class ServeApp:
    """A running Serve app of this project, from a driver connected to its Ray cluster."""

    def __init__(self, name: str) -> None:
        import ray
        from ray import serve

        if not ray.is_initialized():
            ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        if name not in serve.status().applications:
            raise ReloadRefused(f"no Serve application named {name!r} is running")
        self.name = name
        self.start_timeout_s = START_TIMEOUT_S

    def running(self) -> Running:
        from cluster.driver_handles import app_handle

        answer = app_handle(self.name).live_config.remote().result(timeout_s=60)
        config = ClusterConfig.model_validate(answer["config"])
        return Running(int(answer["revision"]), str(answer["build"]), config)

    def published_revision(self) -> int:
        from deployments.live_config import read_publication

        publication = read_publication(self.name)
        return 0 if publication is None else publication.revision

    def publish(self, publication: Publication) -> None:
        from deployments.live_config import publish

        publish(self.name, publication)

    def replicas(self, deployments: tuple[str, ...] = SYNCED_DEPLOYMENTS) -> set[str]:
        from deployments.live_config import replica_ids

        return replica_ids(self.name, deployments)

    def acked(self, revision: int) -> set[str]:
        from deployments.live_config import acked

        return acked(self.name, revision)

    def homes(self) -> dict[str, tuple[str, str]]:
        from deployments.live_config import read_publication

        publication = read_publication(self.name)
        return {} if publication is None else dict(publication.homes)

    def start(self, config: ClusterConfig, backends: list[Backend], revision: int) -> Homes:
        from cluster.model_apps import start_engines

        if not backends:
            return {}
        names = ", ".join(b.name for b in backends)
        print(f"gpu-pool-serve: starting {names} (waiting until it serves)", flush=True)
        began = time.monotonic()
        homes = start_engines(config, backends, self.name, revision, self.start_timeout_s)
        print(f"gpu-pool-serve: {names} running and healthy {time.monotonic() - began:.0f} s "
              "after it was deployed", flush=True)  # fmt: skip
        return homes

    def retire(self, build: str, leaving: Homes) -> None:
        from cluster.model_apps import retire_engines

        retire_engines(self.name, build, leaving)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.reload", description=__doc__)
    parser.add_argument("config", type=Path, help="the new config file")
    parser.add_argument("--app", default=DEFAULT_APP, help="the Serve application's name")
    parser.add_argument("--wait", type=float, default=WAIT_S, help="seconds to wait for acks")
    parser.add_argument(
        "--start-timeout", type=float, default=START_TIMEOUT_S,
        help="seconds a new model's engine may take to serve",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        new = load_config(args.config)
        findings = [f for f in config_check.check(new) if f.level != "note"]
        refusals = [f for f in findings if f.level == "refuse"]
        if refusals:
            found = "\n".join(f"  {finding}" for finding in refusals)
            raise ReloadRefused(f"the config guard refused it; nothing was changed:\n{found}")
        for finding in findings:  # warnings, as at a start
            print(f"gpu-pool-serve: {finding}", file=sys.stderr)
        app = ServeApp(args.app)
        app.start_timeout_s = args.start_timeout
        outcome = reload(new, app, args.wait)
    except (ConfigError, ReloadRefused) as error:
        print(f"gpu-pool-serve: reload refused: {error}", file=sys.stderr)
        return 2
    if outcome is None:
        print("gpu-pool-serve: the running app already has this config; nothing to change")
        return 0
    print(
        f"gpu-pool-serve: revision {outcome.revision} applied in place: {', '.join(outcome.live)}"
    )
    print(
        f"gpu-pool-serve: {outcome.acked} of {outcome.replicas} replicas run it "
        f"({outcome.seconds:.1f} s after it was published)"
    )
    if outcome.started:
        print(f"gpu-pool-serve: new engines serve: {', '.join(outcome.started)}")
    if outcome.stopped:
        print(
            f"gpu-pool-serve: engines stopping (after the requests they run): "
            f"{', '.join(outcome.stopped)}"
        )
    elif not outcome.complete and outcome.started:
        print("gpu-pool-serve: engines of removed or changed models left running until every "
              "replica runs this config (reload it again)")  # fmt: skip
    return 0 if outcome.complete else 1


if __name__ == "__main__":
    sys.exit(main())
