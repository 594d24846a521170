"""`make reload`: what a new config may change in place (core/config/reload.py), how the router
and the ingress take it (caps, chains, settings, keys, limits), how a replica follows the
published revisions (deployments/live_config.py), and the command's decisions
(cluster/reload.py). Serve and the GCS are fakes here; tests/monitoring runs it on a real app."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from cluster.reload import ReloadRefused, Running, reload
from core.config import ApiKeyConfig, ClusterConfig, hash_key, load_config, parse_config
from core.config.reload import ReloadChanges, reload_changes
from core.errors import ApiError
from core.types import PriorityClass
from core.wire import PlacementView, Refusal
from deployments.ingress.app import Ingress
from deployments.ingress.auth import KeyRing
from deployments.keys.ledger import KeyLedger, LocalLedger, MemorySnapshots
from deployments.live_config import LiveConfigSync, Publication
from tests.fakes import serve_handle
from tests.fakes.http_request import keyed_request
from tests.unit.test_router_flow import (
    FakeBackend,
    collect,
    dead,
    job,
    make_config,
    make_router,
    ok,
    two,
)

TESTS = Path(__file__).parents[1]


def changed(config: ClusterConfig, **sections: Any) -> ClusterConfig:
    """`config` with some sections replaced, validated again as a loaded file is."""
    raw = config.model_dump(mode="json")
    raw.update(sections)
    return parse_config(raw, base_dir=config.base_dir, environ={})


def with_router(config: ClusterConfig, **fields: Any) -> ClusterConfig:
    return changed(config, router={**config.router.model_dump(mode="json"), **fields})


def with_model(config: ClusterConfig, name: str, **fields: Any) -> ClusterConfig:
    models = [
        {**m.model_dump(mode="json"), **(fields if m.name == name else {})} for m in config.models
    ]
    return changed(config, models=models)


# -- What may change in place ---------------------------------------------------------------


def test_caps_chains_and_router_settings_change_in_place() -> None:
    old = make_config(cap=2)
    new = with_model(with_router(old, max_queue=3, breaker_failures=5), "coding", max_concurrency=6)
    new = changed(new, chains={"coding": ["orchestrator@local", "cpu-fallback"]})
    changes = reload_changes(old, new)
    assert changes.live == (
        "chains",
        "models[coding].max_concurrency",
        "router.breaker_failures",
        "router.max_queue",
    )
    assert changes.fixed == ()
    assert changes.applies


def test_what_a_deployment_was_built_with_refuses_the_reload_and_names_each_field() -> None:
    old = make_config()
    new = with_model(old, "coding", context_window=2048, max_concurrency=9)
    new = with_router(new, replica_health_check_period_s=7, max_queue=1)
    new = changed(new, gateway={**old.gateway.model_dump(mode="json"), "ingress_replicas": 2})
    changes = reload_changes(old, new)
    assert changes.fixed == (
        "gateway.ingress_replicas",
        "models[coding].context_window",
        "router.replica_health_check_period_s",
    )
    assert "router.max_queue" in changes.live
    assert not changes.applies


def test_a_model_added_or_removed_and_auth_turned_on_are_not_reloads() -> None:
    old = make_config()
    fewer = changed(
        old,
        models=[old.models[0].model_dump(mode="json")],
        chains={},
    )
    assert "models (added, removed or reordered)" in reload_changes(old, fewer).fixed
    keyed = changed(old, api_keys=[{"name": "a", "sha256": hash_key("secret-a")}])
    assert "api_keys (authentication on/off)" in reload_changes(old, keyed).fixed


def test_a_path_is_compared_by_where_it_points(tmp_path: Path) -> None:
    old = make_config()
    # The same file in another folder: its relative state folders and fallback move.
    moved = old.model_copy(update={"base_dir": tmp_path})
    assert reload_changes(old, moved).fixed == ("batches", "fallback", "gateway.keys_db")
    # There, with each path made absolute: the same config.
    raw = old.model_dump(mode="json")
    raw["fallback"]["source"] = old.fallback_source
    raw["gateway"]["keys_db"] = str(old.keys_db)
    raw["batches"]["directory"] = str(old.batch_directory)
    same = parse_config(raw, base_dir=tmp_path, environ={})
    assert reload_changes(old, same) == ReloadChanges((), ())


# -- The router takes caps, chains and settings in place ------------------------------------


def test_a_raised_cap_admits_the_jobs_waiting_for_a_slot() -> None:
    coding = FakeBackend(ok, step_s=0.05)
    config = make_config(cap=1, max_queue=8)
    router = make_router(config, two(coding, FakeBackend(ok)))

    async def scenario() -> None:
        jobs = [asyncio.create_task(collect(router, job())) for _ in range(4)]
        await asyncio.sleep(0.01)  # one runs, three wait for the one slot
        router.apply_config(with_model(config, "coding", max_concurrency=4))
        await asyncio.gather(*jobs)

    asyncio.run(scenario())
    assert coding.max_running == 4


def test_a_new_chain_and_breaker_setting_hold_from_the_next_job() -> None:
    coding = FakeBackend(dead)
    config = make_config()
    router = make_router(config, two(coding, FakeBackend(ok)))

    async def served() -> Any:
        return (await collect(router, job()))[0]

    assert asyncio.run(served()).backend == "orchestrator@local"  # coding's chain goes on there
    shorter = changed(config, chains={"coding": ["coding@local", "cpu-fallback"]})
    router.apply_config(with_router(shorter, breaker_failures=2))
    refused = asyncio.run(served())
    assert isinstance(refused, Refusal)
    assert refused.status == 503
    assert coding.calls == 2
    assert asyncio.run(served()).status == 503
    assert coding.calls == 2  # the second fault opened the breaker (the old setting: third)


class RestartedPlacer:
    """A placement actor Ray restarted: it waits for `start` and records the config."""

    def __init__(self) -> None:
        self.started_with: list[ClusterConfig] = []

    async def sync(self, version: int, held: Mapping[str, int]) -> PlacementView | None:
        return None

    async def start(self, config: ClusterConfig) -> None:
        self.started_with.append(config)


def test_a_restarted_placement_actor_is_started_with_the_built_config_not_a_reload() -> None:
    built = make_config(cap=2)
    placer = RestartedPlacer()
    router = make_router(built, two(FakeBackend(ok), FakeBackend(ok)), placement=placer)  # type: ignore[arg-type]
    router.apply_config(with_router(built, max_queue=1))
    asyncio.run(router._placement._sync_once(placer))
    assert placer.started_with == [built]


# -- The ingress takes keys, limits and request limits ---------------------------------------

ADMIN, PLAIN, OTHER = "reload-admin-key", "reload-plain-key", "reload-other-key"
CHAT = {"model": "orchestrator", "messages": [{"role": "user", "content": "hi"}]}


def keyed(*keys: ApiKeyConfig) -> ClusterConfig:
    base = load_config(TESTS / "e2e" / "gateway.yaml", environ={})
    return base.model_copy(update={"api_keys": keys})


async def chat_status(ingress: Ingress, key: str, body: dict[str, Any] = CHAT) -> int:
    try:
        response = await ingress.chat(keyed_request(key, "POST", "/v1/chat/completions", body))
    except ApiError as error:
        return error.status
    return response.status_code


def test_the_ingress_takes_new_keys_limits_and_request_limits_in_place() -> None:
    admin = ApiKeyConfig(name="ops", sha256=hash_key(ADMIN), admin=True)
    plain = ApiKeyConfig(name="plain", sha256=hash_key(PLAIN))
    old = keyed(admin, plain)
    other = ApiKeyConfig(name="other", sha256=hash_key(OTHER))
    limited = plain.model_copy(update={"rpm": 1})
    new = keyed(admin, limited, other)
    new = changed(new, gateway={**new.gateway.model_dump(mode="json"), "max_messages": 1})
    ledger = LocalLedger(KeyLedger("unit", store=MemorySnapshots()))

    async def scenario() -> dict[str, Any]:
        ingress = Ingress(old, serve_handle.EngineLikeRouter(), lambda: ledger)
        two = {**CHAT, "messages": [CHAT["messages"][0]] * 2}
        seen: dict[str, Any] = {
            "other_before": await chat_status(ingress, OTHER),
            "two_before": await chat_status(ingress, ADMIN, two),
        }
        ingress.apply_config(new)
        seen["other_after"] = await chat_status(ingress, OTHER)
        seen["plain"] = [await chat_status(ingress, PLAIN) for _ in range(2)]
        seen["two_messages"] = await chat_status(ingress, ADMIN, two)
        seen["running"] = (await ingress.live_config())["config"]["gateway"]["max_messages"]
        return seen

    seen = asyncio.run(scenario())
    assert seen == {
        "other_before": 401,
        "other_after": 200,
        "two_before": 200,
        "plain": [200, 429],
        "two_messages": 400,
        "running": 1,
    }


def test_the_run_time_keys_stay_when_the_config_keys_change() -> None:
    ring = KeyRing([ApiKeyConfig(name="a", sha256=hash_key("key-a"))], PriorityClass.USER)
    ring.use_run_time([ApiKeyConfig(name="made", sha256=hash_key("key-made"))])
    ring.use_config([ApiKeyConfig(name="b", sha256=hash_key("key-b"))], PriorityClass.USER)
    assert ring.authenticate("Bearer key-made").name == "made"
    assert ring.authenticate("Bearer key-b").name == "b"
    with pytest.raises(ApiError) as refused:
        ring.authenticate("Bearer key-a")
    assert refused.value.status == 401


# -- A replica follows the published revisions -----------------------------------------------

BUILD = "build-1"


class Published:
    """The GCS's copy, and what the replica applied and acked."""

    def __init__(self) -> None:
        self.publication: Publication | None = None
        self.applied: list[ClusterConfig] = []
        self.acks: list[int] = []
        self.broken = False

    def apply(self, config: ClusterConfig) -> None:
        if self.broken:
            raise KeyError("a bug of ours")
        self.applied.append(config)

    def sync(self) -> LiveConfigSync:
        return LiveConfigSync(BUILD, lambda: self.publication, self.apply, self.acks.append)


