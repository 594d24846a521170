"""`make reload`: what a new config may change in place (core/config/reload.py), how the router
and the ingress take it (caps, chains, settings, keys, limits), how a replica follows the
published revisions (deployments/live_config.py), and the command's decisions
(cluster/reload.py). Serve and the GCS are fakes here; tests/monitoring runs it on a real app."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from cluster.backends import build_fallback
from cluster.model_apps import EngineStartFailed, engine_app
from cluster.reload import (
    ROUTING_DEPLOYMENTS,
    SYNCED_DEPLOYMENTS,
    ReloadRefused,
    Running,
    reload,
)
from core.config import ApiKeyConfig, ClusterConfig, hash_key, load_config, parse_config
from core.config.reload import ReloadChanges, reload_changes
from core.errors import ApiError
from core.topology import Backend
from core.types import PriorityClass
from core.wire import PlacementView, Refusal
from deployments.ingress.app import Ingress
from deployments.ingress.auth import KeyRing
from deployments.keys.ledger import KeyLedger, LocalLedger, MemorySnapshots
from deployments.live_config import LiveConfigSync, Publication
from deployments.router.loops import watch
from tests.fakes import serve_handle
from tests.fakes.clock import FakeClock
from tests.fakes.http_request import keyed_request
from tests.fakes.router_harness import (
    FakeBackend,
    FakeDeployments,
    Rounds,
    breaker_opened,
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


def test_the_classes_shares_aging_and_engine_numbers_change_in_place() -> None:
    old = make_config()
    shares = {"user": 1.0, "agent": 0.5, "background": 0.25}
    numbers = {"user": 0, "agent": 2, "background": 4}
    new = with_router(old, aging_s=3.0, class_shares=shares, engine_priorities=numbers)
    changes = reload_changes(old, new)
    assert changes.live == (
        "router.aging_s",  # the routers' queues and the fallback's line (its turns) both
        "router.class_shares",
        "router.engine_priorities",
    )
    assert changes.fixed == ()


def test_what_a_deployment_was_built_with_refuses_the_reload_and_names_each_field() -> None:
    old = make_config()
    new = with_router(old, replica_health_check_period_s=7, max_queue=1)
    new = changed(new, gateway={**old.gateway.model_dump(mode="json"), "ingress_replicas": 2})
    new = changed(new, fallback={**old.fallback.model_dump(mode="json"), "threads": 3})
    changes = reload_changes(old, new)
    assert changes.fixed == (
        "fallback",
        "gateway.ingress_replicas",
        "router.replica_health_check_period_s",
    )
    assert "router.max_queue" in changes.live
    assert not changes.applies


def test_a_model_added_removed_or_changed_is_a_reload_of_its_engines() -> None:
    old = make_config()
    added = {**old.models[1].model_dump(mode="json"), "name": "coder-2", "role": None}
    new = changed(old, models=[old.models[1].model_dump(mode="json"), added], chains={})
    new = with_model(new, "coding", context_window=2048, aliases=["coder"])
    changes = reload_changes(old, new)
    assert changes.fixed == ()
    assert (changes.added, changes.removed, changes.replaced) == (
        ("coder-2",), ("orchestrator",), ("coding",)
    )  # fmt: skip
    assert changes.live == (
        "chains",
        "models[coder-2] (added)",
        "models[orchestrator] (removed)",
        "models[coding].aliases",
        "models[coding].context_window (engine replaced)",
    )
    # Names alone change no engine.
    renamed = reload_changes(old, with_model(old, "coding", aliases=["coder"], default=True))
    assert (renamed.replaced, renamed.fixed) == ((), ())
    swapped = changed(old, models=[m.model_dump(mode="json") for m in reversed(old.models)])
    assert reload_changes(old, swapped).live == ("models (order: the roles' default models)",)


def test_a_model_placement_moves_or_load_sizes_is_not_started_or_stopped_by_a_reload() -> None:
    two_pools = [{"name": "local", "kind": "local"}, {"name": "mesh", "kind": "mesh"}]
    old = changed(make_config(), pools=two_pools)
    roaming = {**old.models[1].model_dump(mode="json"), "name": "roamer", "role": None,
               "pools": ["local", "mesh"]}  # fmt: skip
    grown = changed(old, models=[*(m.model_dump(mode="json") for m in old.models), roaming])
    assert reload_changes(old, grown).fixed == (
        "models[roamer] (added: a reload starts a model on one pool, without autoscaling)",
    )
    assert reload_changes(grown, old).fixed == (
        "models[roamer] (removed: placement moves it between pools)",
    )
    assert reload_changes(grown, with_model(grown, "roamer", context_window=2048)).fixed == (
        "models[roamer].context_window",
    )


def test_auth_turned_on_is_not_a_reload() -> None:
    old = make_config()
    keyed = changed(old, api_keys=[{"name": "a", "sha256": hash_key("secret-a")}])
    assert "api_keys (authentication on/off)" in reload_changes(old, keyed).fixed


def test_a_path_is_compared_by_where_it_points(tmp_path: Path) -> None:
    old = make_config()
    # The same file in another folder: its relative state folders and fallback move.
    moved = old.model_copy(update={"base_dir": tmp_path})
    assert reload_changes(old, moved).fixed == (
        "batches",
        "fallback",
        "gateway.keys_db",
        "gateway.responses_db",
    )
    # There, with each path made absolute: the same config.
    raw = old.model_dump(mode="json")
    raw["fallback"]["source"] = old.fallback_source
    raw["gateway"]["keys_db"] = str(old.keys_db)
    raw["gateway"]["responses_db"] = str(old.responses_db)
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


def test_a_new_aging_period_orders_the_routers_queues_from_now() -> None:
    config = make_config()
    router = make_router(config, two(FakeBackend(ok), FakeBackend(ok)))
    router.apply_config(with_router(config, aging_s=3.0))
    assert {link.gate.queue.aging_s for link in router._links.values()} == {3.0}


class Engines:
    """The engines reloads started, by (app, deployment), as the router's `connect` port."""

    def __init__(self) -> None:
        self.started: dict[tuple[str, str], FakeBackend] = {}

    def connect(self, home: tuple[str, str], adapters: frozenset[str]) -> FakeBackend:
        backend = self.started[home]
        backend.deployment = home
        return backend


