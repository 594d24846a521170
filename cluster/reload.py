"""A new config for the running app, applied in place: `make reload CONFIG=path [APP=name]`
(`python -m cluster.reload CONFIG [--app NAME]`, `gps reload ...`).

1. The new config is loaded and guarded as at a start (`gps check`): a refusal changes nothing.
2. The running config is read from an ingress replica, and core/config/reload.py sorts what
   changed. A change built into a deployment (models, pools, engines, replica counts, the
   fallback...) refuses the whole reload, naming each field: nothing changes, and such a change
   takes a new `make run`.
3. The config is published (deployments/live_config.py) for the running build of the app.
   Every ingress and router replica reads it once a second and applies it, without a restart
   and with nothing in flight lost; the command waits until each replica alive has acked it,
   and names the keys added and removed (GPU_POOL_SERVE_API_KEYS is read here, from this
   command's environment, as `serve run` reads it from its own).

Exit status: 0 applied (or nothing to change), 2 refused (nothing changed), 1 published but not
acknowledged by every replica within --wait seconds (those that did run it).
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
from deployments.live_config import Publication

DEFAULT_APP = "default"  # `serve run`'s name for the app
WAIT_S = 30.0
POLL_S = 0.2
SYNCED_DEPLOYMENTS = ("ingress", "router")  # the replicas that apply a reload


class RunningApp(Protocol):
    """The app as the reload sees it (`ServeApp` is Serve's)."""

    def running(self) -> Running: ...  # as an ingress replica answers
    def published_revision(self) -> int: ...
    def publish(self, publication: Publication) -> None: ...
    def replicas(self) -> set[str]: ...  # the ingress and router replicas alive now (ids)
    def acked(self, revision: int) -> set[str]: ...  # replicas that run `revision` (ids)


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
    app.publish(Publication(revision, running.build, new.model_dump(mode="json")))
    published = clock()
    deadline = published + wait_s
    while True:
        # A replica that died after its ack is not counted; one that started since must ack.
        alive = app.replicas()
        done = alive & app.acked(revision)
        if done == alive or clock() >= deadline:
            before = {k.name for k in running.config.api_keys}
            after = {k.name for k in new.api_keys}
            added, removed = tuple(sorted(after - before)), tuple(sorted(before - after))
            seconds = clock() - published
            return Outcome(revision, changes.live, len(alive), len(done), added, removed, seconds)
        sleep(POLL_S)


class ServeApp:
    """A running Serve app of this project, from a driver connected to its Ray cluster."""

    def __init__(self, name: str) -> None:
        import ray
        from ray import serve

        if not ray.is_initialized():
            ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        if name not in serve.status().applications:
            raise ReloadRefused(f"no Serve application named {name!r} is running")
        self._name = name

    def running(self) -> Running:
        from ray import serve

        answer = serve.get_app_handle(self._name).live_config.remote().result(timeout_s=60)
        config = ClusterConfig.model_validate(answer["config"])
        return Running(int(answer["revision"]), str(answer["build"]), config)

    def published_revision(self) -> int:
        from deployments.live_config import read_publication

        publication = read_publication(self._name)
        return 0 if publication is None else publication.revision

    def publish(self, publication: Publication) -> None:
        from deployments.live_config import publish

        publish(self._name, publication)

    def replicas(self) -> set[str]:
        from deployments.live_config import replica_ids

        return replica_ids(self._name, SYNCED_DEPLOYMENTS)

    def acked(self, revision: int) -> set[str]:
        from deployments.live_config import acked

        return acked(self._name, revision)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.reload", description=__doc__)
    parser.add_argument("config", type=Path, help="the new config file")
    parser.add_argument("--app", default=DEFAULT_APP, help="the Serve application's name")
    parser.add_argument("--wait", type=float, default=WAIT_S, help="seconds to wait for acks")
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
        outcome = reload(new, ServeApp(args.app), args.wait)
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
    return 0 if outcome.complete else 1


if __name__ == "__main__":
    sys.exit(main())