def test_a_replica_applies_each_newer_revision_once_and_acks_it() -> None:
    gcs, config = Published(), make_config(cap=3)
    sync = gcs.sync()

    async def rounds() -> None:
        await sync.sync_once()  # nothing published: the config it was built with
        gcs.publication = Publication(1, BUILD, config.model_dump(mode="json"))
        await sync.sync_once()
        await sync.sync_once()  # the same revision again: nothing to do

    asyncio.run(rounds())
    assert [c.model_dump() for c in gcs.applied] == [config.model_dump()]
    assert (sync.revision, gcs.acks) == (1, [1])


def test_a_starting_replica_applies_the_last_revision_before_it_serves() -> None:
    gcs = Published()
    gcs.publication = Publication(3, BUILD, make_config(cap=5).model_dump(mode="json"))
    sync = gcs.sync()
    sync.first()  # in the replica's constructor: no loop round needed
    assert (len(gcs.applied), sync.revision, gcs.acks) == (1, 3, [])
    asyncio.run(sync.sync_once())  # its loop's first round acknowledges it
    assert (len(gcs.applied), gcs.acks) == (1, [3])


def test_a_revision_for_another_build_of_the_app_is_not_applied() -> None:
    gcs = Published()
    gcs.publication = Publication(4, "build-0", make_config().model_dump(mode="json"))
    sync = gcs.sync()
    asyncio.run(sync.sync_once())
    assert (gcs.applied, gcs.acks, sync.revision) == ([], [], 0)