def test_a_link_a_reload_replaced_is_checked_at_once_not_after_its_old_links_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old coding engine's probe hangs (a stuck replica); a reload turns coding to a new
    engine, which has no replica yet: the health loop's next rounds check the new link, not
    wait behind the old one's probe."""
    monkeypatch.setattr(watch, "HEALTH_PROBE_TIMEOUT_S", 3600.0)  # longer than the test
    coding, orchestrator, new_coding = FakeBackend(ok), FakeBackend(ok), FakeBackend(ok)
    config = make_config(router={"breaker_cooldown_s": 1e9})  # no breaker half-opens meanwhile
    engines, deployments = Engines(), FakeDeployments()
    clock = FakeClock(advance=True)
    router = make_router(
        config, two(coding, orchestrator), watch=True, deployments=deployments, clock=clock,
        connect=engines.connect,
    )  # fmt: skip
    home = ("gateway--coding@local--r1", "model:coding@local")
    engines.started = {home: new_coding}
    deployments.set(coding, running=0)

    async def probed() -> bool:
        return coding.probes > 0

    async def scenario() -> None:
        rounds = Rounds(clock)
        async with asyncio.timeout(30):
            await rounds.until(lambda: breaker_opened(router, "coding@local"))
            deployments.set(coding, running=1)  # back, but stuck: its probe never answers
            coding.probe_hangs = True
            await rounds.until(probed)
            router.apply_config(with_model(config, "coding", context_window=2048), {
                "coding@local": home, "orchestrator@local": ("gateway", "orchestrator@local"),
            })  # fmt: skip
            deployments.set(new_coding, running=0)  # its replica still loading
            await rounds.until(lambda: breaker_opened(router, "coding@local"))  # the new link's

    asyncio.run(scenario())
    assert coding.probes == 1


def test_the_router_turns_to_new_engines_and_lets_jobs_on_the_old_ones_finish() -> None:
    slow_coding, orchestrator = FakeBackend(ok, step_s=0.05), FakeBackend(ok)
    config = make_config()
    engines = Engines()
    router = make_router(config, two(slow_coding, orchestrator), connect=engines.connect)
    new_coding, coder_2 = FakeBackend(ok), FakeBackend(ok)
    engines.started = {
        ("gateway--coding@local--r1", "model:coding@local"): new_coding,
        ("gateway--coder-2@local--r1", "model:coder-2@local"): coder_2,
    }
    added = {**config.models[1].model_dump(mode="json"), "name": "coder-2", "role": None}
    new = changed(config, models=[config.models[1].model_dump(mode="json"), added], chains={})
    new = with_model(new, "coding", context_window=2048)
    homes = {name: home for home, name in (
        (("gateway--coding@local--r1", "model:coding@local"), "coding@local"),
        (("gateway--coder-2@local--r1", "model:coder-2@local"), "coder-2@local"),
    )}  # fmt: skip

    async def scenario() -> list[Any]:
        under_way = asyncio.create_task(collect(router, job()))  # on the old coding engine
        await asyncio.sleep(0.01)
        router.apply_config(new, homes)
        after = await collect(router, job())
        await collect(router, dataclasses.replace(job(), model="coder-2"))
        return [await under_way, after]

    before, after = asyncio.run(scenario())
    assert before[-1] == ["data: [DONE]\n\n"]  # the job under way ended on the old engine
    assert after[-1] == ["data: [DONE]\n\n"]
    assert (slow_coding.calls, new_coding.calls, coder_2.calls) == (1, 1, 1)
    status = asyncio.run(router.status())
    assert sorted(status["backends"]) == ["coder-2@local", "coding@local"]
    placed = [
        line
        for line in asyncio.run(router.metrics_text()).decode().splitlines()
        if line.startswith("gps_model_pool{")
    ]
    assert 'gps_model_pool{model="coder-2",pool="local"} 1.0' in placed
    assert not [line for line in placed if 'model="orchestrator"' in line]


