"""Load-driven autoscaling around the pure decision: the config, the Serve policy that combines
placement with load, the router's slots following the replicas, and the load it posts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autoscale import serve_scaling as replica_policy
from autoscale.serve_scaling import ReplicaPolicy, policy_kwargs
from cluster.backends import llm_config_for
from core.config import ConfigError, parse_config
from core.topology import Backend
from core.types import FALLBACK_BACKEND, Role
from core.wire import Refusal, Routed, ScalingNews
from deployments.router.adapters.ports import BackendLoad
from deployments.router.loops.load_sync import LoadSync
from deployments.router.metrics import REGISTRY
from deployments.router.request_path.link import build_links
from deployments.router.router import Router
from policy.load_scaling import LoadReport
from tests.fakes.clock import FakeClock
from tests.fakes.router_harness import (
    APP,
    FakeBackend,
    FakeDeployments,
    collect,
    job,
    make_router,
    ok,
    sample,
)

SCALING = {"min_replicas": 1, "max_replicas": 3, "upscale_delay_s": 0, "downscale_delay_s": 30}


def config_with(scaling: dict[str, Any] | None, replicas: int = 1, cap: int = 2) -> Any:
    raw: dict[str, Any] = {
        "pools": [{"name": "local", "kind": "local"}],
        "models": [
            {
                "role": role,
                "source": f"example/{role}",
                "context_window": 4096,
                "pools": ["local"],
                "max_concurrency": cap,
                "replicas": replicas,
                "autoscaling": scaling if role == "coding" else None,
            }
            for role in ("orchestrator", "coding")
        ],
        "fallback": {"source": "fallback.gguf"},
        "router": {"max_queue": 32, "queue_timeout_s": 5.0},
    }
    return parse_config(raw, base_dir=Path("."), environ={})


def test_autoscaling_bounds_and_the_starting_count_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"min_replicas \(3\) is above max_replicas \(2\)"):
        config_with({"min_replicas": 3, "max_replicas": 2})
    with pytest.raises(ConfigError, match=r"replicas \(4\) is the count a backend starts with"):
        config_with({"max_replicas": 3}, replicas=4)


def test_an_autoscaled_backend_is_built_with_the_policy_and_its_load_settings() -> None:
    config = config_with(SCALING, replicas=1, cap=4)
    options = llm_config_for(config, Backend(model="coding", pool="local")).deployment_config
    scaling = options["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["initial_replicas"]) == (
        1,
        3,
        1,
    )
    assert scaling["policy"]["policy_function"] is ReplicaPolicy
    load = scaling["policy"]["policy_kwargs"]["load"]
    assert load["per_replica_cap"] == 4
    assert load["max_replicas"] == 3
    # A model without autoscaling on one pool keeps its count, under the policy too (which a
    # reload's retirement takes to zero), with the build's token to know its retirement by.
    fixed = llm_config_for(
        config, Backend(model="orchestrator", pool="local"), build="b1"
    ).deployment_config
    held = fixed["autoscaling_config"]
    assert (held["min_replicas"], held["max_replicas"], held["initial_replicas"]) == (0, 1, 1)
    assert held["policy"]["policy_kwargs"] == {"build": "b1"}
    # Serve checks every engine replica often: the check is how it learns one died.
    for deployment in (options, fixed):
        assert deployment["health_check_period_s"] == config.router.replica_health_check_period_s


def ctx(target: int, now: float, running: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        app_name="gateway", deployment_name="model:coding@local", target_num_replicas=target,
        current_num_replicas=target if running is None else running, current_time=now,
    )  # fmt: skip


class Store:
    """Ray's internal KV as the policy reads and writes it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked: int | None = None
        self.reports: list[LoadReport] = []
        self.news: list[ScalingNews] = []
        self.retired: str | None = None  # the build whose deployment a reload retired
        monkeypatch.setattr(replica_policy, "asked_replicas", lambda app, dep: self.asked)
        monkeypatch.setattr(replica_policy, "retired_by", lambda app, dep: self.retired)
        monkeypatch.setattr(replica_policy, "read_load", lambda app, dep, now: list(self.reports))
        monkeypatch.setattr(
            replica_policy, "publish_scaled", lambda app, dep, news: self.news.append(news)
        )
        monkeypatch.setattr(
            replica_policy, "read_scaled", lambda app, dep: self.news[-1] if self.news else None
        )