def test_a_revision_that_fails_to_apply_is_logged_not_acked_and_not_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gcs = Published()
    gcs.broken = True
    gcs.publication = Publication(1, BUILD, make_config().model_dump(mode="json"))
    sync = gcs.sync()
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        asyncio.run(sync.sync_once())
        asyncio.run(sync.sync_once())
    assert (gcs.applied, gcs.acks, sync.revision) == ([], [], 0)
    assert caplog.text.count("live config revision 1 not applied") == 1
    gcs.broken = False
    gcs.publication = Publication(2, BUILD, {"pools": []})  # not a config: refused the same way
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        asyncio.run(sync.sync_once())
    assert (gcs.applied, sync.revision) == ([], 0)
    assert "live config revision 2 not applied" in caplog.text


# -- The command ------------------------------------------------------------------------------


class FakeApp:
    """A running app: an ingress at `revision` running `config`; its replicas ack a
    publication after `ack_after` polls; `replaced` replicas die and start after the first."""

    def __init__(self, config: ClusterConfig, revision: int = 0, replicas: int = 2) -> None:
        self.current = Running(revision, BUILD, config)
        self.kv_revision = revision
        self.alive = {f"r{i}" for i in range(replicas)}
        self.published: list[Publication] = []
        self.polls = 0
        self.ack_after = 2
        self.acks: set[str] = set()

    def running(self) -> Running:
        return self.current

    def published_revision(self) -> int:
        return self.kv_revision

    def publish(self, publication: Publication) -> None:
        self.published.append(publication)

    def replicas(self) -> set[str]:
        return set(self.alive)

    def acked(self, revision: int) -> set[str]:
        self.polls += 1
        if self.polls > self.ack_after:
            self.acks |= self.alive
        return set(self.acks)