def test_a_job_under_way_never_fails_over_to_a_link_a_reload_removed() -> None:
    coding, orchestrator = FakeBackend(dead, step_s=0.05), FakeBackend(ok)
    config = make_config()
    router = make_router(config, two(coding, orchestrator))
    fewer = changed(config, models=[config.models[1].model_dump(mode="json")], chains={})

    async def scenario() -> list[Any]:
        under_way = asyncio.create_task(collect(router, job()))  # its chain: coding, orchestrator
        await asyncio.sleep(0.01)
        router.apply_config(fewer)  # orchestrator removed while coding fails the job
        return await under_way

    [refusal] = asyncio.run(scenario())
    assert isinstance(refusal, Refusal)
    assert refusal.status == 503
    assert (coding.calls, orchestrator.calls) == (1, 0)


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

    def apply(self, config: ClusterConfig, homes: Mapping[str, tuple[str, str]]) -> None:
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


def test_engines_an_earlier_build_started_are_given_up_by_the_next_build_once() -> None:
    gcs, orphans = Published(), list[Mapping[str, tuple[str, str]]]()
    homes = {"coder-2@local": ("gateway--coder-2@local--r4", "model:coder-2@local")}
    gcs.publication = Publication(4, "an-earlier-build", {}, homes)
    sync = LiveConfigSync(
        BUILD, lambda: gcs.publication, gcs.apply, gcs.acks.append, orphaned=orphans.append
    )
    sync.first()
    asyncio.run(sync.sync_once())
    assert (orphans, gcs.applied, sync.revision) == ([homes], [], 0)
    # Its own build's engines are its own.
    gcs.publication = Publication(5, BUILD, make_config().model_dump(mode="json"), homes)
    asyncio.run(sync.sync_once())
    assert (len(orphans), sync.revision) == (1, 5)


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

    name = "gateway"

    def __init__(self, config: ClusterConfig, revision: int = 0, replicas: int = 2) -> None:
        self.current = Running(revision, BUILD, config)
        self.earlier: dict[str, tuple[str, str]] = {}  # homes of backends earlier reloads started
        self.steps: list[str] = []  # starts, publications and retirements, in order
        self.start_fails = False
        self.retired: dict[str, tuple[str, str]] = {}
        self.kv_revision = revision
        self.alive = {f"r{i}" for i in range(replicas)}
        self.published: list[Publication] = []
        self.polls = 0
        self.ack_after = 2
        self.acks: set[str] = set()
        self.silent: set[str] = set()  # replicas that never ack

    def running(self) -> Running:
        return self.current

    def published_revision(self) -> int:
        return self.kv_revision

    def publish(self, publication: Publication) -> None:
        self.steps.append(f"publish {publication.revision}")
        self.published.append(publication)

    def homes(self) -> dict[str, tuple[str, str]]:
        return dict(self.earlier)

    def start(
        self, config: ClusterConfig, backends: list[Backend], revision: int
    ) -> dict[str, tuple[str, str]]:
        self.steps.extend(f"start {b.name}" for b in backends)
        if self.start_fails:
            raise EngineStartFailed("a new engine failed to start (out of memory)")
        return {
            b.name: (engine_app(self.name, b.name, revision), b.deployment_name) for b in backends
        }

    def retire(self, build: str, leaving: Mapping[str, tuple[str, str]]) -> None:
        assert build == BUILD
        self.steps.append(f"retire {sorted(leaving)}")
        self.retired |= leaving

    def replicas(self, deployments: tuple[str, ...] = SYNCED_DEPLOYMENTS) -> set[str]:
        # "f…": the CPU fallback's replicas, which route nothing.
        routing = deployments == ROUTING_DEPLOYMENTS
        return {r for r in self.alive if not (routing and r.startswith("f"))}

    def acked(self, revision: int) -> set[str]:
        self.polls += 1
        if self.polls > self.ack_after:
            self.acks |= self.alive - self.silent
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