def test_the_policy_follows_load_on_the_pool_placement_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = ReplicaPolicy(**policy_kwargs(config_with(SCALING).model_for(Role.CODING)))
    store.reports = [LoadReport(at=100, waiting=9, running=2)]
    # 9 waiting on 1 replica of 2 slots: 7 past the target of 2, 4 replicas' worth; max 3.
    assert policy(ctx(1, 100))[0] == 3
    assert [n.direction for n in store.news] == ["up"]
    # Placement moved the role away: zero, whatever the load.
    store.asked = 0
    assert policy(ctx(3, 102))[0] == 0
    # Placement brought it back with 1: that count first, load from then on.
    store.asked = 1
    assert policy(ctx(0, 104))[0] == 1
    store.reports = [LoadReport(at=105, waiting=0, running=0)]
    assert policy(ctx(1, 105))[0] == 1  # already at min_replicas


def test_a_retired_deployment_goes_to_zero_whatever_is_asked_and_only_for_its_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    config = config_with(SCALING)
    fixed = ReplicaPolicy(**policy_kwargs(config.model_for(Role.ORCHESTRATOR), build="b1"))
    scaled = ReplicaPolicy(**policy_kwargs(config.model_for(Role.CODING), build="b1"))
    assert (fixed(ctx(1, 100))[0], scaled(ctx(1, 100))[0]) == (1, 1)  # nothing asked: held
    store.retired = "b0"  # a deployment of the same name in an earlier build of the app
    assert (fixed(ctx(1, 102))[0], scaled(ctx(1, 102))[0]) == (1, 1)
    store.retired, store.asked = "b1", 1
    store.reports = [LoadReport(at=104, waiting=9, running=2)]
    assert (fixed(ctx(1, 104))[0], scaled(ctx(1, 104))[0]) == (0, 0)
    # Built without a token (a test's app, a benchmark's): never retired.
    plain = ReplicaPolicy(**policy_kwargs(config.model_for(Role.ORCHESTRATOR)))
    assert plain(ctx(1, 106))[0] == 1


def test_the_policy_steps_down_after_the_delay_and_holds_without_fresh_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = ReplicaPolicy(**policy_kwargs(config_with(SCALING).model_for(Role.CODING)))
    store.reports = [LoadReport(at=100, waiting=0, running=0)]
    assert policy(ctx(3, 100))[0] == 3
    store.reports = [LoadReport(at=130, waiting=0, running=0)]
    assert policy(ctx(3, 130))[0] == 2
    store.reports = []  # every router silent: the count holds
    assert policy(ctx(2, 500))[0] == 2


def test_without_autoscaling_the_policy_carries_out_placement_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = ReplicaPolicy()
    assert policy(ctx(2, 100))[0] == 2  # nothing asked: the count it has
    store.asked = 0
    assert policy(ctx(2, 102))[0] == 0


def autoscaled_router(deployments: FakeDeployments, coding: FakeBackend) -> Router:
    """coding@local autoscaled at 2 slots a replica, one replica running."""
    backends = {"coding@local": coding, "orchestrator@local": FakeBackend(ok)}
    return make_router(config_with(SCALING, cap=2), backends, deployments=deployments)