def no_wait() -> tuple[Callable[[], float], Callable[[float], None]]:
    now = [0.0]
    return (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))


def test_the_command_publishes_the_next_revision_and_waits_for_every_replica() -> None:
    old = make_config(cap=2)
    app = FakeApp(old, revision=3)
    app.kv_revision = 5  # a later reload some replica has not read yet
    clock, sleep = no_wait()
    outcome = reload(with_router(old, max_queue=2), app, wait_s=10, clock=clock, sleep=sleep)
    assert outcome is not None
    assert (outcome.revision, outcome.live, outcome.complete) == (6, ("router.max_queue",), True)
    [publication] = app.published
    assert (publication.revision, publication.build) == (6, BUILD)
    assert publication.config["router"]["max_queue"] == 2


def test_the_command_says_which_replicas_did_not_ack_in_time() -> None:
    app = FakeApp(make_config(), replicas=3)
    app.ack_after = 10**6
    clock, sleep = no_wait()
    outcome = reload(
        with_router(make_config(), max_queue=2), app, wait_s=1, clock=clock, sleep=sleep
    )
    assert outcome is not None
    assert (outcome.acked, outcome.replicas, outcome.complete) == (0, 3, False)


def test_a_replica_that_died_after_its_ack_does_not_count_and_its_replacement_must() -> None:
    app = FakeApp(make_config(), replicas=2)
    app.ack_after = 1  # the replicas alive at the second poll ack
    app.acks = {"r0", "gone"}  # at the first, "gone" has acked and died, r1 has not acked

    def replace_r1(seconds: float) -> None:
        app.alive = {"r0", "r1-new"}

    clock, _ = no_wait()
    outcome = reload(with_router(make_config(), max_queue=2), app, clock=clock, sleep=replace_r1)
    assert outcome is not None
    assert (outcome.acked, outcome.replicas) == (2, 2)
    assert app.polls == 2  # not done at the first poll, though two acks were there


def test_the_command_names_the_keys_a_reload_adds_and_removes() -> None:
    old = make_config()
    keys = [{"name": "new-bot", "sha256": hash_key("new-bot-key")}]
    app = FakeApp(
        old.model_copy(update={"api_keys": (ApiKeyConfig(name="old-bot", sha256=hash_key("k")),)})
    )
    clock, sleep = no_wait()
    outcome = reload(changed(old, api_keys=keys), app, clock=clock, sleep=sleep)
    assert outcome is not None
    assert (outcome.keys_added, outcome.keys_removed) == (("new-bot",), ("old-bot",))


def test_a_refused_or_empty_reload_publishes_nothing() -> None:
    old = make_config()
    app = FakeApp(old)
    with pytest.raises(ReloadRefused, match=r"models\[coding\].context_window"):
        reload(with_model(old, "coding", context_window=2048), app)
    assert reload(old.model_copy(), app) is None
    assert app.published == []