def test_the_command_waits_for_the_fallbacks_replica_which_follows_the_apps_build() -> None:
    config = make_config()
    assert config.fallback_target.deployment_name in SYNCED_DEPLOYMENTS
    fallback = build_fallback(config, BUILD)._bound_deployment  # Serve's: no public accessor
    assert fallback.name == config.fallback_target.deployment_name
    assert fallback._replica_config.init_kwargs == {"build": BUILD}


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
    with pytest.raises(ReloadRefused, match=r"fallback"):
        reload(changed(old, fallback={**old.fallback.model_dump(mode="json"), "threads": 3}), app)
    assert reload(old.model_copy(), app) is None
    assert app.published == []


def coder_2(config: ClusterConfig) -> dict[str, Any]:
    return {**config.models[1].model_dump(mode="json"), "name": "coder-2", "role": None}


def test_new_engines_serve_before_the_routers_turn_to_them_and_old_ones_stop_after() -> None:
    old = make_config()
    app = FakeApp(old)
    app.earlier = {"gone@local": ("gateway--gone@local--r1", "model:gone@local")}  # not in `old`
    # coder-2 added, orchestrator removed, coding's engine changed; a cap changed too.
    new = changed(old, models=[old.models[1].model_dump(mode="json"), coder_2(old)], chains={})
    new = with_model(new, "coding", context_window=2048, max_concurrency=3)
    clock, sleep = no_wait()
    outcome = reload(new, app, wait_s=10, clock=clock, sleep=sleep)
    assert outcome is not None
    assert app.steps == [
        "start coding@local",
        "start coder-2@local",
        "publish 1",
        "retire ['coding@local', 'orchestrator@local']",
    ]
    [publication] = app.published
    assert publication.homes == {
        "coding@local": ("gateway--coding@local--r1", "model:coding@local"),
        "coder-2@local": ("gateway--coder-2@local--r1", "model:coder-2@local"),
        "gone@local": ("gateway--gone@local--r1", "model:gone@local"),
    }
    # Both leaving engines are the build's own: retired in the gateway's app.
    assert app.retired == {
        "coding@local": ("gateway", "model:coding@local"),
        "orchestrator@local": ("gateway", "model:orchestrator@local"),
    }
    assert (outcome.started, outcome.stopped) == (
        ("coder-2@local", "coding@local"), ("coding@local", "orchestrator@local")
    )  # fmt: skip


def test_an_engine_a_reload_started_is_stopped_in_its_own_app_by_a_later_one() -> None:
    old = make_config()
    first = changed(old, models=[*(m.model_dump(mode="json") for m in old.models), coder_2(old)])
    app = FakeApp(first, revision=1)
    app.earlier = {"coder-2@local": ("gateway--coder-2@local--r1", "model:coder-2@local")}
    clock, sleep = no_wait()
    outcome = reload(old, app, wait_s=10, clock=clock, sleep=sleep)
    assert outcome is not None
    assert outcome.stopped == ("coder-2@local",)
    assert app.retired == {"coder-2@local": ("gateway--coder-2@local--r1", "model:coder-2@local")}
    assert app.published[0].homes == {}


def test_an_engine_that_fails_to_start_refuses_the_reload_and_nothing_is_published() -> None:
    old = make_config()
    app = FakeApp(old)
    app.start_fails = True
    grown = changed(old, models=[*(m.model_dump(mode="json") for m in old.models), coder_2(old)])
    with pytest.raises(ReloadRefused, match=r"out of memory\); nothing was changed"):
        reload(grown, app)
    assert (app.published, app.retired) == ([], {})


def test_engines_are_not_stopped_while_some_replica_may_still_send_them_work() -> None:
    old = make_config()
    app = FakeApp(old)
    app.ack_after = 10**6
    fewer = changed(old, models=[old.models[1].model_dump(mode="json")], chains={})
    clock, sleep = no_wait()
    outcome = reload(fewer, app, wait_s=1, clock=clock, sleep=sleep)
    assert outcome is not None
    assert not outcome.complete
    assert (outcome.stopped, app.retired) == ((), {})


def test_a_fallback_that_cannot_ack_keeps_no_removed_engine_running() -> None:
    """The CPU fallback follows the reload too (its line's aging and shares), but sends no work
    to engines: one that cannot ack (its pool's node down) does not keep them running."""
    old = make_config()
    app = FakeApp(old)
    app.alive.add("fallback-1")
    app.silent = {"fallback-1"}
    fewer = changed(old, models=[old.models[1].model_dump(mode="json")], chains={})
    clock, sleep = no_wait()
    outcome = reload(fewer, app, wait_s=1, clock=clock, sleep=sleep)
    assert outcome is not None
    assert (outcome.replicas, outcome.acked, outcome.complete) == (3, 2, False)
    assert outcome.stopped == ("orchestrator@local",)
    assert set(app.retired) == {"orchestrator@local"}