def test_an_autoscaled_backends_slots_follow_its_running_replicas() -> None:
    deployments, coding = FakeDeployments(), FakeBackend(ok, step_s=0.01)
    router = autoscaled_router(deployments, coding)

    async def six() -> None:
        await asyncio.gather(*(collect(router, job()) for _ in range(6)))

    # One event loop for the whole test, as in a replica: the router's asyncio objects (a
    # link's pool-lost event) belong to the loop that first waited on them.
    async def both() -> tuple[int, int]:
        await six()
        one = coding.max_running
        deployments.set(coding, running=3)
        await router.check_health_once()
        coding.max_running = 0
        await six()
        return one, coding.max_running

    assert asyncio.run(both()) == (2, 6)  # one replica: its 2 slots; three replicas of 2


class Board:
    def __init__(self) -> None:
        self.posts: list[Mapping[str, BackendLoad]] = []

    async def publish(self, load: Mapping[str, BackendLoad]) -> None:
        self.posts.append(dict(load))


def test_the_router_reports_the_load_of_autoscaled_backends() -> None:
    deployments, coding = FakeDeployments(), FakeBackend(ok, step_s=0.05)
    router = autoscaled_router(deployments, coding)
    deployment = router.config.targets["coding@local"].deployment_name

    async def busy() -> dict[str, BackendLoad]:
        jobs = [asyncio.ensure_future(collect(router, job())) for _ in range(5)]
        # Until all five are admitted or queued (each is fitted first, on a worker thread:
        # slow on a loaded machine), not a fixed wait.
        for _ in range(10_000):
            load = router.load()
            seen = load.get(deployment)
            if seen is not None and seen.running + seen.waiting == 5:
                break
            await asyncio.sleep(0.001)
        await asyncio.gather(*jobs)
        return load

    load = asyncio.run(busy())
    assert list(load) == [deployment]  # only the autoscaled backend
    assert (load[deployment].running, load[deployment].waiting) == (2, 3)


def test_the_policys_decisions_are_counted_once_each() -> None:
    config = config_with(SCALING)
    deployments, coding = FakeDeployments(), FakeBackend(ok)
    coding.deployment = (APP, "coding@local")
    deployments.set(coding, running=1)
    backends = {"coding@local": coding, "orchestrator@local": FakeBackend(ok)}
    links = build_links(config, backends, {}, FakeClock().monotonic)
    deployment = config.targets["coding@local"].deployment_name
    news: dict[str, ScalingNews] = {}
    sync = LoadSync(links, Board(), deployments, news.get, FakeClock())

    def decisions(direction: str) -> float:
        labels = {"backend": "coding@local", "direction": direction}
        return REGISTRY.get_sample_value("gps_autoscale_decisions_total", labels) or 0.0

    before = decisions("up")
    asyncio.run(sync.follow_news())  # no decision yet
    news[deployment] = ScalingNews(1, 2, "up", "up: 3 waiting")
    asyncio.run(sync.follow_news())
    asyncio.run(sync.follow_news())  # the same decision again is not counted twice
    assert decisions("up") == before + 1
    # A router that starts late finds an old decision: not news to count.
    late = LoadSync(links, Board(), deployments, news.get, FakeClock())
    asyncio.run(late.follow_news())
    assert decisions("up") == before + 1
    asyncio.run(sync.follow_replicas())
    replicas = REGISTRY.get_sample_value("gps_backend_replicas", {"backend": "coding@local"})
    assert replicas == 1


def test_no_step_up_while_asked_replicas_are_still_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    scaling = {**SCALING, "max_replicas": 10}
    policy = ReplicaPolicy(**policy_kwargs(config_with(scaling, cap=8).model_for(Role.CODING)))
    # 40 waiting on 1 replica of 8: 38 past the target of 2, five more replicas' worth.
    store.reports = [LoadReport(at=10, waiting=40, running=8)]
    assert policy(ctx(1, 10))[0] == 6
    # The same queue while the five start: not excess, no second step.
    store.reports = [LoadReport(at=12, waiting=40, running=8)]
    assert policy(ctx(6, 12, running=1))[0] == 6
    assert policy(ctx(6, 20, running=3))[0] == 6
    assert len(store.news) == 1


