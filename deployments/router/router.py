"""The Router: one job's walk down its chain (flow.py) and the loops that keep its view fresh,
over the ports it is given; `ServeRouter` over Serve's own, and `RouterDeployment`, the Serve
deployment the composition root binds (the package's docstring says how it all fits)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from typing import Any

from ray.serve.handle import DeploymentHandle

from core.config import ClusterConfig
from core.wire import ChatJob, Opening, PlacementView, Refusal, Reply
from deployments.light_process import release_freed_memory
from deployments.live_config import Homes, serve_live_config
from deployments.router import metrics
from deployments.router.adapters.ports import BackendLoad, RouterPorts
from deployments.router.adapters.serve_ports import serve_ports
from deployments.router.loops.load_sync import LoadSync
from deployments.router.loops.placement_sync import PlacementSync, home_placement
from deployments.router.loops.pool_sync import PoolSync
from deployments.router.loops.slot_sync import SlotSync
from deployments.router.loops.watch import Watch
from deployments.router.report import status_report, with_pools
from deployments.router.request_path.faults import stream_error_event
from deployments.router.request_path.flow import Flow
from deployments.router.request_path.link import RouterSettings, build_links
from deployments.router.request_path.whole_by_stream import AskAgain, whole_through_stream
from policy.breaker import BreakerState
from policy.context.counters import counters_for
from policy.preemption import may_be_paused, rules_of
from policy.whole_answer import streams_as_whole

logger = logging.getLogger("ray.serve")

# Gauges set from state (queues, breakers) for Ray's metrics pipeline, which exports each
# worker's every few seconds (docs/operations.md, monitoring).
GAUGES_INTERVAL_S = 2.0

__all__ = ["Router", "RouterDeployment", "ServeRouter"]


class Router:
    def __init__(self, config: ClusterConfig, ports: RouterPorts, watch: bool = True) -> None:
        """`watch=False` leaves out the background loops (health, KV, placement sync)."""
        self._config = config
        self._ports = ports
        self._watch = watch
        clock = ports.clock
        self._links = build_links(config, ports.backends, home_placement(config), clock.monotonic)
        self._counters = dict(ports.counters)  # grows with the backends a reload adds
        source = ports.placement if watch else None
        self._placement = PlacementSync(config, self._links, source, clock)
        self._pools = PoolSync(self._links, ports.pools if watch else None, clock)
        self._health = Watch(config.router, self._links, ports.deployments, clock, ports.scaled)
        self._load = LoadSync(
            self._links, ports.load if watch else None, ports.deployments, ports.scaled, clock
        )
        self._flow = Flow(config, self._links, self._placement, self._counters, clock)
        self._slots = SlotSync(self._links, ports.slots, clock)
        self._loops: list[asyncio.Task[None]] = []

    async def chat(self, job: ChatJob) -> AsyncGenerator[Reply | list[Any], None]:
        """The `Reply` (an `Opening` or a `Refusal`), then a stream's other batches of SSE
        lines; once an answer has begun, a refusal is an SSE error event."""
        async with contextlib.aclosing(self._replies(job)) as items:
            reply = await anext(items)
            if isinstance(reply, Opening):
                reply = Opening(reply.routed, _continued(reply.first))
            yield reply
            async for item in items:
                yield _continued(item)

    async def _replies(self, job: ChatJob) -> AsyncGenerator[Reply | Any, None]:
        """`chat`'s items, a refusal after the answer began as it came."""
        self._start_loops()
        await self._placement.first_sync()
        async with contextlib.aclosing(self._flow.walk(job)) as items:
            head = await anext(items)
            if isinstance(head, Refusal):
                yield head
                return
            yield Opening(head, await anext(items, None))
            async for item in items:
                yield item

    async def chat_once(self, job: ChatJob) -> Reply:
        """`chat` for a whole (non-streaming) answer, in one call. One a higher class may
        pause is generated as a stream, to go on where it stopped (whole_by_stream.py); if its
        backend fails in its middle where it cannot go on, it is asked for again whole."""
        rules = rules_of(self._config.router.preempt)
        earlier_s = 0.0  # the engines' time on a streamed try that could not go on
        if rules and may_be_paused(job.priority, rules) and streams_as_whole(job.request):
            whole = await whole_through_stream(self._replies, job, self._ports.clock.monotonic)
            if not isinstance(whole, AskAgain):
                return whole
            earlier_s = whole.engine_wait_s
        async with contextlib.aclosing(self.chat(job)) as items:
            reply = await anext(items)
        assert isinstance(reply, Opening | Refusal)
        if not earlier_s:
            return reply
        if isinstance(reply, Refusal):
            return replace(reply, engine_wait_s=reply.engine_wait_s + earlier_s)
        waited = reply.routed.engine_wait_s + earlier_s
        return Opening(replace(reply.routed, engine_wait_s=waited), reply.first)

    async def count_tokens(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> int | None:
        """The prompt's tokens with `model`'s own tokenizer and template (Flow.count)."""
        return await self._flow.count(model, messages, tools)

    async def status(self) -> dict[str, Any]:
        """Per-backend state from Serve's own status, with breaker, queue and KV pressure."""
        self._start_loops()
        deployments = await self._ports.deployments.read()
        placement = self._placement
        now = self._ports.clock.monotonic()
        report = status_report(
            self._config, self._links, deployments, placement.placements, placement.moves, now
        )
        return with_pools(report, self._pools.pools, self._pools.events)

    async def metrics_text(self) -> bytes:
        self.refresh_gauges()
        return metrics.render()

    def refresh_gauges(self) -> None:
        """Queue depths and breaker states as they are now: read at each scrape of /metrics,
        and every few seconds for Ray's metrics pipeline (`gauges_loop`)."""
        for name, link in self._links.items():
            for priority, depth in link.gate.queue.depth_by_class().items():
                metrics.QUEUE_DEPTH.labels(name, priority.value).set(depth)
            status = link.status()
            for state in BreakerState:
                if status.parked:  # at zero replicas on purpose: its breaker is not news
                    metrics.BREAKER_STATE.forget(name, state.value)
                else:
                    on = 1 if state is status.breaker else 0
                    metrics.BREAKER_STATE.labels(name, state.value).set(on)
            if not status.reads_kv:  # a last reading of a backend gone is not its usage now
                metrics.KV_CACHE_USAGE.forget(name)

    async def gauges_loop(self) -> None:
        while True:
            try:
                self.refresh_gauges()
            except Exception:  # the loop must outlive any one bad reading
                metrics.LOOP_ERRORS.labels("gauges").inc()
                logger.exception("router gauge refresh failed")
            await self._ports.clock.sleep(GAUGES_INTERVAL_S)

    @property
    def config(self) -> ClusterConfig:
        return self._config

    def apply_config(self, config: ClusterConfig, homes: Homes | None = None) -> None:
        """A reload (core/config/reload.py says what may differ): the backends of the models
        it added or changed join, from the Serve apps `homes` names; those of the models it
        removed (or of a changed model's engine before) leave, their jobs under way finishing
        there; caps, queue, breaker and timeout settings and chains change in place, and the
        links kept keep their waiters and state."""
        self._use_backends(config, homes or {})
        settings = RouterSettings.of(config)
        targets = config.targets
        for name, link in self._links.items():
            link.retune(targets[name], settings)
        self._load.use_links(self._links)
        self._flow.use_config(config)
        self._placement.use_config(config)
        self._health.use_settings(config.router)
        self._config = config

    def _use_backends(self, config: ClusterConfig, homes: Homes) -> None:
        """Links for `config`'s backends: a new one where a backend is new or runs in another
        Serve app now (a changed model's new engine), none for a backend gone."""
        targets = config.targets
        for name in [name for name in self._links if name not in targets]:
            del self._links[name]  # jobs under way hold the link itself, and end there
            metrics.forget_backend(name)
            logger.info("reload: backend %s removed", name)
        joining = {}
        for name, home in homes.items():
            link = self._links.get(name)
            if name in targets and (link is None or link.backend.deployment != home):
                if self._ports.connect is None:
                    raise RuntimeError(f"backend {name} runs in {home[0]}: no way to reach it")
                joining[name] = self._ports.connect(home, frozenset(targets[name].adapters))
        fresh = build_links(config, joining, home_placement(config), self._ports.clock.monotonic)
        for name, link in fresh.items():
            metrics.forget_backend(name)  # a replaced engine's series start again
            self._links[name] = link
            logger.info("reload: backend %s serves from %s", name, link.backend.deployment[0])
        counted = self._counters
        counted.update(
            counters_for(
                t for t in (k.target for k in fresh.values()) if t.counter_key not in counted
            )
        )

    def load(self) -> dict[str, BackendLoad]:
        """What this replica holds of each autoscaled backend (posted once a second)."""
        return self._load.load()

    async def check_health_once(self) -> None:
        """Mark links without a running replica; probe troubled ones and close them if healthy."""
        await self._health.check_health_once()

    def check_replicas_once(self) -> None:
        """Read each link's replicas from Serve's handle: jobs waiting on a link left without
        one stop waiting."""
        self._health.check_replicas_once()

    async def follow_replicas(self) -> None:
        """The policy's last decisions (asleep or not), then autoscaled links' slots to their
        running replicas (the load loop reads the first every second, the second every few)."""
        await self._load.follow_news()
        await self._load.follow_replicas()

    async def post_slots_once(self) -> None:
        """Post this router's slots to the app's slot broker and run under its leases."""
        await self._slots.post_once()

    def held(self) -> dict[str, int]:
        """Jobs this replica holds per backend: being fitted, queued for a slot or in flight."""
        return self._placement.held()

    def apply_placement(self, view: PlacementView) -> None:
        """Send each model's new work where `view` places it; parked backends take none."""
        self._placement.apply(view)

    def apply_pool_report(self, report: Mapping[str, Any]) -> None:
        """Take the cluster manager's report: links on unhealthy pools take no new work."""
        self._pools.apply(report)

    def _start_loops(self) -> None:
        if self._watch and not self._loops:
            loops = [
                self._health.health_loop(),
                self._health.replicas_loop(),
                self._health.kv_loop(),
                self._health.counters_loop(),
                self.gauges_loop(),
            ]
            if self._placement.follows:
                loops.append(self._placement.loop())
            if self._pools.follows:
                loops.append(self._pools.loop())
            if self._load.follows:
                loops.append(self._load.loop())
            if self._slots.follows:
                loops.append(self._slots.loop())
            # A fresh context each: a task copies the current one, and Serve ties handle calls
            # made in it to the request that started the loops, cancelling them with it.
            self._loops = [asyncio.create_task(c, context=contextvars.Context()) for c in loops]


def _continued(item: Any) -> Any:
    """An item of an answer that has begun: a refusal there is an SSE error event."""
    if isinstance(item, Refusal):
        return stream_error_event(f"The answer could not be continued: {item.message}")
    return item


class ServeRouter(Router):
    """The Router as Serve runs it (cluster/app.py): its ports are Serve's, built in the replica."""

    def __init__(self, config: ClusterConfig, backends: Mapping[str, DeploymentHandle]) -> None:
        super().__init__(config, serve_ports(config, backends))
        release_freed_memory()  # what loading the tokenizers left free


class RouterDeployment(ServeRouter):
    """The router as a deployment of its own (`gateway.router_in_ingress: false`): it follows
    `make reload` itself (in an ingress replica, the ingress applies reloads to it)."""

    def __init__(
        self, config: ClusterConfig, backends: Mapping[str, DeploymentHandle], build: str = ""
    ) -> None:
        super().__init__(config, backends)
        self._live = serve_live_config(build, self.apply_config)
