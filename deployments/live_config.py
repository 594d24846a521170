"""A reloaded config on its way to every ingress, router and CPU fallback replica of a running
app (the fallback takes the router's aging and class shares for its own line).

`make reload` (cluster/reload.py) publishes the new config in Ray's internal key-value store
(the GCS, as placement's replica counts are): a revision number, the build it is for, and the
config. The build is a token `cluster.app.build_app` makes for each build of the app and binds
into the ingress's and router's arguments: the replicas of one `serve run` share it, a
restarted replica or controller keeps it, and a new `serve run` makes another, so a reload of
an earlier deployment is never applied to a later one (which starts from its own file).

A replica applies the app's publication once as it starts, before it serves (so a restarted
replica never serves keys a reload removed), then reads it once a second and applies a newer
revision in place, and acknowledges what it runs under its replica id, so the reload can say
when every replica runs it.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from core.config import ClusterConfig

logger = logging.getLogger("ray.serve")

KV_NAMESPACE = "gps_live_config"
POLL_S = 1.0
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"  # Serve names a replica's actor by its full id


# Where a backend a reload started runs: its Serve app and deployment (cluster/model_apps.py).
Homes = Mapping[str, tuple[str, str]]
Apply = Callable[[ClusterConfig, Homes], None]


@dataclass(frozen=True)
class Publication:
    """A reload as published, for the replicas of one build of the app: the config, and the
    Serve app of each backend a reload started (the others are the build's own)."""

    revision: int
    build: str
    config: dict[str, Any]
    homes: dict[str, tuple[str, str]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> Publication:
        fields = json.loads(data)
        homes = {name: (str(app), str(dep)) for name, (app, dep) in fields.get("homes", {}).items()}
        return cls(int(fields["revision"]), str(fields["build"]), dict(fields["config"]), homes)


def config_key(app: str) -> bytes:
    return f"config/{app}".encode()


def ack_prefix(app: str) -> bytes:
    return f"ack/{app}/".encode()


def ack_key(app: str, replica: str) -> bytes:
    return ack_prefix(app) + replica.encode()


class LiveConfigSync:
    """Applies newer revisions of its build's published config in this replica, and acks them.

    Its ports: `read` (the publication, or None), `apply`, `ack`, and `orphaned`: engines an
    earlier build's reloads started (its publication's homes), which nothing routes to now."""

    def __init__(
        self,
        build: str,
        read: Callable[[], Publication | None],
        apply: Apply,
        ack: Callable[[int], None],
        poll_s: float = POLL_S,
        orphaned: Callable[[Homes], None] = lambda _homes: None,
    ) -> None:
        self._build = build
        self._read = read
        self._apply = apply
        self._ack = ack
        self._orphaned = orphaned
        self._poll_s = poll_s
        self.revision = 0  # the config it was built with; published revisions start at 1
        self._seen = 0  # the newest revision looked at, applied or not
        self._acked = 0
        self._failing = False
        self.task: asyncio.Task[None] | None = None  # held by its starter: tasks are weakly held

    def first(self) -> None:
        """The publication applied before the replica serves (a blocking GCS read, once)."""
        try:
            self._consider(self._read())
        except Exception as error:  # noqa: BLE001 - the loop reads it again
            logger.error("live config not readable at start, serving the file's: %r", error)

    async def run(self) -> None:
        while True:
            try:
                await self.sync_once()
                if self._failing:
                    logger.warning("live config readable again (revision %d)", self.revision)
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - the config it has stays; read again
                if isinstance(error, RuntimeError) and "after shutdown" in str(error):
                    return  # the replica is stopping: its loop's thread pool is gone
                if not self._failing:
                    logger.error("live config not readable, this replica keeps its own: %r", error)
                self._failing = True
            await asyncio.sleep(self._poll_s)

    async def sync_once(self) -> None:
        """Read the publication (off the loop: a GCS call), apply it if newer and for this
        build, and acknowledge what it runs."""
        self._consider(await asyncio.to_thread(self._read))
        if self.revision > self._acked:
            await asyncio.to_thread(self._ack, self.revision)
            self._acked = self.revision

    def _consider(self, publication: Publication | None) -> None:
        if publication is None or publication.revision <= self._seen:
            return
        self._seen = publication.revision  # applied or not, it is not tried again
        if publication.build != self._build:
            # Published for an earlier build of the app (a new `serve run` replaced it): the
            # engines its reloads started outlived it, and serve nobody.
            if publication.homes:
                self._orphaned(publication.homes)
            return
        try:
            config = ClusterConfig.model_validate(publication.config)
            self._apply(config, publication.homes)
        except Exception:  # a bug, not a client's mistake: the reload validated it
            logger.exception("live config revision %d not applied", publication.revision)
            return
        self.revision = publication.revision
        logger.info("live config revision %d applied", publication.revision)


def read_publication(app: str) -> Publication | None:
    from ray.experimental.internal_kv import _internal_kv_get

    data = _internal_kv_get(config_key(app), namespace=KV_NAMESPACE)
    return None if data is None else Publication.decode(data)


def publish(app: str, publication: Publication) -> None:
    """Publish a revision for `app`, its replicas' earlier acks cleared first."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    _internal_kv_del(ack_prefix(app), del_by_prefix=True, namespace=KV_NAMESPACE)
    _internal_kv_put(config_key(app), publication.encode(), overwrite=True, namespace=KV_NAMESPACE)


def acked(app: str, revision: int) -> set[str]:
    """The ids of the replicas that acknowledged `revision` (or a later one)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    prefix = ack_prefix(app)
    replicas = set()
    for key in _internal_kv_list(prefix, namespace=KV_NAMESPACE):
        value = _internal_kv_get(key, namespace=KV_NAMESPACE)
        if value is not None and int(value) >= revision:
            replicas.add(key[len(prefix) :].decode())
    return replicas


def replica_ids(app: str, deployments: tuple[str, ...]) -> set[str]:
    """The ids of the app's replicas of `deployments` alive now (starting or running)."""
    import ray

    prefixes = tuple(f"{REPLICA_ACTOR_PREFIX}{app}#{name}#" for name in deployments)
    ids = set()
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = str(actor["name"])
        if name.startswith(prefixes):
            ids.add(name.rsplit("#", 1)[1])
    return ids


def delete_apps(names: Iterable[str]) -> None:
    """Delete Serve apps (engines a reload started); Serve drains their replicas meanwhile.
    Each replica of a new build may ask: one already gone is not an error."""
    from ray import serve

    for name in names:
        try:
            serve.delete(name, _blocking=False)
        except Exception as error:  # noqa: BLE001 - gone already, or the controller busy
            logger.info("deleting app %s: %r", name, error)


def serve_live_config(build: str, apply: Apply) -> LiveConfigSync | None:
    """This Serve replica's sync (the composition root's adapter), its publication applied
    now; None outside a Serve replica's event loop (a test building the class)."""
    from ray import serve
    from ray.experimental.internal_kv import _internal_kv_put
    from ray.serve.exceptions import RayServeException

    try:
        loop = asyncio.get_running_loop()
        context = serve.get_replica_context()
    except (RuntimeError, RayServeException):
        return None
    app, replica = context.app_name, context.replica_id.unique_id

    def ack(revision: int) -> None:
        _internal_kv_put(
            ack_key(app, replica), str(revision).encode(), overwrite=True, namespace=KV_NAMESPACE
        )

    def orphaned(homes: Homes) -> None:
        engine_apps = sorted({home_app for home_app, _ in homes.values()})
        logger.warning("deleting the engines an earlier build's reloads started: %s", engine_apps)
        delete_apps(engine_apps)

    sync = LiveConfigSync(build, lambda: read_publication(app), apply, ack, orphaned=orphaned)
    sync.first()
    # A fresh context: a task copies the current one, and Serve would tie it to a request.
    sync.task = loop.create_task(sync.run(), context=contextvars.Context())
    return sync