def test_a_backend_parked_from_the_start_stays_at_zero_before_placement_speaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = ReplicaPolicy(**policy_kwargs(config_with(SCALING).model_for(Role.CODING)))
    assert policy(ctx(0, 10))[0] == 0  # min_replicas is 1, but this pool is not the role's
    assert store.news == []


def test_a_failing_store_keeps_the_last_answer_instead_of_raising_in_the_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = ReplicaPolicy(**policy_kwargs(config_with(SCALING).model_for(Role.CODING)))
    store.reports = [LoadReport(at=10, waiting=9, running=2)]
    assert policy(ctx(1, 10))[0] == 3

    def broken(*_: object) -> None:
        raise ConnectionError("GCS unavailable")

    monkeypatch.setattr(replica_policy, "read_load", broken)
    monkeypatch.setattr(replica_policy, "asked_replicas", broken)
    monkeypatch.setattr(replica_policy, "publish_scaled", broken)
    store.reports = []
    assert policy(ctx(3, 12))[0] == 3  # the last reports, still fresh: nothing to change


def test_parked_backends_are_not_posted_so_placement_keeps_their_count() -> None:
    config = config_with(SCALING)
    backends = {"coding@local": FakeBackend(ok), "orchestrator@local": FakeBackend(ok)}
    deployments = FakeDeployments()
    no_news: dict[str, ScalingNews] = {}
    parked = build_links(config, backends, {Role.CODING: "coding@elsewhere"}, lambda: 0.0)
    assert LoadSync(parked, Board(), deployments, no_news.get, FakeClock()).load() == {}
    placed = build_links(config, backends, {Role.CODING: "coding@local"}, lambda: 0.0)
    assert list(LoadSync(placed, Board(), deployments, no_news.get, FakeClock()).load()) == [
        config.targets["coding@local"].deployment_name
    ]


SLEEPY = {**SCALING, "scale_to_zero_after_s": 60}


def asleep_policy(store: Store) -> ReplicaPolicy:
    """A policy that has put coding@local to sleep (placement asked 1; idle 60 s; the sleep
    announced, then carried out once the router held the backend asleep)."""
    store.asked = 1  # placement put the role on this pool
    policy = ReplicaPolicy(**policy_kwargs(config_with(SLEEPY).model_for(Role.CODING)))
    store.reports = [LoadReport(at=100, waiting=0, running=0)]
    assert policy(ctx(1, 100))[0] == 1
    store.reports = [LoadReport(at=160, waiting=0, running=0)]
    assert policy(ctx(1, 160))[0] == 1  # announced: the replica stays until the routers hear
    assert [n.direction for n in store.news] == ["sleep"]
    store.reports = [LoadReport(at=161, waiting=0, running=0, asleep=True)]
    assert policy(ctx(1, 161))[0] == 0
    assert [n.direction for n in store.news] == ["sleep"]  # the routers know already
    return policy


def test_an_idle_backend_sleeps_and_a_waiting_request_wakes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = asleep_policy(store)
    # At zero by its own decision: not "placement just brought the role here" (asked is 1).
    store.reports = [LoadReport(at=170, waiting=0, running=0, asleep=True)]
    assert policy(ctx(0, 170))[0] == 0
    store.reports = [LoadReport(at=171, waiting=2, running=0, asleep=True)]
    assert policy(ctx(0, 171))[0] == 1
    assert [n.direction for n in store.news] == ["sleep", "wake"]


def test_a_replica_serve_starts_for_a_sleeping_backend_is_announced_as_a_wake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = asleep_policy(store)
    # A call reached the deployment's handle: Serve brought a replica without the policy.
    store.reports = [LoadReport(at=200, waiting=0, running=0, asleep=True)]
    assert policy(ctx(1, 200))[0] == 1
    assert [n.direction for n in store.news] == ["sleep", "wake"]
    assert "Serve's cold start" in store.news[-1].reason
    assert policy(ctx(1, 201))[0] == 1  # told once
    assert len(store.news) == 2


def test_a_restarted_controller_knows_the_zero_is_load_s_sleep_not_placement_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    store.news = [ScalingNews(4, 0, "sleep", "sleep: idle for 60s")]
    policy = ReplicaPolicy(**policy_kwargs(config_with(SLEEPY).model_for(Role.CODING)))
    store.reports = [LoadReport(at=10, waiting=0, running=0)]
    assert policy(ctx(0, 10))[0] == 0  # no placement asked, no request: still asleep
    store.reports = [LoadReport(at=11, waiting=1, running=0)]
    assert policy(ctx(0, 11))[0] == 1


def test_a_restarted_controller_numbers_its_decisions_on_from_the_last_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Serve makes a new policy when its controller restarts; a router that counted the
    decision before must count the new one (its number differs), not take it for old news."""
    store = Store(monkeypatch)
    store.asked = 1
    first = ReplicaPolicy(**policy_kwargs(config_with(SCALING).model_for(Role.CODING)))
    store.reports = [LoadReport(at=100, waiting=9, running=2)]
    assert first(ctx(1, 100))[0] == 3
    restarted = ReplicaPolicy(**policy_kwargs(config_with(SCALING).model_for(Role.CODING)))
    store.reports = [LoadReport(at=130, waiting=0, running=0)]
    assert restarted(ctx(3, 130))[0] == 3  # the down delay starts
    store.reports = [LoadReport(at=160, waiting=0, running=0)]
    assert restarted(ctx(3, 160))[0] == 2
    assert [(n.seq, n.direction) for n in store.news] == [(1, "up"), (2, "down")]


def test_placement_moving_a_sleeping_role_away_parks_it_and_back_starts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = asleep_policy(store)
    store.asked = 0
    assert policy(ctx(0, 170))[0] == 0
    store.asked = 2  # placement's count when it brings the role back
    assert policy(ctx(0, 180))[0] == 2


def test_a_scale_to_zero_backend_lets_serve_go_to_zero() -> None:
    config = config_with(SLEEPY)
    options = llm_config_for(config, Backend(model="coding", pool="local")).deployment_config
    assert options["autoscaling_config"]["min_replicas"] == 0
    assert options["autoscaling_config"]["initial_replicas"] == 1
    load = options["autoscaling_config"]["policy"]["policy_kwargs"]["load"]
    assert (load["min_replicas"], load["scale_to_zero_after_s"]) == (1, 60)
    target = config.targets["coding@local"]
    assert (target.sleeps, target.wait_when_asleep, target.wake_timeout_s) == (True, True, 300)


class News:
    """The policy's last decision per deployment, as the routers read it."""

    def __init__(self) -> None:
        self.last: dict[str, ScalingNews] = {}

    def say(self, deployment: str, direction: str, replicas: int) -> None:
        seq = len(self.last) + 100 + (self.last[deployment].seq if deployment in self.last else 0)
        self.last[deployment] = ScalingNews(seq, replicas, direction, f"{direction}: test")

    def read(self, deployment: str) -> ScalingNews | None:
        return self.last.get(deployment)


def sleepy_router(
    scaling: dict[str, Any], deployments: FakeDeployments, coding: FakeBackend, news: News
) -> Router:
    backends = {"coding@local": coding, "orchestrator@local": FakeBackend(ok)}
    backends[FALLBACK_BACKEND] = FakeBackend(ok)
    config = config_with(scaling, cap=2)
    return make_router(config, backends, deployments=deployments, scaled=news.read)


def put_to_sleep(
    router: Router, deployments: FakeDeployments, coding: FakeBackend, news: News
) -> str:
    deployment = router.config.targets["coding@local"].deployment_name
    asyncio.run(router.follow_replicas())  # the first look
    news.say(deployment, "sleep", 1)  # announced: the replica is still up
    asyncio.run(router.follow_replicas())
    assert router.load()[deployment].asleep  # what the policy waits for to take it away
    deployments.set(coding, running=0)
    asyncio.run(router.follow_replicas())
    return deployment


def wake(router: Router, deployments: FakeDeployments, coding: FakeBackend, news: News) -> Any:
    """The policy's wake, and the replica it asked for running (awaitable: in the test's loop)."""
    news.say(router.config.targets["coding@local"].deployment_name, "wake", 1)
    deployments.set(coding, running=1)
    return router.follow_replicas()


def test_a_request_for_a_sleeping_backend_waits_for_it_to_wake() -> None:
    deployments, coding, news = FakeDeployments(), FakeBackend(ok), News()
    router = sleepy_router(SLEEPY, deployments, coding, news)
    deployment = put_to_sleep(router, deployments, coding, news)
    before = sample("gps_breaker_transitions_total", backend="coding@local", state="open")
    asyncio.run(router.check_health_once())  # no replica: asleep, not a fault

    async def wake_while_waiting() -> list[Any]:
        waiting = asyncio.ensure_future(collect(router, job()))
        await asyncio.sleep(0.05)
        assert router.load()[deployment].waiting == 1  # posted: the policy wakes it
        assert not waiting.done()
        status = await router.status()
        assert status["backends"]["coding@local"]["state"] == "asleep"
        assert status["status"] == "ok"
        deployments.set(coding, running=1)
        await router.follow_replicas()  # a replica, but the last news is still the sleep
        assert not waiting.done()
        await wake(router, deployments, coding, news)
        return await waiting

    items = asyncio.run(wake_while_waiting())
    assert isinstance(items[0], Routed)
    assert items[0].backend == "coding@local"
    assert coding.calls == 1
    after = sample("gps_breaker_transitions_total", backend="coding@local", state="open")
    assert after == before


def test_a_sleep_announced_stops_all_sending_until_the_policy_calls_it_off() -> None:
    deployments, coding, news = FakeDeployments(), FakeBackend(ok), News()
    router = sleepy_router(SLEEPY, deployments, coding, news)
    deployment = router.config.targets["coding@local"].deployment_name
    deployments.set(coding, running=1)
    asyncio.run(router.follow_replicas())  # the first look
    news.say(deployment, "sleep", 1)

    async def called_off() -> list[Any]:
        await router.follow_replicas()
        waiting = asyncio.ensure_future(collect(router, job()))
        await asyncio.sleep(0.05)
        # Nothing reaches the replica Serve is about to stop: a call waiting in Serve's
        # handle for a replica would make Serve start one, undoing the sleep.
        assert (coding.calls, router.load()[deployment].waiting) == (0, 1)
        await wake(router, deployments, coding, news)  # the request called the sleep off
        return await waiting

    routed = asyncio.run(called_off())[0]
    assert isinstance(routed, Routed)
    assert routed.backend == "coding@local"
    assert coding.calls == 1
    assert not router.load()[deployment].asleep


def test_a_backend_that_does_not_wake_in_time_answers_503() -> None:
    deployments, coding, news = FakeDeployments(), FakeBackend(ok), News()
    scaling = {**SLEEPY, "wake_timeout_s": 0.05}
    router = sleepy_router(scaling, deployments, coding, news)
    put_to_sleep(router, deployments, coding, news)
    [refusal] = asyncio.run(collect(router, job()))
    assert isinstance(refusal, Refusal)
    assert refusal.status == 503
    assert "did not wake within" in refusal.message


def test_with_next_link_a_request_goes_on_down_the_chain_and_still_wakes_it() -> None:
    deployments, coding, news = FakeDeployments(), FakeBackend(ok), News()
    router = sleepy_router({**SLEEPY, "when_asleep": "next_link"}, deployments, coding, news)
    deployment = put_to_sleep(router, deployments, coding, news)

    async def asleep_then_awake() -> tuple[list[Any], list[int], list[Any]]:  # one loop
        first = await collect(router, job())
        # Posted until it wakes (one lost post must not leave it asleep); each request once.
        waiting = [router.load()[deployment].waiting, router.load()[deployment].waiting]
        await collect(router, job())
        waiting.append(router.load()[deployment].waiting)
        await wake(router, deployments, coding, news)
        waiting.append(router.load()[deployment].waiting)
        return first, waiting, await collect(router, job())

    first, waiting, after = asyncio.run(asleep_then_awake())
    assert isinstance(first[0], Routed)
    assert first[0].backend == FALLBACK_BACKEND
    assert waiting == [1, 1, 2, 0]
    assert isinstance(after[0], Routed)
    assert after[0].backend == "coding@local"


def test_a_health_check_that_finds_the_replica_gone_before_the_news_opens_no_breaker() -> None:
    deployments, coding, news = FakeDeployments(), FakeBackend(ok), News()
    router = sleepy_router(SLEEPY, deployments, coding, news)
    deployment = router.config.targets["coding@local"].deployment_name
    news.say(deployment, "sleep", 0)
    deployments.set(coding, running=0)
    asyncio.run(router.check_health_once())
    status = asyncio.run(router.status())
    assert status["backends"]["coding@local"]["state"] == "asleep"
    assert status["backends"]["coding@local"]["breaker"] == "closed"


def test_placement_taking_over_a_sleeping_backend_says_so_to_the_routers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    policy = asleep_policy(store)
    store.asked = 0  # moved away while asleep: the sleep is over, the routers must hear it
    assert policy(ctx(0, 170))[0] == 0
    assert [n.direction for n in store.news] == ["sleep", "placed"]
    assert policy(ctx(0, 171))[0] == 0
    assert len(store.news) == 2  # once


def test_a_failure_of_a_request_sent_just_before_the_sleep_opens_no_breaker() -> None:
    config = config_with(SLEEPY)
    backends = {"coding@local": FakeBackend(ok), "orchestrator@local": FakeBackend(ok)}
    links = build_links(config, backends, {}, FakeClock().monotonic)
    coding = links["coding@local"]
    coding.sleep()
    for _ in range(5):
        coding.record_verdict(False)
    assert coding.breaker.state.value == "closed"


def test_waking_keys_apply_only_with_scale_to_zero() -> None:
    with pytest.raises(ConfigError, match="when_asleep apply to a backend asleep at zero"):
        config_with({**SCALING, "when_asleep": "next_link"})
    with pytest.raises(ConfigError, match="greater than or equal to 10"):
        config_with({**SCALING, "scale_to_zero_after_s": 5})


def test_a_reading_caught_in_flight_before_a_sleep_does_not_count_as_a_cold_start() -> None:
    """Serve wakes a deployment at zero by itself when its handles' samples over the look-back
    window aggregate above zero. A router's KV reading, sampled once while in flight before
    the backend went to sleep, must not: the window's least sample is what counts."""
    from ray.serve._private.common import TimeStampedValue
    from ray.serve._private.metrics_utils import aggregate_timeseries
    from ray.serve.config import AggregationFunction, AutoscalingConfig

    config = config_with(SCALING, replicas=1, cap=4)
    options = llm_config_for(config, Backend(model="coding", pool="local")).deployment_config
    scaling = dict(options["autoscaling_config"])
    scaling["policy"] = {"policy_function": "autoscale.serve_scaling:ReplicaPolicy"}
    serve_config = AutoscalingConfig(**scaling)
    # The handle's samples (every 6 s over 30 s): one caught a reading between send and reply.
    samples = [TimeStampedValue(t, 1.0 if t == 12.0 else 0.0) for t in (0.0, 6.0, 12.0, 18.0)]
    counted = aggregate_timeseries(samples, serve_config.aggregation_function, last_window_s=6)
    assert counted == 0
    # Serve's default would have counted it, and woken the backend for nothing.
    assert aggregate_timeseries(samples, AggregationFunction.MEAN, last_window_s=6) > 0
    # A request that waited the whole window still counts.
    waited = [TimeStampedValue(t, 1.0) for t in (0.0, 6.0, 12.0, 18.0)]
    assert aggregate_timeseries(waited, serve_config.aggregation_function, last_window_s=6) == 1
